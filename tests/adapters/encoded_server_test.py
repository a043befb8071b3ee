"""Encoded (Luxar) zarr arrays through the server with the real biopb SDK: decoded values,
crops, scaled reads, the catalog row and descriptor (decoded dtype, encoding names), and a
refused array listed with its reason. Stores are written by luxar's own encoder; values are
compared with luxar's own decoder (exact, or within 1 float32 ULP for the exp families:
see encoded_zarr_test.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensor_server_kernels import reference

from tensor_server.catalog import Catalog
from tensor_server.testing import serving

from ..flight.conftest import client_for
from .encoded_zarr_test import assert_decoded_equal

N = 20_000


@pytest.fixture(scope="module")
def lux_root(tmp_path_factory, luxar):
    S, M = luxar.SemanticType, luxar.EncodingMode
    top = tmp_path_factory.mktemp("encoded_root")
    root = luxar.open_group(str(top / "scene.zarr"), mode="w")
    enc = luxar.ArrayEncoder()
    rng = np.random.default_rng(5)
    enc.encode(
        data=(rng.standard_normal((N, 3)) * 20).astype(np.float32),
        zarr_group=root,
        name="positions",
        semantic_type=S.COORDINATE,
        chunks=(4096, 3),
    )
    enc.encode(
        data=np.exp(rng.uniform(-5, 5, (N, 3))).astype(np.float32),
        zarr_group=root,
        name="colors",
        semantic_type=S.COLOR,
        color_mode="hdr",
        chunks=(4096, 3),
    )
    enc.encode(
        data=np.exp(rng.uniform(-7, 7, N)).astype(np.float32),
        zarr_group=root,
        name="radii",
        semantic_type=S.POSITIVE_SCALAR,
        mode=M.MEMORY,
        positive_scalar_encoding="log",
        chunks=(5000,),
    )
    enc.encode(
        data=rng.choice(np.array([0.1, 0.2, 0.7], np.float32), N),
        zarr_group=root,
        name="sharpness",
        semantic_type=S.BOUNDED_SCALAR,
        chunks=(3000,),
    )
    enc.encode(data=0.5, n_elements=N, zarr_group=root, name="opacity", semantic_type=S.BOUNDED_SCALAR)
    bad = root.create_array("bad", shape=(10,), dtype="uint8", chunks=(10,))
    bad.attrs["encoding"] = {"name": "bounded_scalar_uint8", "min": 0.0, "bits": 8, "original_dtype": "float32"}
    return top


@pytest.fixture(scope="module")
def lux_server(lux_root):
    cat = Catalog([lux_root])
    cat.scan()
    with serving(cat) as srv:
        yield srv, cat
    cat.close()


def _decoded(luxar, lux_root, field):
    root = luxar.open_group(str(lux_root / "scene.zarr"), mode="r")
    return luxar.ArrayDecoder().decode(root[field], root)


def _source_id(cat):
    (rec,) = [r for r in cat.records() if r.source is not None]
    return rec.source_id


FIELDS = ["positions", "colors", "radii", "sharpness", "opacity"]


def test_whole_and_cropped_reads_equal_luxars_decoder(lux_server, lux_root, luxar):
    srv, cat = lux_server
    client, sid = client_for(srv), _source_id(cat)
    for field in FIELDS:
        want = _decoded(luxar, lux_root, field)
        name = json.loads(client.get_descriptor(f"{sid}/{field}", with_metadata=True).metadata_json)["metadata"][
            "encodings"
        ][field]
        got = client.get_array(f"{sid}/{field}")
        assert got.dtype == np.float32
        assert_decoded_equal(got, want, name, field)
        sl = (slice(1234, 17001),) + (slice(1, 3),) * (want.ndim - 1)
        assert_decoded_equal(client.get_array(f"{sid}/{field}", slice_hint=sl), want[sl], name, field)


@pytest.mark.parametrize("method", ["nearest", "area", "min", "max", "median"])
def test_scaled_reads_are_the_oracle_over_decoded_values(lux_server, method):
    srv, cat = lux_server
    client, sid = client_for(srv), _source_id(cat)
    for field in ("positions", "radii", "opacity"):
        want = cat.find_tensor(f"{sid}/{field}")[0].get_data()
        scale = [7] + [2] * (want.ndim - 1)
        got = client.get_array(f"{sid}/{field}", scale_hint=scale, reduction_method=method)
        np.testing.assert_array_equal(got, reference.downsample(want, scale, method), err_msg=f"{field} {method}")


def test_catalog_and_descriptor_show_decoded_dtype_and_encoding(lux_server):
    srv, cat = lux_server
    client, sid = client_for(srv), _source_id(cat)
    (row,) = client.query(f"SELECT tensors, metadata_json FROM sources WHERE source_id = '{sid}'").to_pylist()
    by_id = {t["array_id"]: t for t in row["tensors"]}
    assert by_id[f"{sid}/positions"]["dtype"] == "<f4" and by_id[f"{sid}/positions"]["shape"] == [N, 3]
    assert by_id[f"{sid}/opacity"]["shape"] == [N]
    meta = json.loads(row["metadata_json"])["metadata"]
    assert meta["encodings"] == {
        "colors": "geolog_perchannel_u16",
        "opacity": "broadcasted",
        "positions": "linear_perchannel_u16",
        "radii": "geolog_scalar_uint8",
        "sharpness": "lut_uint8",
    }
    (skipped,) = meta["skipped"]
    assert skipped["path"] == "bad" and "encoding.max: is required" in skipped["reason"]
    d = client.get_descriptor(f"{sid}/radii", with_metadata=True)
    assert d.dtype == "<f4" and list(d.shape) == [N]
    assert json.loads(d.metadata_json)["metadata"]["encodings"]["radii"] == "geolog_scalar_uint8"


def test_a_store_that_is_one_refused_array_stays_listed_with_the_reason(tmp_path):
    import zarr

    arr = zarr.open_array(str(tmp_path / "only.zarr"), mode="w", shape=(4,), dtype="uint8", zarr_format=2)
    arr.attrs["encoding"] = {"name": "lut_uint8", "lut": [1.0], "original_dtype": "float32", "extra": 1}
    cat = Catalog([tmp_path])
    cat.scan()
    with serving(cat) as srv:
        client = client_for(srv)
        (row,) = client.query("SELECT is_resolved, unresolved_reason FROM sources").to_pylist()
        assert row["is_resolved"] is False
        assert "encoding.extra: is not a field of 'lut_uint8'" in row["unresolved_reason"]
    cat.close()
