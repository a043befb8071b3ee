"""Hostile IIIF and DeepZoom requests through the real HTTP door: every number out of bounds
is a 400 naming its field before anything is read (never a 500 from an OverflowError or a
ValueError), and a distorted size reads a level bounded by its output, counted as the pixels
the door's region reads return (``ServingRuntime.level_region``)."""

from __future__ import annotations

import io
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.errors import MAX_ERROR_CHARS
from tensor_server.render.plane import READ_PER_OUTPUT_PX
from tests.http.conftest import http_serving
from tests.viewers.conftest import memory_catalog

SIDE = 4096
HUGE = "9" * 20
ARABIC_12 = "\u0661\u0662"  # '١٢': int() reads it as 12, str.isdigit() accepts it
SQUARED = "\u00b2"  # '²': str.isdigit() accepts it, int() refuses it


@contextmanager
def _counting(runtime):
    """The pixels of each level region the viewer doors read, while in the block."""
    reads: list[int] = []
    real = runtime.level_region

    def level_region(*args, **kwargs):
        data = real(*args, **kwargs)
        reads.append(int(data.size))
        return data

    runtime.level_region = level_region
    try:
        yield reads
    finally:
        del runtime.level_region


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A 4096² 8-bit image that holds no memory (every pixel one stride-0 value)."""
    image = ArrayAdapter(np.broadcast_to(np.uint8(90), (SIDE, SIDE)), "yx", chunk_shape=(512, 512))
    with http_serving(memory_catalog(img=image), tmp_path_factory.mktemp("hostile")) as (srv, http):
        yield srv.runtime, http.url


HOSTILE = [
    # (path below the door, a word the 400 names)
    (f"/iiif/3/img/full/{HUGE},/0/default.jpg", "size width"),
    (f"/iiif/3/img/full/,{HUGE}/0/default.jpg", "size height"),
    (f"/iiif/3/img/full/^{HUGE},/0/default.jpg", "size width"),
    (f"/iiif/3/img/full/^!{HUGE},{HUGE}/0/default.jpg", "size width"),
    (f"/iiif/3/img/full/pct:{HUGE}/0/default.jpg", "size percentage"),
    ("/iiif/3/img/full/^pct:1e400/0/default.jpg", "size percentage"),
    ("/iiif/3/img/full/^pct:999999999/0/default.jpg", "maxWidth"),
    ("/iiif/3/img/pct:1e308,0,10,10/max/0/default.jpg", "region x"),
    (f"/iiif/3/img/pct:0,0,{HUGE},1/max/0/default.jpg", "region w"),
    (f"/iiif/3/img/0,0,{HUGE},1/max/0/default.jpg", "region w"),
    (f"/iiif/3/img/{HUGE},0,1,1/max/0/default.jpg", "region x"),
    (f"/iiif/3/img/full/max/{HUGE}9/default.jpg", "rotation"),
    ("/iiif/3/img/full/max/1e400/default.jpg", "rotation"),
    (f"/iiif/3/img/full/max/!{HUGE}.5/default.jpg", "rotation"),
    ("/iiif/3/img/full/!0,0/0/default.jpg", "zero dimension"),
    ("/iiif/3/img/full/^1,16777216/0/default.jpg", "maxWidth and maxHeight 16383"),
    (f"/iiif/3/img/{ARABIC_12},0,10,10/max/0/default.jpg", "region x"),
    (f"/iiif/3/img/full/{SQUARED},/0/default.jpg", "size width"),
    (f"/iiif/3/img/full/max/{ARABIC_12}/default.jpg", "rotation"),
    ("/iiif/3/img/full/" + "9" * 5000 + ",/0/default.jpg", "size width"),  # past int()'s 4300 digits
    (f"/iiif/3/img;z={SQUARED}/info.json", "plane selector"),
    (f"/iiif/3/img;z={HUGE}/full/max/0/default.jpg", "plane selector"),
    (f"/deepzoom/img_files/{10**30}/0_0.jpg", "DeepZoom level"),
    (f"/deepzoom/img_files/13/{ARABIC_12}_0.jpg", "DeepZoom tile column"),
    (f"/deepzoom/img_files/13/0_{SQUARED}.jpg", "DeepZoom tile row"),
    (f"/deepzoom/img_files/13/0_{HUGE}.jpg", "DeepZoom tile row"),
    (f"/deepzoom/img;t={ARABIC_12}.dzi", "plane selector"),
]


@pytest.mark.parametrize("path, field", HOSTILE, ids=[p[:60] for p, _ in HOSTILE])
def test_an_out_of_bounds_number_is_a_400_before_any_read(server, path, field):
    runtime, url = server
    with _counting(runtime) as reads:
        r = httpx.get(url + path, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.text.startswith("invalid_argument: ") and field in r.text, r.text[:300]
    assert len(r.text) <= MAX_ERROR_CHARS + 200
    assert reads == []


@pytest.mark.parametrize(
    "region, size, shown",
    [
        ("full", "4096,32", (4096, 32)),
        ("full", "32,4096", (32, 4096)),
        ("full", "4096,1", (4096, 1)),
        ("full", "1,4096", (1, 4096)),
        ("0,0,4096,2048", "1024,8", (1024, 8)),
    ],
)
def test_a_distorted_size_reads_a_level_bounded_by_its_output(server, region, size, shown):
    """``full/4096,32`` read the whole image at full resolution (16 Mpx; ``full/8192,64`` of an
    8192² image read 64 Mpx, +1.35 GB of memory for 128 MiB) for 0.13 Mpx of output; it now
    reads at most 4 pixels per output pixel (plus a row and column for the region's edges)."""
    from PIL import Image

    runtime, url = server
    with _counting(runtime) as reads:
        r = httpx.get(f"{url}/iiif/3/img/{region}/{size}/0/default.png", timeout=60)
    assert r.status_code == 200, r.text[:300]
    image = np.asarray(Image.open(io.BytesIO(r.content)))
    assert image.shape == shown[::-1] and (image == 90).all()
    out_w, out_h = shown
    assert len(reads) == 1 and reads[0] <= READ_PER_OUTPUT_PX * (out_w + 1) * (out_h + 1), reads
