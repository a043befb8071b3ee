"""URL paths resolved in one step (``http/paths.py``): a bioformats2raw image (field ``0``)
under its source id, every level as the engine reads it; a 30,000-segment path refused at
once while other requests keep flowing; chunk keys that only look like digits."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.core.chunk_id import PRECOMPUTE
from tensor_server.testing import finishes_within, serving


def _bioformats2raw(root):
    """A bioformats2raw layout written by ome-zarr-py: series ``0`` an NGFF 0.4 image with
    three levels, the root group marked ``bioformats2raw.layout``."""
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image

    img = np.random.default_rng(3).integers(0, 4000, (2, 96, 80), dtype=np.uint16)
    store = parse_url(str(root / "b2r.zarr"), mode="w").store
    top = zarr.group(store=store, zarr_format=2)
    top.attrs["bioformats2raw.layout"] = 3
    write_image(img, top.create_group("0"), axes="cyx", scaler=None, storage_options={"chunks": (1, 48, 40)})
    return img


def _level_arrays(url):
    import zarr

    group = zarr.open_group(url, mode="r")
    attrs = group.attrs.asdict()
    datasets = (attrs.get("multiscales") or attrs["ome"]["multiscales"])[0]["datasets"]
    return [zarr.open_array(f"{url}{d['path']}", mode="r")[...] for d in datasets]


@pytest.fixture(scope="module")
def b2r_served(tmp_path_factory):
    root = tmp_path_factory.mktemp("b2r")
    img = _bioformats2raw(root)
    cat = Catalog([root])
    cat.scan()
    with serving(cat, http=True) as srv:
        yield srv, cat, img
    cat.close()


def test_a_bioformats2raw_image_opens_under_its_source_id(b2r_served):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    srv, cat, img = b2r_served
    rec = next(r for r in cat.records() if r.source is not None)
    assert list(rec.source.tensors)[0] == "0", "the series field of a bioformats2raw layout"
    for flavour in ("zarr", "zarr3"):
        url = f"{srv.http_url}/{flavour}/{rec.source_id}/"
        assert httpx.get(f"{url}{'0/.zarray' if flavour == 'zarr' else '0/zarr.json'}").json()["shape"] == [2, 96, 80]
        levels = _level_arrays(url)
        np.testing.assert_array_equal(levels[0], img)
        image = srv.runtime.catalog.find_tensor(rec.source_id)[0]
        from tensor_server.core.pyramid import advertised_levels

        for lv, got in zip(advertised_levels(image, srv.runtime.policy), levels):
            if lv.method == PRECOMPUTE and any(s > 1 for s in lv.scale):  # a stored level: its own pixels
                want = image.native_level(lv.scale).tensor.get_data()
            else:
                want = srv.runtime.engine.read(
                    image, None, lv.scale, lv.method if any(s > 1 for s in lv.scale) else None
                )
            np.testing.assert_array_equal(got, want)
        assert len(levels) >= 2
    nodes = list(Reader(parse_url(f"{srv.http_url}/zarr/{rec.source_id}/"))())
    assert nodes[0].load(Multiscales) is not None
    np.testing.assert_array_equal(np.asarray(nodes[0].data[0]), img)


def test_the_field_spelled_out_still_reads_below_the_level(b2r_served):
    """``<source>/0/0/.zarray`` is level 0 of field ``0``; ``<source>/0/.zarray`` level 0 of
    the default tensor (the same image): both name the pixels, neither is a 404."""
    srv, cat, img = b2r_served
    sid = next(r.source_id for r in cat.records() if r.source is not None)
    for path in (f"{sid}/0/.zarray", f"{sid}/0/0/.zarray"):
        r = httpx.get(f"{srv.http_url}/zarr/{path}")
        assert r.status_code == 200 and r.json()["shape"] == [2, 96, 80], path


def test_the_real_bioformats2raw_sample_reads_every_level(testdata, expected):
    root = testdata / "ome-zarr" / "bioformats2raw-v0.1-zarr2"
    cat = Catalog([root])
    cat.scan()
    try:
        rec = next(r for r in cat.records() if r.source is not None and r.type.startswith(("zarr", "ome-zarr")))
        with serving(cat, http=True) as srv:
            levels = _level_arrays(f"{srv.http_url}/zarr/{rec.source_id}/")
            tensor = rec.source.tensor()
            np.testing.assert_array_equal(levels[0], tensor.get_data())
            assert int(levels[0].astype(np.int64).sum()) == 10445323  # SOURCES.md: level 0's sum
            assert int(levels[1].astype(np.int64).sum()) == 2557074
    finally:
        cat.close()


def test_a_30000_segment_path_is_a_404_while_others_flow(b2r_served):
    srv, cat, img = b2r_served
    sid = next(r.source_id for r in cat.records() if r.source is not None)
    good = f"{srv.http_url}/zarr/{sid}/0/.zarray"
    hostile = f"{srv.http_url}/zarr/{sid}/" + "a/" * 30_000

    def flood():
        with httpx.Client(timeout=30) as c:
            return [c.get(hostile).status_code for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        flooding = pool.submit(flood)
        with httpx.Client(timeout=30) as c:
            oks = [c.get(good).status_code for _ in range(20)]
        assert finishes_within(flooding.result, 30) == [404] * 20
    assert oks == [200] * 20
    r = httpx.get(hostile)
    assert r.status_code == 404 and "segments names no array" in r.text and len(r.text) < 2048


@pytest.mark.parametrize("key", ["%C2%B2", "\u00b2", "1.%C2%B2", "-1", "1e3"])
def test_chunk_keys_that_are_not_ascii_digits_are_404(b2r_served, key):
    srv, cat, img = b2r_served
    sid = next(r.source_id for r in cat.records() if r.source is not None)
    r = httpx.get(f"{srv.http_url}/zarr/{sid}/0/0.{key}")
    assert r.status_code == 404, (key, r.status_code, r.text)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_slowloris_connection_is_closed_at_the_header_deadline(b2r_served, parser):
    """A client that never finishes its headers is cut off; a normal request on another
    connection is answered meanwhile, and one finishing in time on this front end too (with
    either HTTP parser the door can run on)."""
    import socket

    from tensor_server.http.app import HttpFrontEnd, build_app

    srv, cat, img = b2r_served
    front = HttpFrontEnd(build_app(srv.runtime), "127.0.0.1", 0, header_seconds=0.5, parser=parser)
    front.start()
    try:
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
            assert httpx.get(f"{front.url}/healthz").text == "ok"
            assert finishes_within(lambda: slow.recv(1024), 10) == b"", "the server closed the connection"
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as ok:
            ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b"200 OK" in finishes_within(lambda: ok.recv(1024), 10)
            time.sleep(1.0)  # idle past the deadline after a response: the next headers are owed too
            assert finishes_within(lambda: ok.recv(1024), 10) == b""
    finally:
        front.stop()


def test_an_unknown_parser_is_refused():
    from tensor_server.http.app import HttpFrontEnd

    with pytest.raises(ValueError, match="unknown HTTP parser"):
        HttpFrontEnd(object(), "127.0.0.1", 0, parser="nghttp9")
