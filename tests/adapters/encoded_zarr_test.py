"""Encoded (Luxar) zarr arrays, written by luxar's own encoder, read by ``tensor_server.open``
and compared with luxar's own decoder.

Exactness: our kernels compute each element in float64 with the reference decoder's
operations in its order, then round once to ``original_dtype``. Bit-identical
(``assert_array_equal``): direct, broadcast, LUT, bounded, rgb and linear per-channel.
Within 1 float32 ULP: the exp/expm1 families (log/geolog scalar, log/signed-log/geolog
per-channel), whose transcendental comes from libm here and from NumPy's own implementation
in luxar's decoder (on this machine they happen to agree on every element tested, but that
is not promised). The one place the reference decoder cannot be the oracle is a degenerate
``bounded_scalar`` (min == max), which luxar's encoder writes and its decoder refuses: we
serve it as the constant ``min`` (checked against the encoder's input).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters._encoded import KNOWN_ENCODINGS
from tensor_server.adapters.encoded_zarr import EncodedArrayError
from tensor_server.core.bounds import Bounds
from tensor_server.testing import AdapterTests
from tensor_server.testing.adapter_tests import random_bounds

RNG = np.random.default_rng(15)
N = 3000


def _cases(lx):
    """(field, data, encode kwargs, expected encoding name): every mode x semantic type, and
    CUSTOM / direct writer calls for the names no mode selects."""
    S, M = lx.SemanticType, lx.EncodingMode
    rng = np.random.default_rng(7)
    pos = (rng.standard_normal((N, 3)) * [10, 3, 0.5]).astype(np.float32)
    sdr = rng.random((N, 3)).astype(np.float32)
    hdr = np.where(rng.random((N, 3)) < 0.1, 0, np.exp(rng.uniform(-4, 6, (N, 3)))).astype(np.float32)
    # luxar picks u8 / u16 / geolog by the dynamic range max / min(nonzero)
    bounded = (0.2 + 0.8 * rng.random(N)).astype(np.float32)
    narrow = (1 + rng.random(N) * 100).astype(np.float32)  # range <= 256 -> u8
    mid = (1 + rng.random(N) * 5000).astype(np.float32)  # range <= 65536 -> u16
    wide = np.exp(rng.uniform(-8, 8, N)).astype(np.float32)  # too wide for linear -> geolog
    diag = np.exp(rng.uniform(-3, 1, (N, 3))).astype(np.float32)
    off = (rng.standard_normal((N, 3)) * 0.2).astype(np.float32)
    off[::7] = 0
    chol = rng.standard_normal((N, 6)).astype(np.float32)
    index = rng.integers(0, 60000, N).astype(np.int64)
    big_index = rng.integers(0, 2**40, N).astype(np.int64)
    mid_index = rng.integers(0, 2**20, N).astype(np.int64)
    few = rng.choice(np.array([0.5, 1.25, 2.0, 7.5], np.float32), (N, 2))
    # row LUT u16 (257+ rows) pays only when the LUT JSON is small against the rows saved
    palette = np.round(rng.random((300, 3)), 2).astype(np.float32)
    many_rows = palette[rng.integers(0, 300, 200_000)]
    c = {}

    def add(field, data, kw, name):
        c[field] = (data, kw, name)

    for mode in (M.AUTO, M.PRECISION, M.MEMORY):
        m = mode.value
        add(
            f"coordinate_{m}",
            pos,
            dict(semantic_type=S.COORDINATE, mode=mode, chunks=(512, 3)),
            "float32" if mode == M.PRECISION else "linear_perchannel_u16",
        )
        add(
            f"color_sdr_{m}",
            sdr,
            dict(semantic_type=S.COLOR, mode=mode, color_mode="sdr", chunks=(512, 3)),
            "float32" if mode == M.PRECISION else "rgb_uint8",
        )
        add(
            f"color_hdr_{m}",
            hdr,
            dict(semantic_type=S.COLOR, mode=mode, color_mode="hdr", chunks=(512, 3)),
            {M.AUTO: "geolog_perchannel_u16", M.PRECISION: "float32", M.MEMORY: "geolog_perchannel_u8"}[mode],
        )
        add(
            f"bounded_{m}",
            bounded,
            dict(semantic_type=S.BOUNDED_SCALAR, mode=mode, bounds=(0.0, 1.0), chunks=(700,)),
            "float32" if mode == M.PRECISION else "bounded_scalar_uint8",
        )
        add(
            f"positive_narrow_{m}",
            narrow,
            dict(semantic_type=S.POSITIVE_SCALAR, mode=mode, chunks=(700,)),
            "float32" if mode == M.PRECISION else "bounded_scalar_uint8",
        )
        add(
            f"positive_mid_{m}",
            mid,
            dict(semantic_type=S.POSITIVE_SCALAR, mode=mode, chunks=(700,)),
            "float32" if mode == M.PRECISION else "bounded_scalar_uint16",
        )
        add(
            f"positive_wide_{m}",
            wide,
            dict(semantic_type=S.POSITIVE_SCALAR, mode=mode, chunks=(700,)),
            {M.AUTO: "geolog_scalar_uint16", M.PRECISION: "float32", M.MEMORY: "geolog_scalar_uint8"}[mode],
        )
        add(f"cholesky_{m}", chol, dict(semantic_type=S.CHOLESKY, mode=mode, chunks=(512, 6)), "float32")
        add(
            f"cholesky_diag_{m}",
            diag,
            dict(semantic_type=S.CHOLESKY_DIAG, mode=mode, chunks=(512, 3)),
            "float32" if mode == M.PRECISION else "log_perchannel_u8",
        )
        add(
            f"cholesky_offdiag_{m}",
            off,
            dict(semantic_type=S.CHOLESKY_OFFDIAG, mode=mode, chunks=(512, 3)),
            "float32" if mode == M.PRECISION else "signed_log_perchannel_u8",
        )
        add(f"index_{m}", index, dict(semantic_type=S.INDEX, mode=mode, chunks=(700,)), "uint16")
        add(
            f"lut_scalar_{m}",
            few,
            dict(semantic_type=S.POSITIVE_SCALAR, mode=mode, chunks=(512, 2)),
            "float32" if mode == M.PRECISION else "lut_uint8",
        )
    add(
        "cholesky_diag_u16",
        diag,
        dict(semantic_type=S.CHOLESKY_DIAG, mode=M.AUTO, chunks=(512, 3), _perchannel_bits=16),
        "log_perchannel_u16",
    )
    add(
        "cholesky_offdiag_u16",
        off,
        dict(semantic_type=S.CHOLESKY_OFFDIAG, mode=M.AUTO, chunks=(512, 3), _perchannel_bits=16),
        "signed_log_perchannel_u16",
    )
    add("index_u8", index % 200, dict(semantic_type=S.INDEX, mode=M.AUTO), "uint8")
    add("index_u32", mid_index, dict(semantic_type=S.INDEX, mode=M.AUTO), "uint32")
    add("index_u64", big_index, dict(semantic_type=S.INDEX, mode=M.AUTO), "uint64")
    add(
        "lut_row_u8",
        sdr[rng.integers(0, 40, N)],
        dict(semantic_type=S.COLOR, mode=M.AUTO, color_mode="sdr", chunks=(512, 3)),
        "lut_uint8",
    )
    add(
        "lut_row_u16",
        many_rows,
        dict(semantic_type=S.COLOR, mode=M.AUTO, color_mode="sdr", chunks=(4096, 3)),
        "lut_uint16",
    )
    add("broadcast_scalar", 0.75, dict(semantic_type=S.POSITIVE_SCALAR, n_elements=N), "broadcasted")
    add("broadcast_color", (1.0, 0.5, 0.25), dict(semantic_type=S.COLOR, n_elements=N, color_mode="sdr"), "broadcasted")
    add(
        "broadcast_uniform",
        np.full((N, 4), 3.5, np.float32),
        dict(semantic_type=S.CHOLESKY, mode=M.AUTO),
        "broadcasted",
    )
    for name, data, extra in (
        ("bounded_scalar_uint16", bounded, dict(bounds=(0.0, 1.0))),
        ("log_scalar_uint8", wide, {}),
        ("log_scalar_uint16", wide, {}),
        ("rgb_uint16", sdr, {}),
        ("float16", narrow, {}),
        ("uint32", index, {}),
    ):
        add(
            f"custom_{name}",
            data,
            dict(
                semantic_type=S.POSITIVE_SCALAR,
                mode=M.CUSTOM,
                custom_encoder=name,
                chunks=(512, 3) if data.ndim == 2 else (700,),
                **extra,
            ),
            name,
        )
    add(
        "positive_log_u8",
        wide,
        dict(semantic_type=S.POSITIVE_SCALAR, mode=M.AUTO, positive_scalar_bits=8),
        "geolog_scalar_uint8",
    )
    return c


@pytest.fixture(scope="module")
def luxar_store(tmp_path_factory, luxar):
    """One store with every case, plus arrays written by the per-channel writer at u8
    (``linear_perchannel_u8``: no mode picks it), a legacy log array without ``zero_level``,
    a direct ``none`` array and ``array_ref`` duplicates."""
    root_path = tmp_path_factory.mktemp("lux") / "scene.zarr"
    root = luxar.open_group(str(root_path), mode="w")
    enc = luxar.ArrayEncoder()
    cases = _cases(luxar)
    inputs = {}
    for field, (data, kw, _) in cases.items():
        enc.encode(data=data, zarr_group=root, name=field, deduplicate=False, **kw)
        inputs[field] = data
    pos = cases["coordinate_auto"][0]
    enc._encode_linear_perchannel(root, "linear_u8", pos, 8, (512, 3), None)
    enc._encode_linear_perchannel(root, "linear_u16_direct", pos, 16, (512, 3), None)
    cases["linear_u8"] = (pos, {}, "linear_perchannel_u8")
    cases["linear_u16_direct"] = (pos, {}, "linear_perchannel_u16")
    # legacy (pre zero-level) per-channel log: every code on the grid, written by hand
    codes = RNG.integers(0, 256, (N, 3), dtype=np.uint8)
    legacy = root.create_array("legacy_log", shape=codes.shape, dtype=codes.dtype, chunks=(512, 3))
    legacy[...] = codes
    legacy.attrs["encoding"] = {
        "name": "log_perchannel_u8",
        "col_lo": [0.0, 0.1, 0.2],
        "col_hi": [1.0, 2.0, 3.0],
        "bits": 8,
        "original_dtype": "float32",
    }
    cases["legacy_log"] = (None, {}, "log_perchannel_u8")
    raw = RNG.integers(-5, 5, (N, 2)).astype(np.int16)
    enc._write_passthrough(root, "passthrough", raw, (512, 2), None)
    cases["passthrough"] = (raw, {}, "none")
    # dedup: the second write of the same content becomes an array_ref to the first
    sub = root.create_group("copies")
    for field in ("lut_scalar_auto", "coordinate_auto", "index_auto"):
        data, kw, _ = cases[field]
        enc.encode(data=data, zarr_group=root, name=f"{field}_orig", **kw)
        enc.encode(data=data, zarr_group=sub, name=field, **kw)
        enc.encode(data=data, zarr_group=sub, name=f"{field}_again", **kw)
        cases[f"{field}_orig"] = (data, kw, cases[field][2])
        cases[f"copies/{field}"] = (data, kw, "array_ref")
        cases[f"copies/{field}_again"] = (data, kw, "array_ref")
    return root_path, cases


#: encodings decoded through exp/expm1: compared within 1 float32 ULP (module docstring)
_TRANSCENDENTAL = ("log_scalar", "geolog_scalar", "log_perchannel", "signed_log_perchannel", "geolog_perchannel")


def assert_decoded_equal(got: np.ndarray, want: np.ndarray, name: str, msg: str = "") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (msg, got.dtype, want.dtype, got.shape, want.shape)
    if name.startswith(_TRANSCENDENTAL):
        np.testing.assert_array_max_ulp(got, want, maxulp=1)
    else:
        np.testing.assert_array_equal(got, want, err_msg=msg)


def _luxar_decode(luxar, root_path: Path, field: str) -> np.ndarray:
    root = luxar.open_group(str(root_path), mode="r")
    return luxar.ArrayDecoder().decode(root[field], root)


@pytest.fixture(scope="module")
def scene(luxar_store):
    path, _ = luxar_store
    src = tensor_server.open(path)
    yield src
    src.close()


def test_every_case_wrote_its_encoding_and_every_name_is_covered(luxar_store, scene):
    path, cases = luxar_store
    wrong = {
        f: (name, scene.metadata["encodings"].get(f))
        for f, (_, _, name) in cases.items()
        if scene.metadata["encodings"].get(f) != name
    }
    assert not wrong, "\n".join(f"{k}: want {a}, wrote {b}" for k, (a, b) in wrong.items())
    for field, (_, _, name) in cases.items():
        assert scene.tensors[field].metadata["encoding"] == name
    assert "skipped" not in scene.metadata
    assert KNOWN_ENCODINGS == set(scene.metadata["encodings"].values()) | {"none"}


def test_decoded_values_equal_luxars_decoder(luxar, luxar_store, scene):
    path, cases = luxar_store
    for field, (_data, _, name) in cases.items():
        t = scene.tensors[field]
        want = _luxar_decode(luxar, path, field)
        if want.dtype == np.float16:  # served widened: exact
            want = want.astype(np.float32)
        ref_name = t.metadata.get("target_encoding", name)
        assert_decoded_equal(t.get_data(), want, ref_name, f"{field} ({name})")


def test_range_reads_equal_the_decoded_whole(luxar, luxar_store, scene):
    path, cases = luxar_store
    rng = np.random.default_rng(3)
    for field in cases:
        t = scene.tensors[field]
        want = _luxar_decode(luxar, path, field).astype(t.dtype)
        name = t.metadata.get("target_encoding", t.metadata["encoding"])
        for _ in range(4):
            b = random_bounds(t.shape, rng, max_extent=900)
            assert_decoded_equal(t.get_data(b), want[b.to_slices()], name, f"{field} {b}")


def test_lossy_encodings_stay_close_to_the_encoder_input(luxar_store, scene):
    """Not a comparison with luxar's decoder: the decode is the right transform (a swapped
    lo/hi or an off-by-one level would still agree with itself)."""
    path, cases = luxar_store
    for field in (
        "coordinate_auto",
        "positive_mid_auto",
        "color_hdr_auto",
        "cholesky_diag_u16",
        "positive_wide_auto",
        "custom_log_scalar_uint16",
        "cholesky_offdiag_u16",
    ):
        data = cases[field][0]
        got = scene.tensors[field].get_data().astype(np.float64)
        rel = np.abs(got - data) / np.maximum(np.abs(data), 1e-3)
        assert np.median(rel) < 2e-3, (field, float(np.median(rel)))


def test_degenerate_bounded_scalar_decodes_to_its_bound(tmp_path, luxar):
    root = luxar.open_group(str(tmp_path / "d.zarr"), mode="w")
    # encode() would broadcast uniform data first; its CUSTOM writer is what writes min == max
    luxar.ArrayEncoder()._encode_custom(
        root, "k", np.full(50, 2.5, np.float32), "bounded_scalar_uint8", (2.5, 2.5), None, None
    )
    assert root["k"].attrs["encoding"]["name"] == "bounded_scalar_uint8"
    with pytest.raises(ValueError, match="max > min"):
        _luxar_decode(luxar, tmp_path / "d.zarr", "k")
    t = tensor_server.open(tmp_path / "d.zarr").tensors["k"]
    np.testing.assert_array_equal(t.get_data(), np.full(50, 2.5, np.float32))


# ---- range loading: only the codes under the bounds are read ---------------------------------
class _Spy:
    def __init__(self, arr):
        self.arr, self.reads = arr, []

    def __getitem__(self, sel):
        self.reads.append(sel)
        return self.arr[sel]

    def __getattr__(self, name):
        return getattr(self.arr, name)


@pytest.mark.parametrize("field", ["coordinate_auto", "positive_wide_auto", "lut_row_u16", "lut_scalar_auto"])
def test_read_region_reads_only_the_codes_under_bounds(scene, field):
    t = scene.tensors[field]
    inner = t.inner if hasattr(t, "inner") else t
    spy = _Spy(inner._codes)
    inner._codes = spy
    try:
        b = Bounds((1000,) + (1,) * (t.ndim - 1), (1300,) + tuple(t.shape[1:]))
        out = t.get_data(b)
    finally:
        inner._codes = spy.arr
    want_rows = slice(1000, 1300)
    assert len(spy.reads) == 1 and spy.reads[0][0] == want_rows
    if t.ndim == 2 and not inner.encoding.row_lut:
        assert spy.reads[0][1] == slice(1, t.shape[1])
    assert out.shape == b.shape


def test_nearest_decodes_only_the_picked_codes(scene):
    t = scene.tensors["coordinate_auto"]
    inner = t.inner if hasattr(t, "inner") else t
    spy = _Spy(inner._codes)
    inner._codes = spy
    try:
        got = t.get_scaled_data(Bounds((10, 0), (2000, 3)), (7, 2), "nearest")
    finally:
        inner._codes = spy.arr
    assert spy.reads == [(slice(10, 2000, 7), slice(0, 3, 2))]
    np.testing.assert_array_equal(got, t.get_data(Bounds((10, 0), (2000, 3)))[::7, ::2])


def test_capabilities_read_block_is_the_store_chunk(scene):
    assert scene.tensors["coordinate_auto"].read_block_shape == (512, 3)
    assert scene.tensors["lut_row_u16"].read_block_shape == (4096, 3)  # index chunk x row width
    assert scene.tensors["positive_wide_auto"].read_block_shape == (700,)
    assert scene.tensors["broadcast_color"].read_block_shape is None


# ---- broadcasted -----------------------------------------------------------------------------
def test_broadcast_is_served_without_materialising(tmp_path, luxar):
    root = luxar.open_group(str(tmp_path / "b.zarr"), mode="w")
    n = 10**10  # 120 GB if it were ever expanded
    luxar.ArrayEncoder().encode(
        data=(0.25, 0.5, 1.0),
        n_elements=n,
        zarr_group=root,
        name="rgb",
        semantic_type=luxar.SemanticType.COLOR,
        color_mode="sdr",
    )
    t = tensor_server.open(tmp_path / "b.zarr").tensors["rgb"]
    assert t.shape == (n, 3) and t.dtype == np.float32
    view = (t.inner if hasattr(t, "inner") else t).read_region(Bounds.full(t.shape))
    assert view.strides[0] == 0 and view.base is not None
    np.testing.assert_array_equal(t.get_data(Bounds((n - 5, 1), (n, 3))), np.tile([0.5, 1.0], (5, 1)))
    scaled = t.get_scaled_data(Bounds((0, 0), (4000, 3)), (1000, 1), "area")
    np.testing.assert_array_equal(scaled, np.tile([0.25, 0.5, 1.0], (4, 1)).astype(np.float32))


def test_all_fill_broadcast_row_has_no_chunk_and_reads_as_the_fill(tmp_path, luxar):
    """zarr writes no chunk for a row equal to the fill value (luxar's README): the row
    read then returns the fill, which is the value, and ``value`` agrees."""
    root = luxar.open_group(str(tmp_path / "z.zarr"), mode="w")
    luxar.ArrayEncoder().encode(
        data=np.zeros((500, 3), np.float32),
        zarr_group=root,
        name="offdiag",
        semantic_type=luxar.SemanticType.CHOLESKY_OFFDIAG,
    )
    assert root["offdiag"].attrs["encoding"]["name"] == "broadcasted"
    files = {p.name for p in (tmp_path / "z.zarr" / "offdiag").rglob("*") if p.is_file()}
    assert files and files <= {"zarr.json", ".zarray", ".zattrs"}, files  # metadata only, no chunk
    t = tensor_server.open(tmp_path / "z.zarr").tensors["offdiag"]
    np.testing.assert_array_equal(t.get_data(), np.zeros((500, 3), np.float32))


# ---- array_ref -------------------------------------------------------------------------------
def test_references_resolve_share_one_target_per_hash_and_verify_it(luxar_store, scene):
    _, cases = luxar_store
    for field in ("lut_scalar_auto", "coordinate_auto", "index_auto"):
        a, b = (scene.tensors[f"copies/{field}"], scene.tensors[f"copies/{field}_again"])
        a, b = (x.inner if hasattr(x, "inner") else x for x in (a, b))
        assert a.encoding.name == "array_ref" and a._source is b._source
        assert a.metadata["target"] == f"{field}_orig"
        exact = a._source.encoding.family in ("direct", "lut")
        assert a.metadata["hash_checked"] is exact, field
        np.testing.assert_array_equal(a.get_data(), scene.tensors[f"{field}_orig"].get_data())


def _write_codes(group, name, codes, encoding, chunks=None):
    arr = group.create_array(name, shape=codes.shape, dtype=codes.dtype, chunks=chunks or codes.shape)
    if codes.size:
        arr[...] = codes
    arr.attrs["encoding"] = encoding
    return arr


def test_reference_chain_and_hash_mismatch(tmp_path):
    import xxhash
    import zarr

    root = zarr.open_group(str(tmp_path / "r.zarr"), mode="w", zarr_format=2)
    vals = np.array([1.5, 2.5, 4.0], np.float32)
    idx = RNG.integers(0, 3, 100).astype(np.uint8)
    _write_codes(root, "base", idx, {"name": "lut_uint8", "lut": vals.tolist(), "original_dtype": "float32"})
    good = "xxh64:" + xxhash.xxh64(vals[idx].tobytes()).hexdigest()
    ref = {"name": "array_ref", "target": "base", "hash": good, "original_shape": [100], "original_dtype": "float32"}
    _write_codes(root, "ref1", np.zeros(0, np.float32), ref)
    _write_codes(root, "g/ref2", np.zeros(0, np.float32), {**ref, "target": "ref1"})
    _write_codes(root, "bad", np.zeros(0, np.float32), {**ref, "hash": "xxh64:0123456789abcdef"})
    src = tensor_server.open(tmp_path / "r.zarr")
    np.testing.assert_array_equal(src.tensors["g/ref2"].get_data(), vals[idx])
    assert src.tensors["g/ref2"].metadata["hash_checked"] is True  # through the chain to the LUT
    assert "bad" not in src.tensors
    (skip,) = src.metadata["skipped"]
    assert skip["path"] == "bad" and "encoding.hash" in skip["reason"] and "'bad'" in skip["reason"]


# ---- validation: every rule refuses, naming the array and the field ---------------------------
_U8 = np.arange(12, dtype=np.uint8).reshape(6, 2)
_BOUNDED = {"name": "bounded_scalar_uint8", "min": 0.0, "max": 2.0, "bits": 8, "original_dtype": "float32"}
_PC = {
    "name": "linear_perchannel_u8",
    "col_lo": [0.0, 1.0],
    "col_hi": [1.0, 3.0],
    "bits": 8,
    "original_dtype": "float32",
}
_LOGPC = {**_PC, "name": "log_perchannel_u8", "zero_level": True}
_LUT = {"name": "lut_uint8", "lut": [0.5, 1.5], "original_dtype": "float32"}
_REFUSALS = [
    ("unknown name", _U8, {**_BOUNDED, "name": "zigzag_u8"}, "name"),
    ("missing name", _U8, {k: v for k, v in _BOUNDED.items() if k != "name"}, "name"),
    ("not an object", _U8, ["bounded_scalar_uint8"], "name"),
    ("stray field", _U8, {**_BOUNDED, "scale": 2.0}, "scale"),
    ("stray target", _U8, {**_BOUNDED, "target": "x"}, "target"),
    ("stray zero_level on linear", _U8, {**_PC, "zero_level": True}, "zero_level"),
    ("unpaired bounds (no max)", _U8, {k: v for k, v in _BOUNDED.items() if k != "max"}, "max"),
    ("unpaired bounds (no min)", _U8, {k: v for k, v in _BOUNDED.items() if k != "min"}, "min"),
    (
        "unpaired log bounds",
        _U8,
        {"name": "geolog_scalar_uint8", "max_log": 1.0, "bits": 8, "original_dtype": "float32"},
        "min_log",
    ),
    ("non-finite min", _U8, {**_BOUNDED, "min": float("nan")}, "min"),
    ("non-finite max", _U8, {**_BOUNDED, "max": float("inf")}, "max"),
    ("max below min", _U8, {**_BOUNDED, "min": 3.0}, "max"),
    (
        "non-positive max_log",
        _U8,
        {"name": "log_scalar_uint8", "max_log": 0.0, "bits": 8, "original_dtype": "float32"},
        "max_log",
    ),
    (
        "geolog max_log below min_log",
        _U8,
        {"name": "geolog_scalar_uint8", "min_log": 2.0, "max_log": 1.0, "bits": 8, "original_dtype": "float32"},
        "max_log",
    ),
    ("bits disagree with the stored dtype", _U8, {**_BOUNDED, "bits": 16}, "bits"),
    ("quantized name on float codes", _U8.astype(np.float32), _BOUNDED, "name"),
    ("direct name is not the stored dtype", _U8, {"name": "uint16"}, "name"),
    ("bad original_dtype", _U8, {**_BOUNDED, "original_dtype": "float128x"}, "original_dtype"),
    ("col_lo too short", _U8, {**_PC, "col_lo": [0.0]}, "col_lo"),
    ("col_hi too long", _U8, {**_PC, "col_hi": [1.0, 2.0, 3.0]}, "col_hi"),
    ("non-finite col_lo", _U8, {**_PC, "col_lo": [0.0, float("nan")]}, "col_lo"),
    ("col_hi below col_lo", _U8, {**_PC, "col_hi": [1.0, 0.5]}, "col_hi"),
    (
        "geolog per-channel without zero level",
        _U8,
        {**_PC, "name": "geolog_perchannel_u8", "zero_level": False},
        "zero_level",
    ),
    ("zero_level not a boolean", _U8, {**_LOGPC, "zero_level": "yes"}, "zero_level"),
    ("lut_mode absent for 2-D", _U8, _LUT, "lut_mode"),
    ("lut_mode unknown", _U8, {**_LUT, "lut_mode": "column"}, "lut_mode"),
    ("row lut on 2-D indices", _U8, {**_LUT, "lut": [[0.5, 1.0]], "lut_mode": "row"}, "lut_mode"),
    ("lut not numbers", _U8[:, 0], {**_LUT, "lut": ["a", "b"]}, "lut"),
    ("lut non-finite", _U8[:, 0], {**_LUT, "lut": [1.0, float("inf")]}, "lut"),
    ("lut indices not unsigned integers", _U8.astype(np.float32)[:, 0], _LUT, "name"),
    ("broadcast n_elements", np.ones((1, 2), np.float32), {"name": "broadcasted", "n_elements": 0}, "n_elements"),
    ("broadcast of many rows", np.ones((2, 2), np.float32), {"name": "broadcasted", "n_elements": 9}, "n_elements"),
    (
        "broadcast value disagrees in length",
        np.ones((1, 2), np.float32),
        {"name": "broadcasted", "n_elements": 9, "value": [1.0]},
        "value",
    ),
    (
        "broadcast value is not the stored row",
        np.full((1, 2), 2.0, np.float32),
        {"name": "broadcasted", "n_elements": 9, "value": [2.0, 3.0]},
        "value",
    ),
    ("reference without target", np.zeros(0, np.float32), {"name": "array_ref"}, "target"),
    ("reference to a missing array", np.zeros(0, np.float32), {"name": "array_ref", "target": "nope"}, "target"),
    ("reference cycle", np.zeros(0, np.float32), {"name": "array_ref", "target": "bad"}, "target"),
    ("reference with a relative path", np.zeros(0, np.float32), {"name": "array_ref", "target": "../x"}, "target"),
    (
        "reference with a malformed hash",
        np.zeros(0, np.float32),
        {"name": "array_ref", "target": "good", "hash": "md5:abc"},
        "hash",
    ),
    (
        "reference to a wrong shape",
        np.zeros(0, np.float32),
        {"name": "array_ref", "target": "good", "original_shape": [7, 2]},
        "original_shape",
    ),
    ("reference that is not empty", np.zeros(3, np.float32), {"name": "array_ref", "target": "good"}, "original_shape"),
]


@pytest.mark.parametrize("codes,block,field", [r[1:] for r in _REFUSALS], ids=[r[0] for r in _REFUSALS])
def test_every_validation_rule_refuses_naming_array_and_field(tmp_path, codes, block, field):
    import zarr

    root = zarr.open_group(str(tmp_path / "v.zarr"), mode="w", zarr_format=2)
    _write_codes(root, "good", _U8, _PC)
    _write_codes(root, "bad", codes, block)
    src = tensor_server.open(tmp_path / "v.zarr")  # the source stays listed, with the reason
    assert list(src.tensors) == ["good"]
    (skip,) = src.metadata["skipped"]
    assert skip["path"] == "bad"
    assert "'bad'" in skip["reason"] and f"encoding.{field}:" in skip["reason"], skip["reason"]
    # a store that is only the bad array: unreadable, and the error says why
    alone = zarr.open_array(
        str(tmp_path / "alone.zarr"),
        mode="w",
        shape=codes.shape,
        dtype=codes.dtype,
        chunks=codes.shape or (1,),
        zarr_format=2,
    )
    alone.attrs["encoding"] = block
    with pytest.raises(tensor_server.errors.UnreadableSource, match=f"encoding\\.{field}:"):
        tensor_server.open(tmp_path / "alone.zarr")


def test_out_of_range_lut_index_is_a_clear_read_error(tmp_path):
    import zarr

    root = zarr.open_group(str(tmp_path / "o.zarr"), mode="w", zarr_format=2)
    _write_codes(root, "idx", np.array([0, 1, 1, 9, 0, 1], np.uint8), _LUT, chunks=(3,))
    t = tensor_server.open(tmp_path / "o.zarr").tensors["idx"]
    np.testing.assert_array_equal(t.get_data(Bounds((0,), (3,))), [0.5, 1.5, 1.5])
    with pytest.raises(EncodedArrayError, match=r"'idx'.*encoding\.lut: index 9 is out of range"):
        t.get_data()


def test_levels_and_index_width_come_from_the_stored_dtype_not_the_name(tmp_path):
    import zarr

    root = zarr.open_group(str(tmp_path / "l.zarr"), mode="w", zarr_format=2)
    u8 = np.array([0, 51, 255], np.uint8)
    u16 = np.array([0, 13107, 65535], np.uint16)
    _write_codes(
        root, "b", u8, {"name": "bounded_scalar_uint16", "min": 1.0, "max": 3.0, "bits": 8, "original_dtype": "float32"}
    )
    _write_codes(root, "c", u16, {"name": "rgb_uint8", "original_dtype": "float32"})
    _write_codes(
        root,
        "l",
        np.array([0, 300, 2], np.uint16),
        {"name": "lut_uint8", "lut": list(np.arange(301) / 4), "original_dtype": "float32"},
    )
    src = tensor_server.open(tmp_path / "l.zarr")
    np.testing.assert_array_equal(src.tensors["b"].get_data(), np.float32([1.0, 1.4, 3.0]))
    np.testing.assert_array_equal(src.tensors["c"].get_data(), np.float32([0.0, 0.2, 1.0]))
    np.testing.assert_array_equal(src.tensors["l"].get_data(), np.float32([0.0, 75.0, 0.5]))


# ---- the shared conformance suite ------------------------------------------------------------
class TestEncodedZarrConformance(AdapterTests):
    max_tensors = 8

    @pytest.fixture
    def source(self, tmp_path, luxar):
        S, M = luxar.SemanticType, luxar.EncodingMode
        root = luxar.open_group(str(tmp_path / "c.zarr"), mode="w")
        enc = luxar.ArrayEncoder()
        rng = np.random.default_rng(11)
        n = 1500
        enc.encode(
            data=(rng.standard_normal((n, 3)) * 5).astype(np.float32),
            zarr_group=root,
            name="pos",
            semantic_type=S.COORDINATE,
            chunks=(256, 3),
        )
        enc.encode(
            data=np.exp(rng.uniform(-3, 5, (n, 3))).astype(np.float32),
            zarr_group=root,
            name="hdr",
            semantic_type=S.COLOR,
            color_mode="hdr",
            mode=M.MEMORY,
            chunks=(200, 3),
        )
        enc.encode(
            data=rng.choice(np.array([0.5, 1.0, 4.0], np.float32), (n, 4)),
            zarr_group=root,
            name="lut",
            semantic_type=S.POSITIVE_SCALAR,
            chunks=(128, 4),
        )
        enc.encode(
            data=np.exp(rng.uniform(-6, 6, n)).astype(np.float32),
            zarr_group=root,
            name="radii",
            semantic_type=S.POSITIVE_SCALAR,
            chunks=(300,),
        )
        enc.encode(
            data=(rng.standard_normal((n, 3)) * 0.1).astype(np.float32),
            zarr_group=root,
            name="off",
            semantic_type=S.CHOLESKY_OFFDIAG,
            chunks=(256, 3),
        )
        enc.encode(data=0.5, n_elements=n, zarr_group=root, name="const", semantic_type=S.POSITIVE_SCALAR)
        src = tensor_server.open(tmp_path / "c.zarr")
        self._root = root
        self._decoder = luxar.ArrayDecoder()
        yield src
        src.close()

    def reference_array(self, source, field):
        return self._decoder.decode(self._root[field], self._root)

    def assert_same(self, got, want):
        """hdr, radii and off decode through exp/expm1: within 1 float32 ULP (module doc)."""
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_max_ulp(got, want, maxulp=1)


def test_metadata_json_names_encodings(scene):
    doc = json.loads(scene.metadata_json())
    assert doc["metadata"]["encodings"]["coordinate_auto"] == "linear_perchannel_u16"
