"""Every served tensor as a virtual OME-Zarr image, read by real clients: zarr-python over
fsspec's HTTP filesystem (NGFF 0.4 / zarr v2 and NGFF 0.5 / zarr v3), ome-zarr-py's reader and
napari-ome-zarr's reader function; HTTP semantics (ETag/304, Range, HEAD, CORS, 404, 401)
checked with httpx; precache warming neighbours after a read."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from tensor_server.core.chunk_id import PRECOMPUTE
from tensor_server.http.zarr_view import ZarrImage
from tests.http.conftest import POLICY, http_serving, ids


def level_oracle(engine, tensor, level):
    if all(s == 1 for s in level.scale):
        return tensor.get_data()
    if level.method == PRECOMPUTE:
        return tensor.native_level(level.scale).tensor.get_data()
    return engine.read(tensor, None, level.scale, level.method)


@pytest.mark.parametrize("prefix", ["zarr", "zarr3"])
@pytest.mark.parametrize("kind", ["image", "labels", "tiff", "hdf5", "plane"])
def test_zarr_python_reads_every_level_whole_and_sliced(served, http_catalog, prefix, kind):
    import zarr

    srv, http = served
    array_id = ids(http_catalog)[kind]
    tensor, _ = http_catalog.find_tensor(array_id)
    view = ZarrImage(tensor, name=array_id, policy=POLICY)
    assert len(view.levels) >= 2, f"{kind}: the case needs a pyramid"
    for level in view.levels:
        z = zarr.open_array(f"{http.url}/{prefix}/{array_id}/{level.path}", mode="r")
        want = level_oracle(srv.runtime.engine, tensor, level)
        assert z.shape == want.shape and z.dtype == want.dtype
        np.testing.assert_array_equal(z[...], want, err_msg=f"{kind} level {level.path}")
        sl = tuple(slice(n // 3, max(n // 3 + 1, n - n // 4)) for n in want.shape)
        np.testing.assert_array_equal(z[sl], want[sl])


def test_group_metadata_lists_levels_with_physical_scales(served, http_catalog):
    srv, http = served
    array_id = ids(http_catalog)["plane"]
    attrs = httpx.get(f"{http.url}/zarr/{array_id}/.zattrs").json()
    ms = attrs["multiscales"][0]
    assert ms["version"] == "0.4"
    assert [a["name"] for a in ms["axes"]] == ["y", "x"]
    assert all(a["type"] == "space" and a["unit"] == "micrometer" for a in ms["axes"])
    scales = [d["coordinateTransformations"][0]["scale"] for d in ms["datasets"]]
    assert scales[0] == [0.25, 0.25] and scales[1] == [0.5, 0.5] and len(scales) >= 3
    v3 = httpx.get(f"{http.url}/zarr3/{array_id}/zarr.json").json()
    assert v3["node_type"] == "group" and v3["attributes"]["ome"]["version"] == "0.5"
    assert v3["attributes"]["ome"]["multiscales"][0]["datasets"] == ms["datasets"]


def test_ome_zarr_reader_finds_multiscales_and_labels(served, http_catalog):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Label, Multiscales, Reader

    srv, http = served
    image_id = ids(http_catalog)["image"]
    tensor, _ = http_catalog.find_tensor(image_id)
    nodes = list(Reader(parse_url(f"{http.url}/zarr/{image_id}/"))())
    image = nodes[0]
    assert image.load(Multiscales) is not None
    assert [d.shape for d in image.data] == [tuple(tensor.shape)] + [lv.tensor.shape for lv in tensor.native_levels]
    np.testing.assert_array_equal(np.asarray(image.data[1]), tensor.native_levels[0].tensor.get_data())
    label_nodes = [n for n in nodes if n.load(Label) is not None]
    assert label_nodes, "the labels/ group was not found"
    labels, _ = http_catalog.find_tensor(ids(http_catalog)["labels"])
    np.testing.assert_array_equal(np.asarray(label_nodes[0].data[0]), labels.get_data())


def test_napari_ome_zarr_reader_returns_layers_with_scales(served, http_catalog):
    from napari_ome_zarr import napari_get_reader

    srv, http = served
    array_id = ids(http_catalog)["plane"]
    url = f"{http.url}/zarr/{array_id}/"
    reader = napari_get_reader(url)
    assert reader is not None
    layers = reader(url)
    data, kwargs, kind = layers[0]
    assert kind == "image"
    assert [tuple(d.shape) for d in data][:2] == [(700, 900), (350, 450)]
    assert list(kwargs["scale"]) == [0.25, 0.25]
    tensor, _ = http_catalog.find_tensor(array_id)
    np.testing.assert_array_equal(np.asarray(data[0][100:200, 300:400]), tensor.get_data()[100:200, 300:400])


def test_http_semantics(served, http_catalog):
    srv, http = served
    array_id = ids(http_catalog)["plane"]
    base = f"{http.url}/zarr/{array_id}"
    with httpx.Client() as c:
        r = c.get(f"{base}/0/0.0", headers={"Origin": "http://viewer.example"})
        assert r.status_code == 200 and len(r.content) == 128 * 128 * 2
        assert r.headers["access-control-allow-origin"] == "http://viewer.example"  # a configured origin
        etag = r.headers["etag"]
        assert r.headers["cache-control"] == "no-cache"
        assert c.get(f"{base}/0/0.0", headers={"If-None-Match": etag}).status_code == 304
        part = c.get(f"{base}/0/0.0", headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == r.content[10:20]
        assert part.headers["content-range"] == f"bytes 10-19/{len(r.content)}"
        assert c.get(f"{base}/0/0.0", headers={"Range": "bytes=999999-"}).status_code == 416
        head = c.head(f"{base}/0/0.0")
        assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == etag
        edge = np.frombuffer(c.get(f"{base}/0/5.7").content, np.uint16).reshape(128, 128)
        tensor, _ = http_catalog.find_tensor(array_id)
        want = np.zeros((128, 128), np.uint16)
        want[: 700 - 640, : 900 - 896] = tensor.get_data()[640:, 896:]
        np.testing.assert_array_equal(edge, want)  # the edge chunk, padded with the fill value
        assert c.get(f"{base}/0/6.0").status_code == 404  # off the grid
        assert c.get(f"{base}/0/x.y").status_code == 404
        assert c.get(f"{base}/99/.zarray").status_code == 404
        assert c.get(f"{http.url}/zarr/no-such-array/.zattrs").status_code == 404
        assert c.get(f"{http.url}/other/{array_id}/.zattrs").status_code == 404
        pre = c.options(
            f"{base}/0/0.0",
            headers={
                "Origin": "http://viewer.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "range",
            },
        )
        assert pre.status_code == 204 and "range" in pre.headers["access-control-allow-headers"].lower()


def test_http_chunks_are_the_engines_chunks(served, http_catalog):
    """A zarr chunk is the planned chunk: the same chunk id, stored in the cache the Flight
    server uses, the same pixels the SDK gets for that level."""
    from biopb.tensor import TensorFlightClient

    srv, http = served
    array_id = ids(http_catalog)["plane"]
    tensor, _ = http_catalog.find_tensor(array_id)
    view = ZarrImage(tensor, name=array_id, policy=POLICY)
    level = view.levels[1]
    body = httpx.get(f"{http.url}/zarr/{array_id}/1/1.1").content
    key = view.chunk_id(level, (1, 1)).encode()
    assert srv.runtime.cache.contains_all([key])
    entry = srv.runtime.cache.get(key)
    got = np.frombuffer(body, np.uint16).reshape(level.chunks)[: entry.shape[0], : entry.shape[1]]
    np.testing.assert_array_equal(got, entry)
    sdk_level = TensorFlightClient(srv.location).get_array(
        array_id, scale_hint=list(level.scale), reduction_method="area"
    )
    c0, c1 = level.chunks
    np.testing.assert_array_equal(sdk_level[c0 : 2 * c0, c1 : 2 * c1], entry)


def test_token_is_required_when_configured(http_catalog, tmp_path):
    with http_serving(http_catalog, tmp_path, token="s3cret") as (srv, http):
        url = f"{http.url}/zarr/plane/.zattrs"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(url + "?token=s3cret").status_code == 200


def test_precache_warms_neighbours_and_counts_hits(http_catalog, tmp_path):
    from biopb.tensor import TensorFlightClient

    with http_serving(http_catalog, tmp_path, precache_bytes=64 << 20) as (srv, http):
        tensor, _ = http_catalog.find_tensor("plane")
        view = ZarrImage(tensor, name="plane", policy=POLICY)
        level = view.levels[1]
        assert httpx.get(f"{http.url}/zarr/plane/{level.path}/1.1").status_code == 200
        deadline = time.monotonic() + 30
        while not srv.runtime.precacher.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.runtime.precacher.stats["warmed"] > 0
        neighbours = [view.chunk_id(level, (i, j)).encode() for i in (0, 1, 2) for j in (0, 1, 2)]
        assert srv.runtime.cache.contains_all(neighbours), "the 3x3 neighbourhood is cached"
        coarser = view.chunk_id(view.levels[2], (0, 0)).encode()
        assert srv.runtime.cache.contains_all([coarser]), "the next coarser level over the region is cached"
        hits = srv.runtime.precacher.stats["hits"]
        assert httpx.get(f"{http.url}/zarr/plane/{level.path}/0.1").status_code == 200
        assert srv.runtime.precacher.stats["hits"] == hits + 1
        stats = TensorFlightClient(srv.location).cache_stats()
        assert stats["precache"]["hits"] >= 1


def test_a_whole_chunk_is_answered_from_its_own_memory(http_catalog):
    """A chunk that needs no padding or byte swap is sent without a copy: the bytes the door
    hands to the response are the chunk's own (encode_chunk), and the response keeps them as
    they are; an edge chunk is padded into a new buffer."""
    from starlette.responses import Response

    tensor, _ = http_catalog.find_tensor("plane")
    view = ZarrImage(tensor, name="plane", policy=POLICY)
    level = view.levels[0]
    data = np.ascontiguousarray(tensor.get_data(view.chunk_id(level, (0, 0)).bounds))
    assert data.shape == level.chunks, "the case needs a whole chunk at the origin"
    body = Response(view.encode_chunk(level, data), media_type="application/octet-stream").body
    assert np.shares_memory(np.frombuffer(body, np.uint8), data)
    edge = data[:-1]
    padded = view.encode_chunk(level, edge)
    assert not np.shares_memory(np.frombuffer(padded, np.uint8), edge) and len(padded) == data.nbytes
