"""A live NDTiff acquisition through the real doors (issue 46): a writer process appends
images with the ndtiff package's own writer (time points of two channels, pixels then index
entry, as Micro-Manager writes them) while the SDK reads. Every frame read equals the one
written, the tensor grows in place (same content version) only by complete time points,
earlier frames stay cache hits, and the watch reports every growth in order. No timing
decides a result: waits are bounded only to prove "not frozen"."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.service.live_growth_test import PATIENCE, frames_seen
from tests.service.watch_test import assert_in_order_without_gaps, flight_watch, leave, records_until

pytest.importorskip("ndtiff")

#: writes time points 0 and 1, says "ready", then for each line read from stdin the time
#: points up to N ("go N") or the next image ("image"), each image's files unbuffered so its
#: pixels are on disk before its entry
WRITER = textwrap.dedent(
    """
    import io, sys
    import numpy as np
    from ndtiff import NDTiffDataset

    def image(t, c):
        return (np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) + 1000 * t + 7 * c).astype(np.uint16)

    ds = NDTiffDataset(sys.argv[1], name="live", writable=True, summary_metadata={"PixelSize_um": 0.5})

    def put(t, c):
        ds.put_image({"time": t, "channel": c}, image(t, c), {})
        if isinstance(ds._index_file, io.BufferedIOBase):  # unbuffered from the first image on
            ds._index_file.flush()
            ds._index_file = open(ds._index_file.name, "ab", buffering=0)
            f = ds.current_writer.file
            f.flush()
            ds.current_writer.file = open(f.name, "rb+", buffering=0)
            ds.current_writer.file.seek(f.tell())
        print(t, c, flush=True)

    images = ((t, c) for t in range(10**6) for c in range(2))
    for t, c in images:
        put(t, c)
        if (t, c) == (1, 1):
            break
    print("ready", ds.path, flush=True)
    for line in sys.stdin:
        if line.startswith("image"):
            put(*next(images))
            continue
        for t, c in images:
            put(t, c)
            if (t, c) == (int(line.split()[1]) - 1, 1):
                break
    ds.finish()
    """
)


def image(t: int, c: int) -> np.ndarray:
    return (np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) + 1000 * t + 7 * c).astype(np.uint16)


def start_writer(root):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready"):
            return proc
    raise AssertionError(f"the writer never got ready: {proc.wait(PATIENCE)}")


def go(proc, frames: int) -> None:
    assert proc.stdin is not None
    proc.stdin.write(f"go {frames}\n")
    proc.stdin.flush()


def test_every_time_point_read_while_written_equals_what_was_written(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    proc = start_writer(root)
    catalog = Catalog([root])
    catalog.scan()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(catalog, cache=cache) as served:
            array_id = catalog.records()[0].source_id
            client = served.client()
            described = client.get_descriptor(array_id)
            assert (tuple(described.shape), tuple(described.dim_labels)) == ((2, 2, 32, 48), ("t", "c", "y", "x"))
            np.testing.assert_array_equal(client.get_array(array_id)[1, 1], image(1, 1))
            hits = client.cache_stats()["hits"]
            watcher, results = flight_watch(served, {"array_id": array_id}, deadline=PATIENCE)
            go(proc, 12)
            records = records_until(results, 12)
            leave(watcher, results)
            for t in range(2, 12):
                assert frames_seen(client, array_id, t + 1) >= t + 1, f"time point {t} never showed up"
                got = client.get_array(array_id, (slice(t, t + 1), slice(None), slice(None), slice(None)))[0]
                np.testing.assert_array_equal(got, np.stack([image(t, 0), image(t, 1)]), err_msg=f"time point {t}")
            after = client.get_descriptor(array_id)
            assert (tuple(after.shape), after.content_version) == ((12, 2, 32, 48), described.content_version)
            assert records[0]["shape"] == [2, 2, 32, 48] and records[-1]["shape"] == [12, 2, 32, 48]
            assert_in_order_without_gaps(records, 0)
            fresh = served.client()  # frame 1 asked of the server again: a cache hit across growth
            np.testing.assert_array_equal(
                fresh.get_array(array_id, (slice(1, 2), slice(None), slice(None), slice(None)))[0, 1], image(1, 1)
            )
            assert fresh.cache_stats()["hits"] > hits
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(PATIENCE)
        cache.close()


def test_a_time_point_is_published_only_once_all_its_channels_are_written(tmp_path):
    """The adapter alone: after channel 0 of time point 2, the extent stays 2 (channel 1 of
    it would read as zeros); after channel 1, it is 3."""
    from tensor_server.adapters.ndtiff import NdTiffSource

    root = tmp_path / "root"
    root.mkdir()
    proc = start_writer(root)
    try:
        folder = next(root.iterdir())
        tensor = NdTiffSource(folder).tensor()
        assert tensor.shape == (2, 2, 32, 48)
        assert proc.stdin is not None and proc.stdout is not None
        seen = []
        for _ in range(2):
            proc.stdin.write("image\n")
            proc.stdin.flush()
            t, c = map(int, proc.stdout.readline().split())
            assert tensor.refresh_extent() is None
            seen.append((t, c, tensor.shape[0]))
        assert seen == [(2, 0, 2), (2, 1, 3)]
        np.testing.assert_array_equal(tensor.get_data()[2], np.stack([image(2, 0), image(2, 1)]))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(PATIENCE)


def test_a_writer_killed_mid_acquisition_leaves_what_it_wrote_served(tmp_path):
    """SIGKILL while images are being put, then a torn index entry (a kill inside its write):
    the server serves the complete time points the index lists, in place."""
    from tensor_server.adapters.ndtiff import INDEX_NAME, read_ndtiff_index

    root = tmp_path / "root"
    root.mkdir()
    proc = start_writer(root)
    catalog = Catalog([root])
    catalog.scan()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(catalog, cache=cache) as served:
            array_id = catalog.records()[0].source_id
            client = served.client()
            version = client.get_descriptor(array_id).content_version
            go(proc, 10**6)
            assert proc.stdout is not None
            for line in proc.stdout:
                if int(line.split()[0]) >= 6:
                    break
            proc.send_signal(signal.SIGKILL)
            proc.wait(PATIENCE)
            index = next(root.iterdir()) / INDEX_NAME
            with open(index, "ab") as fh:
                fh.write(b"\x1c\x00\x00\x00" + b'{"time": 99, "chan')
            entries, torn = read_ndtiff_index(index)
            assert torn
            written = {(e[0]["time"], e[0].get("channel", 0)) for e in entries}
            complete = next(t for t in range(10**6) if not {(t, 0), (t, 1)} <= written)
            assert complete >= 6  # time point 6 was begun
            assert frames_seen(client, array_id, complete) == complete
            want = np.stack([np.stack([image(t, 0), image(t, 1)]) for t in range(complete)])
            np.testing.assert_array_equal(client.get_array(array_id), want)
            assert client.get_descriptor(array_id).content_version == version
    finally:
        cache.close()
