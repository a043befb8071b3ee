"""A live OME-TIFF acquisition through the real doors (issue 46): a writer process appends
time points with ome-writers (its tifffile backend: one contiguous series whose OME-XML says
one time point until the file is closed) while the SDK reads. Every frame read equals the
one written, the tensor grows in place (same content version), earlier frames stay cache
hits, the watch reports every growth in order, the close keeps the shape and the content
version, a restarted acquisition is a new content version, and a writer killed mid-frame
leaves what it wrote served. No timing decides a result: waits are bounded only to prove
"not frozen"."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import numpy as np
import pytest

from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core.downsample import downsample_block
from tensor_server.testing import serving
from tests.service.live_growth_test import PATIENCE, frames_seen
from tests.service.watch_test import assert_in_order_without_gaps, flight_watch, leave, records_until

pytest.importorskip("ome_writers")

#: a computed level: 1/2 along T, 1/4 along y and x
COARSE = (2, 1, 4, 4)

#: writes time points 0 and 1 of two channels, says "ready", then for each line read from
#: stdin the time points up to N ("go N"), a close ("close"), or time points without end
#: ("run"); a time point is said ("t") once its planes are on disk (the backend's thread
#: writes them behind ``append``)
WRITER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np, tifffile
    from ome_writers import AcquisitionSettings, create_stream, dims_from_standard_axes

    path, dtype, compression = sys.argv[1], sys.argv[2], sys.argv[3]

    def image(t, c):
        return (np.arange(64 * 96).reshape(64, 96) + 1000 * t + 7 * c).astype(dtype)

    dims = dims_from_standard_axes({"t": None, "c": 2, "y": 64, "x": 96})
    settings = AcquisitionSettings(
        root_path=path, dimensions=dims, dtype=dtype, overwrite=True, compression=compression
    )
    stream = create_stream(settings)
    plane = 64 * 96 * np.dtype(dtype).itemsize

    def on_disk(planes):
        try:
            with tifffile.TiffFile(path) as tf:
                if compression != "none":  # an IFD a plane, written after its strips
                    return len(tf.pages) >= planes
                return os.path.getsize(path) >= tf.pages.first.dataoffsets[0] + planes * plane
        except Exception:  # not written far enough to parse
            return False

    def put(t):
        for c in range(2):
            stream.append(image(t, c))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not on_disk(2 * (t + 1)):
            time.sleep(0.002)
        print(t, flush=True)

    put(0)
    put(1)
    print("ready", flush=True)
    t = 2
    for line in sys.stdin:
        if line.startswith("close"):
            break
        stop = 10**9 if line.startswith("run") else int(line.split()[1])
        while t < stop:
            put(t)
            t += 1
    stream.close()
    print("closed", flush=True)
    """
)


def image(t: int, c: int, dtype=np.uint16) -> np.ndarray:
    return (np.arange(64 * 96).reshape(64, 96) + 1000 * t + 7 * c).astype(dtype)


def start_writer(path, dtype: str = "uint16", compression: str = "none") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), dtype, compression],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready"):
            return proc
    raise AssertionError(f"the writer never got ready: {proc.wait(PATIENCE)}")


def say(proc, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def until(proc, word: str) -> str:
    """The writer's lines up to ``word`` (the last one read)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == word:
            return line
    raise AssertionError(f"the writer ended before {word!r}: {proc.wait(PATIENCE)}")


@contextmanager
def live_ome_tiff(tmp_path, compression: str = "none"):
    """(served, array id, writer process, file) of an acquisition at two time points."""
    root = tmp_path / "root"
    root.mkdir()
    path = root / "live.ome.tif"
    proc = start_writer(path, compression=compression)
    catalog = Catalog([root])
    catalog.scan()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(catalog, cache=cache) as served:
            yield served, catalog.records()[0].source_id, proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(PATIENCE)
        cache.close()


def coarse(served, array_id: str) -> np.ndarray:
    """A computed level (1/2 T, 1/4 y and x), every chunk asked of the server."""
    client = served.client()
    client.cache_clear()
    return client.get_array(array_id, scale_hint=list(COARSE), reduction_method="area")


def time_point(client, array_id: str, t: int) -> np.ndarray:
    return client.get_array(array_id, (slice(t, t + 1), slice(None), slice(None), slice(None)))[0]


@pytest.mark.parametrize("compression", ["none", "lzw"])  # contiguous planes; an IFD a plane
def test_every_time_point_read_while_written_equals_what_was_written_and_the_close_keeps_it(tmp_path, compression):
    with live_ome_tiff(tmp_path, compression) as (served, array_id, proc, path):
        client = served.client()
        described = client.get_descriptor(array_id)
        assert (tuple(described.shape), tuple(described.dim_labels)) == ((2, 2, 64, 96), ("t", "c", "y", "x"))
        np.testing.assert_array_equal(time_point(client, array_id, 0), np.stack([image(0, 0), image(0, 1)]))
        hits = client.cache_stats()["hits"]
        watcher, results = flight_watch(served, {"array_id": array_id}, deadline=PATIENCE)
        say(proc, "go 12")
        records = records_until(results, 12)
        leave(watcher, results)
        for t in range(2, 12):
            assert frames_seen(client, array_id, t + 1) >= t + 1, f"time point {t} never showed up"
            np.testing.assert_array_equal(
                time_point(client, array_id, t), np.stack([image(t, 0), image(t, 1)]), err_msg=f"time point {t}"
            )
        assert records[0]["shape"] == [2, 2, 64, 96] and records[-1]["shape"] == [12, 2, 64, 96]
        assert_in_order_without_gaps(records, 0)
        fresh = served.client()  # time point 0 asked of the server again: a cache hit across growth
        np.testing.assert_array_equal(time_point(fresh, array_id, 0)[1], image(0, 1))
        assert fresh.cache_stats()["hits"] > hits
        want = np.stack([np.stack([image(t, 0), image(t, 1)]) for t in range(12)])
        np.testing.assert_array_equal(coarse(served, array_id), downsample_block(want, COARSE, "area"))

        say(proc, "close")  # ome-writers appends the IFDs and rewrites the OME-XML
        until(proc, "closed")
        assert proc.wait(PATIENCE) == 0
        after = client.get_descriptor(array_id)
        assert (tuple(after.shape), after.content_version) == ((12, 2, 64, 96), described.content_version)
        np.testing.assert_array_equal(client.get_array(array_id), want)
        np.testing.assert_array_equal(coarse(served, array_id), downsample_block(want, COARSE, "area"))
        from tensor_server.adapters.ome_tiff import OmeTiffSource

        reopened = OmeTiffSource(path).tensor()  # the closed file, as a later scan opens it
        assert (reopened.shape, reopened.dim_labels) == ((12, 2, 64, 96), ("t", "c", "y", "x"))
        np.testing.assert_array_equal(reopened.get_data(), want)


def test_a_restarted_acquisition_is_a_new_content_version(tmp_path):
    with live_ome_tiff(tmp_path) as (served, array_id, proc, path):
        client = served.client()
        before = client.get_descriptor(array_id)
        say(proc, "close")
        assert proc.wait(PATIENCE) == 0
        again = start_writer(path, "uint8")  # overwrite: the file is replaced
        try:
            after = client.get_descriptor(array_id)
            assert after.content_version != before.content_version
            assert (tuple(after.shape), after.dtype) == ((2, 2, 64, 96), "|u1")
            np.testing.assert_array_equal(time_point(client, array_id, 1)[0], image(1, 0, np.uint8))
        finally:
            again.kill()
            again.wait(PATIENCE)


def test_a_writer_killed_mid_frame_leaves_what_it_wrote_served(tmp_path):
    with live_ome_tiff(tmp_path) as (served, array_id, proc, path):
        client = served.client()
        version = client.get_descriptor(array_id).content_version
        say(proc, "run")
        until(proc, "6")
        proc.send_signal(signal.SIGKILL)
        proc.wait(PATIENCE)
        with open(path, "ab") as fh:  # the torn frame a kill inside a write leaves
            fh.write(image(99, 0).tobytes()[:5000])
        size = path.stat().st_size
        tensor = served.runtime.catalog.find_tensor(array_id)[0]
        layout = getattr(tensor, "inner", tensor).layout  # whole time points of whole planes
        written = (size - layout.data_offset) // layout.plane_bytes // 2
        assert written >= 7
        assert frames_seen(client, array_id, written) == written
        got = client.get_array(array_id)
        np.testing.assert_array_equal(got, np.stack([np.stack([image(t, 0), image(t, 1)]) for t in range(written)]))
        assert client.get_descriptor(array_id).content_version == version


def test_a_watch_follows_a_restarted_acquisition_by_its_file_system_events(tmp_path, monkeypatch):
    """ome-writers' overwrite unlinks the file and writes a new one under its name: the event
    watcher, which watched the old inode, begins again over the new file once the source is
    reopened. The fallback look is an hour away, so the new acquisition's growth reaches the
    watch only from its events."""
    from tensor_server.service import watch

    pytest.importorskip("watchfiles")
    monkeypatch.setattr(watch, "FALLBACK_TICK", 3600.0)
    with live_ome_tiff(tmp_path) as (served, array_id, proc, path):
        client = served.client()
        before = client.get_descriptor(array_id).content_version
        watcher, results = flight_watch(served, {"array_id": array_id}, deadline=PATIENCE)
        say(proc, "close")
        assert proc.wait(PATIENCE) == 0
        again = start_writer(path)
        try:
            assert client.get_descriptor(array_id).content_version != before  # reopened: the new file
            say(again, "go 6")
            records = records_until(results, 6)
            leave(watcher, results)
            assert records[-1]["shape"] == [6, 2, 64, 96]
            assert [r["sequence"] for r in records] == list(range(len(records)))  # the reopen is one
            assert served.runtime.watches._events, "the event watcher never failed over to polling"
            np.testing.assert_array_equal(time_point(client, array_id, 5)[1], image(5, 1))
        finally:
            again.kill()
            again.wait(PATIENCE)
