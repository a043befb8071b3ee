"""Bytes rewritten in place are never served as old pixels, nor mixed with new ones in one
read (issue 12, High 8): zarr chunk files (metadata untouched), also after a restart with a
persistent cache, and TIFFs with rescans off. Real SDK client, real files, real cache."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import descriptor_pb2

from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.testing import serving as serving_runtime
from tests.flight.conftest import client_for

# 12 MiB: more than one 8 MiB transfer chunk, so a plan has several endpoints
OLD = (np.arange(6 * 1024 * 1024, dtype=np.uint32) * 7 % 65521).astype(np.uint16).reshape(6, 1024, 1024)
NEW = OLD + 1


@contextmanager
def serving(root, cache_dir, store_path=None, scan=True):
    """Catalog + persistent cache + server, as ``serve`` builds them (no periodic rescan);
    ``store_path``: the catalog kept across restarts; ``scan`` False serves the restored rows
    as ``serve`` does before its background scan has reached them."""
    cat = Catalog([root], store_path=store_path)
    if scan:
        cat.scan()
    cache = CacheManager(cache_dir, max_total_bytes=64 << 20)
    try:
        with serving_runtime(cat, cache=cache) as server:
            yield server, cat
    finally:
        cat.close()
        cache.close()


def _bump_mtime(path):
    """A rewrite a second later (a same-tick rewrite could keep the mtime on coarse clocks)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _write_zarr(path, data):
    import zarr

    z = zarr.open_array(str(path), mode="w", shape=data.shape, chunks=(1, 256, 256), dtype=data.dtype, zarr_format=3)
    z[...] = data


def _rewrite_zarr_chunks(path, data):
    """New bytes into the existing chunk files only: zarr.json is left exactly as it was."""
    import zarr

    meta = path / "zarr.json"
    before = os.stat(meta).st_mtime_ns, meta.read_bytes()
    zarr.open_array(str(path), mode="r+")[...] = data
    for f in (path / "c").rglob("*"):
        if f.is_file():
            _bump_mtime(f)
    assert (os.stat(meta).st_mtime_ns, meta.read_bytes()) == before


def _plan(raw, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return raw.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString())).endpoints


def _pixels(table):
    row = table.to_pylist()[0]
    return np.frombuffer(row["data"], np.dtype(row["dtype"])).reshape(row["shape"])


def test_zarr_chunks_rewritten_in_place_are_served_new(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    _write_zarr(root / "img.zarr", OLD)
    with serving(root, tmp_path / "cache") as (srv, cat):
        sid = cat.records()[0].source_id
        c = client_for(srv)
        np.testing.assert_array_equal(c.get_array(sid), OLD)  # now cached
        _rewrite_zarr_chunks(root / "img.zarr", NEW)
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)


def test_zarr_rewrite_while_down_is_not_served_from_the_persistent_cache(tmp_path):
    root, cache_dir = tmp_path / "root", tmp_path / "cache"
    root.mkdir()
    _write_zarr(root / "img.zarr", OLD)
    with serving(root, cache_dir) as (srv, cat):
        sid = cat.records()[0].source_id
        np.testing.assert_array_equal(client_for(srv).get_array(sid), OLD)
    _rewrite_zarr_chunks(root / "img.zarr", NEW)
    with serving(root, cache_dir) as (srv, cat):
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)


def test_a_planned_zarr_read_refuses_chunks_rewritten_since_the_plan(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    _write_zarr(root / "img.zarr", OLD)
    with serving(root, tmp_path / "cache") as (srv, cat):
        sid = cat.records()[0].source_id
        raw = flight.FlightClient(srv.location)
        endpoints = _plan(raw, sid)
        assert len(endpoints) > 1
        first = _pixels(raw.do_get(endpoints[0].ticket).read_all())
        np.testing.assert_array_equal(first, OLD[tuple(slice(0, n) for n in first.shape)])
        _rewrite_zarr_chunks(root / "img.zarr", NEW)
        for ep in endpoints:  # the first one too: it is cached, yet its file changed
            with pytest.raises(flight.FlightError) as info:
                raw.do_get(ep.ticket).read_all()
            assert json.loads(info.value.extra_info) == {"code": "NOT_FOUND", "reason": "stale_content_version"}
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)


def _write_tiff(path, data):
    import tifffile

    tifffile.imwrite(path, data, tile=(256, 256), photometric="minisblack")


def test_tiff_rewritten_in_place_never_mixes_old_and_new_chunks(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    path = root / "img.tif"
    _write_tiff(path, OLD)
    with serving(root, tmp_path / "cache") as (srv, cat):
        sid = cat.records()[0].source_id
        raw = flight.FlightClient(srv.location)
        endpoints = _plan(raw, sid)
        assert len(endpoints) > 1
        got = [_pixels(raw.do_get(endpoints[0].ticket).read_all())]
        size = os.path.getsize(path)
        _write_tiff(path, NEW)  # same layout, same size: only the pixels differ
        _bump_mtime(path)
        assert os.path.getsize(path) == size
        for ep in endpoints[1:]:
            with pytest.raises(flight.FlightError) as info:
                got.append(_pixels(raw.do_get(ep.ticket).read_all()))
            assert json.loads(info.value.extra_info)["reason"] == "stale_content_version"
        assert len(got) == 1  # no chunk of the new file joined the old plan's read
        # the client's retry plans again and reads the new file only
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)
        assert cat.records()[0].source.tensor().content_version != b""


def test_tiff_rewrite_while_down_is_not_served_from_the_persistent_cache(tmp_path):
    root, cache_dir = tmp_path / "root", tmp_path / "cache"
    root.mkdir()
    _write_tiff(root / "img.tif", OLD)
    with serving(root, cache_dir) as (srv, cat):
        sid = cat.records()[0].source_id
        np.testing.assert_array_equal(client_for(srv).get_array(sid), OLD)
    _write_tiff(root / "img.tif", NEW)
    _bump_mtime(root / "img.tif")
    with serving(root, cache_dir) as (srv, cat):
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)


def _rewrite_keeping_mtime(path, write):
    """``write()`` new bytes over ``path``, then set its mtime (and atime) back as
    ``touch -r`` or a restore would: only the ctime (and a new inode, if replaced) tell."""
    before = os.stat(path)
    write()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


def test_tiff_rewritten_with_its_mtime_set_back_is_served_new_after_a_restart(tmp_path):
    root, cache_dir, store = tmp_path / "root", tmp_path / "cache", str(tmp_path / "home" / "catalog.duckdb")
    root.mkdir()
    small_old, small_new = OLD[:2, :512, :512], NEW[:2, :512, :512]
    _write_tiff(root / "img.tif", small_old)
    with serving(root, cache_dir, store) as (srv, cat):
        sid = cat.records()[0].source_id
        np.testing.assert_array_equal(client_for(srv).get_array(sid), small_old)  # now cached
    _rewrite_keeping_mtime(root / "img.tif", lambda: _write_tiff(root / "img.tif", small_new))
    with serving(root, cache_dir, store, scan=False) as (srv, cat):
        assert cat.restored == 1  # the row came back from the store, its file not looked at yet
        np.testing.assert_array_equal(client_for(srv).get_array(sid), small_new)
        assert cat.scan()["changed"] == 1  # the stored signature does not match the file either


def test_zarr_chunks_rewritten_with_their_mtimes_set_back_are_served_new_after_a_restart(tmp_path):
    import zarr

    root, cache_dir, store = tmp_path / "root", tmp_path / "cache", str(tmp_path / "home" / "catalog.duckdb")
    root.mkdir()
    small_old, small_new = OLD[:2, :512, :512], NEW[:2, :512, :512]
    z = zarr.create_array(
        str(root / "img.zarr"),
        shape=small_old.shape,
        chunks=(1, 256, 256),
        dtype=small_old.dtype,
        zarr_format=3,
        compressors=None,
    )  # every chunk file one size
    z[...] = small_old
    with serving(root, cache_dir, store) as (srv, cat):
        sid = cat.records()[0].source_id
        np.testing.assert_array_equal(client_for(srv).get_array(sid), small_old)
    chunk_files = sorted(f for f in (root / "img.zarr" / "c").rglob("*") if f.is_file())
    stats = {f: os.stat(f) for f in chunk_files}
    zarr.open_array(str(root / "img.zarr"), mode="r+")[...] = small_new
    for f, st in stats.items():
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (os.stat(f).st_size, os.stat(f).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with serving(root, cache_dir, store, scan=False) as (srv, cat):
        np.testing.assert_array_equal(client_for(srv).get_array(sid), small_new)


def test_tiff_sequence_stale_reason_names_only_files_under_the_bounds(tmp_path):
    import tifffile

    from tensor_server.adapters.registry import open_source
    from tensor_server.core.bounds import Bounds

    folder = tmp_path / "seq"
    folder.mkdir()
    plane = OLD[0, :64, :96]
    for z in range(3):
        tifffile.imwrite(folder / f"img_z{z:03d}.tif", plane + z)
    src = open_source(folder)
    t = src.tensor()
    assert t.shape == (3, 64, 96) and t.stale_reason(Bounds.full(t.shape)) is None
    tifffile.imwrite(folder / "img_z001.tif", plane * 2)
    _bump_mtime(folder / "img_z001.tif")
    assert t.stale_reason(Bounds((0, 0, 0), (1, 64, 96))) is None
    assert "img_z001.tif was rewritten" in t.stale_reason(Bounds((1, 0, 0), (2, 64, 96)))
    (folder / "img_z002.tif").unlink()
    assert "img_z002.tif was removed" in t.stale_reason(Bounds((2, 0, 0), (3, 64, 96)))
    src.close()


def test_a_zarr_array_too_large_to_stat_at_open_is_stamped_when_first_served(tmp_path, monkeypatch):
    from tensor_server.adapters import _zarr_array
    from tensor_server.adapters.registry import open_source
    from tensor_server.core.bounds import Bounds

    monkeypatch.setattr(_zarr_array, "_EAGER_CHUNKS", 4)  # this 6x4x4-chunk array is "large"
    _write_zarr(tmp_path / "big.zarr", OLD)
    src = open_source(tmp_path / "big.zarr")
    t = src.tensor()
    first = Bounds((0, 0, 0), (1, 256, 256))
    assert t.stale_reason(first) is None  # stamped now, before its pixels are read
    np.testing.assert_array_equal(t.get_data(first), OLD[:1, :256, :256])
    _rewrite_zarr_chunks(tmp_path / "big.zarr", NEW)
    assert "'c/0/0/0' changed" in t.stale_reason(first)
    src.close()


def _write_ome_zarr(path, level0):
    """An NGFF 0.4 image with a stored 2x level (zarr v2), written with zarr itself."""
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    for i, data in enumerate((level0, level0[:, ::2, ::2])):
        arr = group.create_array(str(i), shape=data.shape, chunks=(1, 256, 256), dtype=data.dtype)
        arr[...] = data
    group.attrs["multiscales"] = [
        {
            "version": "0.4",
            "axes": [{"name": n, "type": t} for n, t in (("z", "space"), ("y", "space"), ("x", "space"))],
            "datasets": [
                {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": [1, 2**i, 2**i]}]}
                for i in range(2)
            ],
        }
    ]


def test_a_rewritten_stored_level_is_refused_and_reread(tmp_path):
    import zarr

    old, new = OLD[:2, :512, :512], NEW[:2, :512, :512]
    root = tmp_path / "root"
    root.mkdir()
    _write_ome_zarr(root / "img.ome.zarr", old)
    with serving(root, tmp_path / "cache") as (srv, cat):
        sid = cat.records()[0].source_id
        c = client_for(srv)
        np.testing.assert_array_equal(
            c.get_array(sid, scale_hint=[1, 2, 2], reduction_method="precompute"), old[:, ::2, ::2]
        )
        raw = flight.FlightClient(srv.location)
        opt = descriptor_pb2.TensorReadOption(array_id=sid, scale_hint=[1, 2, 2], reduction_method="precompute")
        opt.fields.paths.append("endpoints")
        endpoints = raw.get_flight_info(
            flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
        ).endpoints
        level1 = root / "img.ome.zarr" / "1"
        zarr.open_array(str(level1), mode="r+")[...] = new[:, ::2, ::2]  # level 0 untouched
        for f in level1.iterdir():
            if not f.name.startswith("."):
                _bump_mtime(f)
        with pytest.raises(flight.FlightError) as info:
            raw.do_get(endpoints[0].ticket).read_all()
        assert json.loads(info.value.extra_info)["reason"] == "stale_content_version"
        np.testing.assert_array_equal(
            client_for(srv).get_array(sid, scale_hint=[1, 2, 2], reduction_method="precompute"), new[:, ::2, ::2]
        )
        np.testing.assert_array_equal(client_for(srv).get_array(sid), old)


def test_the_engine_refuses_changed_chunks_for_every_caller(tmp_path):
    """DoGet, chunk_locate, the HTTP front-end and the precacher all read through
    ``ReadEngine.chunk``: the check lives there, and its callback is the catalog's reopen."""
    from tensor_server.adapters.registry import open_source
    from tensor_server.core.engine import ReadEngine
    from tensor_server.core.plan import plan_read
    from tensor_server.errors import StaleChunkId

    path = tmp_path / "img.tif"
    _write_tiff(path, OLD[0])
    src = open_source(path)
    t = src.tensor()
    changed = []
    cache = CacheManager(tmp_path / "cache", max_total_bytes=64 << 20)
    engine = ReadEngine(cache, on_changed=lambda tensor, why: changed.append((tensor, why)))
    cid = plan_read(t).chunks[0].chunk_id
    np.testing.assert_array_equal(engine.chunk(cid, t)[1], OLD[0])  # now cached
    _write_tiff(path, NEW[0])
    _bump_mtime(path)
    with pytest.raises(StaleChunkId, match="img.tif was rewritten"):
        engine.chunk(cid, t)
    assert len(changed) == 1 and changed[0][0] is t and "img.tif was rewritten" in changed[0][1]
    cache.close()
    src.close()


# ---- the zarr check's memo of verified extents (adapters/_verified_extents.py) ------------------
def _age_folders(store):
    """Every folder of ``store`` last modified 10 s ago: settled, so a verification of its
    chunk files is remembered (a folder changed within ``RACY_S`` of its stat is not)."""
    for folder in [store, *(p for p in store.rglob("*") if p.is_dir())]:
        st = os.stat(folder)
        os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns - 10 * 10**9))


def _rewrite_in_place(path):
    """New bytes into the same inode, its folder untouched (no rename, no new file)."""
    ino, data = os.stat(path).st_ino, bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)
    _bump_mtime(path)
    assert os.stat(path).st_ino == ino


@pytest.fixture
def zarr_tensor(tmp_path):
    from tensor_server.adapters.registry import open_source
    from tensor_server.core.bounds import Bounds

    _write_zarr(tmp_path / "img.zarr", OLD[:2])
    _age_folders(tmp_path / "img.zarr")
    src = open_source(tmp_path / "img.zarr")
    yield src.tensor(), Bounds.full(src.tensor().shape), tmp_path / "img.zarr"
    src.close()


def test_a_chunk_rewritten_in_place_is_seen_within_the_window(zarr_tensor, monkeypatch):
    """The bound: an in-place rewrite of a chunk file under an extent verified less than
    ``WINDOW_S`` ago may go unseen until the window ends, never longer."""
    import time

    from tensor_server.adapters import _verified_extents

    monkeypatch.setattr(_verified_extents, "WINDOW_S", 0.5)
    t, whole, store = zarr_tensor
    assert t.stale_reason(whole) is None  # every chunk file stat'ed, the extent remembered
    t0 = time.monotonic()
    _rewrite_in_place(store / "c" / "1" / "3" / "2")
    if time.monotonic() - t0 < 0.4:
        assert t.stale_reason(whole) is None  # within the window: not stat'ed file by file
    time.sleep(0.6)
    assert "'c/1/3/2' changed" in t.stale_reason(whole)


def test_a_chunk_replaced_by_a_rename_is_seen_at_once(zarr_tensor, monkeypatch):
    """zarr-python (and tensorstore) write a chunk to a new file renamed over the old one: its
    folder's mtime changes, which every check compares, however long the window."""
    from tensor_server.adapters import _verified_extents

    monkeypatch.setattr(_verified_extents, "WINDOW_S", 3600.0)
    t, whole, store = zarr_tensor
    assert t.stale_reason(whole) is None
    zarr = pytest.importorskip("zarr")
    zarr.open_array(str(store), mode="r+")[1, 768:, 512:768] = NEW[1, 768:, 512:768]  # one chunk file
    assert "'c/1/3/2' changed" in t.stale_reason(whole)


def test_a_plan_right_after_an_in_place_rewrite_names_the_new_bytes(tmp_path, monkeypatch):
    """Plan time stats every file (``stale_reason(exact=True)``), whatever the window: a plan
    that trusted an extent verified before the rewrite would mint ids of the old version,
    which the first chunk read that stats its files refuses as stale, mid-``get_array``
    (CI saw it under load). Every chunk file is rewritten in place with valid new bytes."""
    from tensor_server.adapters import _verified_extents

    monkeypatch.setattr(_verified_extents, "WINDOW_S", 3600.0)
    root = tmp_path / "root"
    root.mkdir()
    _write_zarr(root / "img.zarr", OLD)
    _write_zarr(tmp_path / "new.zarr", NEW)
    _age_folders(root / "img.zarr")
    with serving(root, tmp_path / "cache") as (srv, cat):
        sid = cat.records()[0].source_id
        assert len(_plan(flight.FlightClient(srv.location), sid)) > 1  # the whole extent verified
        for src in (tmp_path / "new.zarr" / "c").rglob("*"):
            if src.is_file():
                dst = root / "img.zarr" / src.relative_to(tmp_path / "new.zarr")
                with open(dst, "r+b") as f:  # same inode, folder untouched
                    f.write(src.read_bytes())
                    f.truncate()
                _bump_mtime(dst)
        np.testing.assert_array_equal(client_for(srv).get_array(sid), NEW)


def test_a_store_being_written_is_checked_file_by_file(tmp_path, monkeypatch):
    """A folder modified within ``RACY_S`` of its stat could change again in the same clock
    tick unseen: no verification is remembered, so an in-place rewrite right after is seen."""
    from tensor_server.adapters import _verified_extents
    from tensor_server.adapters.registry import open_source
    from tensor_server.core.bounds import Bounds

    monkeypatch.setattr(_verified_extents, "WINDOW_S", 3600.0)
    monkeypatch.setattr(_verified_extents, "RACY_S", 3600.0)  # every folder counts as just written
    _write_zarr(tmp_path / "img.zarr", OLD[:2])
    src = open_source(tmp_path / "img.zarr")
    t = src.tensor()
    whole = Bounds.full(t.shape)
    assert t.stale_reason(whole) is None
    _rewrite_in_place(tmp_path / "img.zarr" / "c" / "0" / "0" / "1")
    assert "'c/0/0/1' changed" in t.stale_reason(whole)
    src.close()
