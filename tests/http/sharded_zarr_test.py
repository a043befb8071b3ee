"""The zarr v3 view is sharded (``sharding_indexed``, index at the end): the shard bytes are
the inner chunks then the index, suffix ranges and HEAD answer exact lengths with CORS
exposing them, zarr-python reads the shards equal to the engine, and neuroglancer draws a
volume from them."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.core.ngff import encode_shard
from tensor_server.http.zarr_view import ZarrImage, inner_chunks
from tests.http.conftest import POLICY, http_serving, ids
from tests.http.neuroglancer_test import screenshot_after_chunks, served_chunks


def test_shard_layout_is_inner_chunks_then_index():
    data = np.arange(4 * 6, dtype="<u2").reshape(4, 6)
    shard = bytes(encode_shard(data, (2, 3)))
    index = np.frombuffer(shard[-4 * 16 :], "<u8").reshape(4, 2)
    assert index[:, 1].tolist() == [12] * 4 and index[:, 0].tolist() == [0, 12, 24, 36]
    second = np.frombuffer(shard[12:24], "<u2").reshape(2, 3)  # inner chunk (0, 1)
    np.testing.assert_array_equal(second, data[0:2, 3:6])
    assert inner_chunks((1, 256, 700)) == (1, 64, 50) and inner_chunks((5, 64, 67)) == (5, 64, 67)


def test_v3_levels_are_sharded_and_suffix_ranges_are_exact(served, http_catalog):
    srv, http = served
    array_id = ids(http_catalog)["plane"]
    tensor, _ = http_catalog.find_tensor(array_id)
    level = ZarrImage(tensor, name=array_id, policy=POLICY).levels[0]
    meta = httpx.get(f"{http.url}/zarr3/{array_id}/0/zarr.json").json()
    (codec,) = meta["codecs"]
    assert codec["name"] == "sharding_indexed" and codec["configuration"]["index_location"] == "end"
    inner = codec["configuration"]["chunk_shape"]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == list(level.chunks)
    n_inner = int(np.prod([s // i for s, i in zip(level.chunks, inner)]))
    url = f"{http.url}/zarr3/{array_id}/0/c/1/1"
    whole = httpx.get(url).content
    assert len(whole) == level.chunks[0] * level.chunks[1] * 2 + 16 * n_inner
    head = httpx.head(url, headers={"Origin": "http://viewer.example"})
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(whole)
    exposed = head.headers["access-control-expose-headers"].lower()
    assert "content-length" in exposed and "content-range" in exposed
    tail = httpx.get(url, headers={"Range": f"bytes=-{16 * n_inner}"})
    assert tail.status_code == 206 and tail.content == whole[-16 * n_inner :]
    assert tail.headers["content-range"] == f"bytes {len(whole) - 16 * n_inner}-{len(whole) - 1}/{len(whole)}"
    assert int(tail.headers["content-length"]) == 16 * n_inner
    index = np.frombuffer(tail.content, "<u8").reshape(-1, 2)
    off, nbytes = (int(v) for v in index[1])  # inner chunk (0, 1) of shard (1, 1)
    part = httpx.get(url, headers={"Range": f"bytes={off}-{off + nbytes - 1}"}).content
    want = srv.runtime.engine.read(
        tensor,
        [
            slice(level.chunks[0], level.chunks[0] + inner[0]),
            slice(level.chunks[1] + inner[1], level.chunks[1] + 2 * inner[1]),
        ],
    )
    np.testing.assert_array_equal(np.frombuffer(part, "<u2").reshape(inner), want)


def test_neuroglancer_draws_a_volume_from_the_sharded_view(tmp_path):
    import neuroglancer
    from PIL import Image

    vol = np.full((4, 512, 512), 2000, np.uint16)
    vol[:, :, 256:] = 60000
    cat = Catalog([])
    cat.add_source(
        MemorySource(
            ArrayAdapter(
                vol, "zyx", chunk_shape=(4, 256, 256), physical_scale=(1.0, 1.0, 1.0), physical_unit=("micrometer",) * 3
            ),
            source_id="vol",
        )
    )
    cat.first_scan_done.set()
    from tensor_server.http.security import HttpSecurity

    token = "sharded-token"  # neuroglancer's page is another origin: the token rides in the URL path
    with http_serving(cat, tmp_path, security=HttpSecurity.build(tokens=[token])) as (srv, http):
        meta = httpx.get(f"{http.url}/t/{token}/zarr3/vol/0/zarr.json").json()
        assert meta["codecs"][0]["name"] == "sharding_indexed"
        neuroglancer.set_server_bind_address("127.0.0.1")
        viewer = neuroglancer.Viewer()
        with viewer.txn() as state:
            state.layers["vol"] = neuroglancer.ImageLayer(
                source=f"zarr3://{http.url}/t/{token}/zarr3/vol/",
                shader="void main() { emitGrayscale(float(getDataValue().value) / 65535.0); }",
            )
            state.layout = "yz"  # the panel of the 2nd and 3rd dimensions (y, x): a z plane
        png = screenshot_after_chunks(viewer, srv)
        (tmp_path / "neuroglancer-sharded.png").write_bytes(png)
    assert served_chunks(srv) >= 4, "neuroglancer fetched no shards"
    shot = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    h, w = shot.shape
    cols = shot[h // 3 : 2 * h // 3].mean(axis=0)  # the middle third of the rows, inside the image
    dark, bright = cols < 40, cols > 200
    assert dark.sum() > w * 0.2 and bright.sum() > w * 0.2, f"dark {dark.sum()}, bright {bright.sum()} of {w} columns"
    assert 0.7 < bright.sum() / dark.sum() < 1.4, "the halves rendered unequally"
    # neuroglancer's yz panel draws x increasing leftwards: the bright half (x >= 256) on the left
    assert np.flatnonzero(bright).mean() < np.flatnonzero(dark).mean(), "the halves are in the wrong order"


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
