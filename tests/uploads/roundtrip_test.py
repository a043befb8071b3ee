"""upload_array through the real SDK, then READY, then reads (full, sliced, every scaled
method) equal the uploaded array and the NumPy oracle, for both store formats."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_server_kernels import reference

from tests.uploads.conftest import discovered_id, upload_server

SHAPES = {
    2: ((37, 50), (16, 20)),
    3: ((5, 33, 41), (2, 16, 16)),
    4: ((3, 4, 17, 19), (2, 3, 8, 8)),
    5: ((2, 3, 4, 13, 11), (1, 2, 3, 8, 8)),
}
METHODS = ("nearest", "area", "min", "max", "mode", "median")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with upload_server(tmp_path_factory.mktemp("up")) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    from biopb.tensor import TensorFlightClient

    return TensorFlightClient(srv.location)


def _array(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("scheme", ["zarr", "cache"])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
@pytest.mark.parametrize("ndim", [2, 3, 4, 5])
def test_upload_then_read_equals_array_and_oracle(client, srv, scheme, dtype, ndim):
    shape, chunks = SHAPES[ndim]
    arr = _array(shape, dtype, ndim)
    desc = client.setup_array_upload(f"{scheme}://scratch/@fields/{scheme}-{dtype}-{ndim}d", arr, chunk_shape=chunks)
    assert desc.array_id == f"scratch/@fields/{scheme}-{dtype}-{ndim}d"  # no scheme in the answer
    assert tuple(desc.shape) == shape and np.dtype(desc.dtype) == arr.dtype
    if scheme == "cache":  # the uploaded grid, exactly (ragged edges included)
        assert tuple(desc.chunk_shape) == chunks
    status = client.upload_array(desc, arr)
    expected = int(np.prod([-(-n // c) for n, c in zip(shape, desc.chunk_shape)]))
    assert status == {
        "source_id": desc.array_id,
        "state": "READY",
        "expected_chunks": expected,
        "uploaded_chunks": expected,
        "reason": "",
    }
    got = client.get_array(desc.array_id)
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)
    sl = tuple(slice(n // 3, n - n // 4) for n in shape)
    np.testing.assert_array_equal(client.get_array(desc.array_id, slice_hint=sl), arr[sl])
    scale = [1] * (ndim - 2) + [2, 3]
    for method in METHODS:
        got = client.get_array(desc.array_id, scale_hint=scale, reduction_method=method)
        np.testing.assert_array_equal(got, reference.downsample(arr, scale, method), err_msg=method)


def test_zarr_member_plans_several_chunks_on_its_store_grid(client, srv):
    arr = _array((3, 1200, 1500), "uint16", 7)
    desc = client.setup_array_upload("zarr://scratch/@fields/big", arr, chunk_shape=(1, 512, 512))
    up = srv.runtime.uploads.get(desc.array_id)
    assert tuple(up.member._array.chunks) == tuple(desc.chunk_shape)  # store chunk == transfer grid
    assert up.expected_chunks > 1
    client.upload_array(desc, arr)
    np.testing.assert_array_equal(client.get_array(desc.array_id), arr)
    assert (up.member.path / ".zattrs").is_file() and (up.member.path / "0" / ".zarray").is_file()


@pytest.mark.parametrize("scheme", ["zarr", "cache"])
def test_field_of_a_discovered_and_a_memory_source(client, srv, scheme):
    cat = srv.runtime.catalog
    disc = discovered_id(cat)
    for sid in (disc, "mem"):
        arr = _array((40, 30), "uint16", 3)
        desc = client.setup_array_upload(f"{scheme}://{sid}/@fields/result-{scheme}", arr, chunk_shape=(16, 16))
        assert desc.array_id == f"{sid}/@fields/result-{scheme}"
        row = client.query(f"SELECT tensors FROM sources WHERE source_id = '{sid}'").to_pylist()[0]
        assert desc.array_id not in [t["array_id"] for t in row["tensors"]], "PENDING is not listed"
        client.upload_array(desc, arr)
        row = client.query(f"SELECT tensors FROM sources WHERE source_id = '{sid}'").to_pylist()[0]
        ids = [t["array_id"] for t in row["tensors"]]
        assert ids[-1] == desc.array_id, "listed after the format's own tensors once READY"
        np.testing.assert_array_equal(client.get_array(desc.array_id), arr)
        assert (srv.runtime.uploads.write_dir / "fields" / sid / f"result-{scheme}").is_dir()
        client.set_upload_status(desc.array_id, "DISCARDED")
    # the source's own tensor is untouched
    np.testing.assert_array_equal(client.get_array(disc), np.arange(1200, dtype=np.uint16).reshape(40, 30))


def test_unwritten_chunks_read_as_zeros_once_ready(client):
    from biopb.tensor.ticket_pb2 import ChunkBounds

    for scheme in ("zarr", "cache"):
        arr = _array((20, 24), "uint16", 5)
        desc = client.setup_array_upload(f"{scheme}://scratch/@fields/holes-{scheme}", arr, chunk_shape=(20, 24))
        if scheme == "cache":
            desc = client.setup_array_upload("cache://scratch/@fields/holes-grid", arr, chunk_shape=(10, 12))
            client.upload_chunk(desc, ChunkBounds(start=[10, 12], stop=[20, 24]), arr[10:, 12:])
        st = client.set_upload_status(desc.array_id, "READY")
        want = np.zeros_like(arr)
        if scheme == "cache":
            want[10:, 12:] = arr[10:, 12:]
            assert (st["expected_chunks"], st["uploaded_chunks"]) == (4, 1)
        np.testing.assert_array_equal(client.get_array(desc.array_id), want)
