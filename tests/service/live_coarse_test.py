"""A computed coarse level of a growing zarr array read through the real doors while a writer
process appends frames (issue 46: "a coarse level read during the acquisition and after it
equals the reduction of the final data once complete"). A coarse chunk reaching the newest
frame is served from the files but never cached (``ReadEngine.settled``), so no reduction of
frames not yet written outlives them; chunks of earlier frames are cached. No timing decides
a result: waits are bounded only to prove "not frozen"."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from tensor_server.core.downsample import downsample_block
from tensor_server.core.plan import plan_read
from tests.service.live_growth_test import PATIENCE, frame, frames_seen, live_server

#: 1/2 along T, 1/4 along y and x: a coarse chunk covers two frames
SCALE = (2, 4, 4)
METHOD = "area"
FRAMES = 16

#: appends frame i (resize, then write) for each "frame" line, or every frame up to N, one
#: each P seconds, for a "run N P" line, printing i once it is written
WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np, zarr
    z = zarr.open_array(sys.argv[1], mode="r+")

    def put(i):
        z.resize((i + 1,) + z.shape[1:])
        z[i] = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) + 100 * (i + 1)).astype(np.uint16)
        print(i, flush=True)

    i = z.shape[0]
    for line in sys.stdin:
        stop = int(line.split()[1]) if line.startswith("run") else i + 1
        while i < stop:
            put(i)
            i += 1
            time.sleep(float(line.split()[2]) if line.startswith("run") else 0)
    """
)


def reduction(frames: int) -> np.ndarray:
    """The coarse level of the array's first ``frames`` frames, by the engine's oracle."""
    return downsample_block(np.stack([frame(i) for i in range(frames)]), SCALE, METHOD)


def coarse(served, array_id: str) -> np.ndarray:
    """The coarse level through the SDK, every chunk asked of the server (the SDK's copies
    of earlier reads, shared by its clients of one server, dropped first)."""
    client = served.client()
    client.cache_clear()
    return client.get_array(array_id, scale_hint=list(SCALE), reduction_method=METHOD)


def tell(proc, line: str) -> int:
    """Send ``line``; the index of the last frame the writer then wrote."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    stop = int(line.split()[1]) - 1 if line.startswith("run") else None
    while True:
        i = int(proc.stdout.readline())
        if stop is None or i >= stop:
            return i


def test_a_coarse_level_read_during_and_after_the_acquisition_equals_the_reduction_of_the_final_data(tmp_path):
    with live_server(tmp_path, 3) as (served, array_id, path):
        cache = served.runtime.engine.store
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        client = served.client()
        planned = {}  # every coarse chunk id a read during the acquisition asked for: (bounds, extent)
        try:
            for _ in range(5):  # lockstep: the extent of each read is known
                n = tell(proc, "frame") + 1
                assert frames_seen(client, array_id, n) == n
                np.testing.assert_array_equal(coarse(served, array_id), reduction(n), err_msg=f"{n} frames")
                tensor = served.runtime.catalog.find_tensor(array_id)[0]
                chunks = plan_read(tensor, None, SCALE, METHOD).chunks
                planned.update((pc.chunk_id.encode(), (pc.chunk_id.bounds, n)) for pc in chunks)
                for pc in chunks:
                    at_edge = pc.chunk_id.bounds.stop[0] == n
                    assert cache.contains_all([pc.chunk_id.encode()]) == (not at_edge), (n, pc.chunk_id.bounds)
            proc.stdin.write(f"run {FRAMES} 0.02\n")  # free-running: reads race the writer
            proc.stdin.flush()
            reads = 0
            while (n := client.get_descriptor(array_id).shape[0]) < FRAMES or reads < 3:
                reads += 1
                got = coarse(served, array_id)
                # planned at n frames or at one of the frames since: a whole reduction of one extent
                extents = [m for m in range(n, FRAMES + 1) if -(-m // SCALE[0]) == got.shape[0]]
                assert any(np.array_equal(got, reduction(m)) for m in extents), f"no extent in {extents} reads {n}"
                tensor = served.runtime.catalog.find_tensor(array_id)[0]
                m = tensor.shape[0]
                planned.update(
                    (pc.chunk_id.encode(), (pc.chunk_id.bounds, m))
                    for pc in plan_read(tensor, None, SCALE, METHOD).chunks
                )
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            assert proc.wait(PATIENCE) == 0
        assert frames_seen(client, array_id, FRAMES) == FRAMES
        final = np.stack([frame(i) for i in range(FRAMES)])
        np.testing.assert_array_equal(coarse(served, array_id), reduction(FRAMES))
        assert any(b.stop[0] == n < FRAMES for b, n in planned.values()), "some chunk read reached the newest frame"
        for key, (bounds, _) in planned.items():  # what the cache kept of those reads is final
            kept = cache.get(key)
            if kept is not None:
                want = downsample_block(final[bounds.to_slices()], SCALE, METHOD)
                np.testing.assert_array_equal(kept, want, err_msg=f"cached {bounds}")
