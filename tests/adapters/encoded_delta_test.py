"""Luxar's ``luxar_delta_v1`` code filter: stores that use it open and decode bit-identically
without luxar (our filter), in zarr format 2 and 3; our residuals are luxar's bytes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tensor_server.adapters._luxar_delta import delta_decode_columns, delta_encode_columns

_REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bits,cols", [(8, 1), (16, 3), (16, 6), (8, 4)])
def test_residuals_are_luxars_bytes_and_round_trip(luxar, bits, cols):
    from luxar.encoding._encoders.delta_codec import LuxarDelta

    rng = np.random.default_rng(bits * cols)
    dt = np.uint8 if bits == 8 else np.uint16
    codes = np.cumsum(rng.integers(-40, 40, (777, cols)), axis=0).astype(dt)  # a ramp that wraps
    ours = delta_encode_columns(codes, cols, bits)
    theirs = np.asarray(LuxarDelta(cols=cols, bits=bits).encode(codes)).reshape(-1)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(delta_decode_columns(ours, cols, bits).reshape(codes.shape), codes)


_READ_WITHOUT_LUXAR = textwrap.dedent("""
    import importlib.metadata as md, sys
    import numpy as np
    _orig = md.entry_points
    def _hide_luxar(**kw):  # as if luxar were not installed: no entry points either
        eps = _orig(**kw)
        keep = lambda group: md.EntryPoints(e for e in group if not e.value.startswith("luxar"))
        return type(eps)({g: keep(v) for g, v in eps.items()}) if isinstance(eps, dict) else keep(eps)
    md.entry_points = _hide_luxar
    import tensor_server
    src = tensor_server.open(sys.argv[1])
    for field in ("pos", "hdr"):
        np.save(f"{sys.argv[2]}/{field}.npy", src.tensors[field].get_data())
    print(",".join(m for m in sys.modules if m.split(".")[0] == "luxar"))
""")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_delta_filtered_store_reads_without_luxar(tmp_path, luxar, zarr_format):
    from luxar.encoding.compression import WIDTH_AWARE_DEFAULT

    store = tmp_path / f"delta{zarr_format}.zarr"
    root = luxar.open_group(str(store), mode="w", zarr_format=zarr_format)
    t = np.linspace(0, 60, 30000)
    pos = np.stack([np.sin(t) * 100, np.cos(t) * 100, t], axis=1).astype(np.float32)
    hdr = np.exp(np.stack([np.sin(t), np.cos(t), np.sin(2 * t)], axis=1) * 3).astype(np.float32)
    enc = luxar.ArrayEncoder()
    enc.encode(
        data=pos,
        zarr_group=root,
        name="pos",
        semantic_type=luxar.SemanticType.COORDINATE,
        chunks=(4096, 3),
        compressor=WIDTH_AWARE_DEFAULT,
    )
    enc.encode(
        data=hdr,
        zarr_group=root,
        name="hdr",
        semantic_type=luxar.SemanticType.COLOR,
        color_mode="hdr",
        chunks=(4096, 3),
        compressor=WIDTH_AWARE_DEFAULT,
    )
    meta = (store / "pos" / (".zarray" if zarr_format == 2 else "zarr.json")).read_text()
    assert "luxar_delta_v1" in meta, "the writer did not choose the delta filter; the test would prove nothing"
    out = tmp_path / "out"
    out.mkdir()
    env_path = f"{_REPO}:{_REPO / 'kernels'}"
    proc = subprocess.run(
        [sys.executable, "-c", _READ_WITHOUT_LUXAR, str(store), str(out)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"luxar was imported: {proc.stdout}"
    dec = luxar.ArrayDecoder()
    for field in ("pos", "hdr"):
        np.testing.assert_array_equal(np.load(out / f"{field}.npy"), dec.decode(root[field], root), err_msg=field)
