"""A live acquisition through the real doors (issue 46): a writer process appends frames to a
zarr array (zarr-python: resize, then write) while the SDK and the HTTP OME-Zarr view read it.
Every frame read equals the one written, chunks of earlier frames stay cache hits across
growth (``cache_stats``), and a writer killed with SIGKILL leaves the server serving what is
on disk. No timing decides a result: waits are bounded only to prove "not frozen"."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
import zarr

from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

#: not frozen: a wait for the server to see a frame never takes this long
PATIENCE = 30.0

WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np, zarr
    path, first, last, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    z = zarr.open_array(path, mode="r+")
    for i in range(first, last):
        z.resize((i + 1,) + z.shape[1:])
        z[i] = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) + 100 * (i + 1)).astype(np.uint16)
        print(i, flush=True)
        time.sleep(pause)
    print("done", flush=True)
    time.sleep(3600 if pause < 0 else 0)
    """
)


def frame(i: int) -> np.ndarray:
    return (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) + 100 * (i + 1)).astype(np.uint16)


def start_array(path, fmt: int, frames: int = 2):
    z = zarr.create_array(str(path), shape=(frames, 32, 32), chunks=(1, 16, 16), dtype="uint16", zarr_format=fmt)
    for i in range(frames):
        z[i] = frame(i)


@contextmanager
def live_server(tmp_path, fmt: int):
    root = tmp_path / "root"
    root.mkdir()
    start_array(root / "live.zarr", fmt)
    catalog = Catalog([root])
    catalog.scan()
    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(catalog, cache=cache, http=True) as served:
            yield served, catalog.records()[0].source_id, root / "live.zarr"
    finally:
        cache.close()


def writer(path, first: int, last: int, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(first), str(last), str(pause)],
        stdout=subprocess.PIPE,
        text=True,
    )


def frames_seen(client, array_id: str, at_least: int) -> int:
    """The T extent the server describes, once it reaches ``at_least``."""
    deadline = time.monotonic() + PATIENCE
    while True:
        n = client.get_descriptor(array_id).shape[0]
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.005)


@pytest.mark.parametrize("fmt", [2, 3])
def test_every_frame_read_while_written_equals_what_was_written(tmp_path, fmt):
    with live_server(tmp_path, fmt) as (served, array_id, path):
        client = served.client()
        assert client.get_descriptor(array_id).shape[0] == 2
        np.testing.assert_array_equal(client.get_array(array_id, (slice(0, 1), slice(None), slice(None)))[0], frame(0))
        hits = client.cache_stats()["hits"]
        version = client.get_descriptor(array_id).content_version
        proc = writer(path, 2, 12)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "done":
                break
            i = int(line)
            assert frames_seen(client, array_id, i + 1) >= i + 1, f"frame {i} never showed up"
            got = client.get_array(array_id, (slice(i, i + 1), slice(None), slice(None)))[0]
            np.testing.assert_array_equal(got, frame(i), err_msg=f"frame {i}")
        assert proc.wait(PATIENCE) == 0
        described = client.get_descriptor(array_id)
        assert (tuple(described.shape), described.content_version) == ((12, 32, 32), version), "grown in place"
        fresh = served.client()
        fresh.cache_clear()  # the SDK's chunk copies are shared by its clients: frame 0 is asked of the server
        np.testing.assert_array_equal(fresh.get_array(array_id, (slice(0, 1), slice(None), slice(None)))[0], frame(0))
        assert fresh.cache_stats()["hits"] > hits, "frame 0's chunks are cache hits across growth"
        np.testing.assert_array_equal(fresh.get_array(array_id), np.stack([frame(i) for i in range(12)]))


def test_the_descriptor_carries_the_extent_and_its_sequence(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        client = served.client()
        before = client.get_descriptor(array_id, with_metadata=True)
        assert json.loads(before.metadata_json)["sequence"] == 0
        assert json.loads(before.metadata_json)["type"] == "zarr", "the wrapper's keys are kept"
        assert writer(path, 2, 4).wait(PATIENCE) == 0
        after = client.get_descriptor(array_id, with_metadata=True)
        sequence = json.loads(after.metadata_json)["sequence"]
        assert after.shape[0] == 4 and sequence >= 1
        assert served.runtime.catalog.find_tensor(array_id)[0].extents.shape[0] == 4
        assert sequence == served.runtime.catalog.find_tensor(array_id)[0].extents.sequence


def test_the_ome_zarr_view_answers_the_current_shape(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        url = f"{served.http_url}/zarr/{array_id}/0/.zarray"
        first = httpx.get(url)
        assert first.json()["shape"] == [2, 32, 32] and first.headers["cache-control"] == "no-cache"
        assert writer(path, 2, 5).wait(PATIENCE) == 0
        again = httpx.get(url, headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 200, "the grown tensor's metadata is not the revalidated old one"
        assert again.json()["shape"] == [5, 32, 32] and again.headers["cache-control"] == "no-cache"
        grid = again.json()["chunks"]
        chunk = httpx.get(f"{served.http_url}/zarr/{array_id}/0/{4 // grid[0]}.0.0")
        pixels = np.frombuffer(chunk.content, np.uint16).reshape(grid)[4 % grid[0]]
        np.testing.assert_array_equal(pixels, frame(4)[: grid[1], : grid[2]])


def test_a_writer_killed_mid_acquisition_leaves_what_it_wrote_served(tmp_path):
    with live_server(tmp_path, 2) as (served, array_id, path):
        client = served.client()
        proc = writer(path, 2, 10_000, pause=0.001)
        assert proc.stdout is not None
        for line in proc.stdout:
            if int(line) >= 20:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(PATIENCE)
        on_disk = zarr.open_array(str(path), mode="r")
        # the last resize may be ahead of its frame; the metadata is believed once it settles
        n = frames_seen(client, array_id, on_disk.shape[0])
        assert n == on_disk.shape[0] >= 21
        np.testing.assert_array_equal(client.get_array(array_id), on_disk[:])
        for i in range(21):
            np.testing.assert_array_equal(on_disk[i], frame(i))


def test_a_writer_restarting_the_array_is_a_new_content_version(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        client = served.client()
        before = client.get_descriptor(array_id)
        z = zarr.create_array(str(path), shape=(3, 32, 32), chunks=(1, 16, 16), dtype="uint8", overwrite=True)
        z[:] = 7
        after = client.get_descriptor(array_id)
        assert after.content_version != before.content_version
        assert (tuple(after.shape), after.dtype) == ((3, 32, 32), "|u1")
        np.testing.assert_array_equal(client.get_array(array_id), np.full((3, 32, 32), 7, np.uint8))
