"""``python -m tensor_server.bench live``: frame-to-client latency of a live acquisition (issue 46).

A writer process appends ``side``² uint16 frames to a zarr v3 array at ``--rates`` frames a
second and records the wall-clock time each write returned (its side channel: a queue read
after the run). It writes as acquisition software does (acquire-zarr: uncompressed, a chunk
per frame): zarr-python, resize along T then write the frame, uncompressed, one chunk per
frame (``--chunk`` smaller splits it), and ``write_empty_chunks`` on: zarr-python's default
compares every chunk with the fill value before writing it, which cost 15 of its 21 ms a
2048² frame here (2026-12-05, loaded: 5.3 ms with it off, ``np.save`` of the same frame
2 ms). Alone it then writes 110-170 frames/s into pages just freed, but a run's new files
need the kernel to reclaim page cache for every 8 MiB: 33-48 frames/s for 300 new frames
(``np.save`` 80), and the server's chunk cache writes each frame it serves once more
(docs/performance.md, "Live acquisition"). So the bench first has the writer write
``FLOOR_FRAMES`` new frames alone, as fast as it can: the floor of this machine, in the
table beside each rate. A writer that cannot keep the asked rate writes as fast as it can:
the table gives the rate it reached and a line saying so, and the latencies are those at
that rate. The acquisitions start once the server is idle after its start-up (its kernels'
warm-up took a core from the first rate's run), and each rate's first frame is written
``LEAD_S`` after the writer, the poller and the SDK client all said they are ready (a fixed
5 s lead before: 10 of a test run's 16 s, and no promise under load).

Two clients follow it in the same run, and both read as a viewer does, the **newest** frame
they know of: a client that is still reading when several frames arrive skips to the newest
(reading every frame would measure a backlog no viewer builds), so the latencies are those
of the frames it read and the table says how many of the written frames that was; a client
that keeps up reads every frame.

* ``sdk watch``: the server (a process of its own, ``bench/server_process.py``) is watched
  through the Flight action ``watch``; the newest frame announced is read with the biopb
  SDK's ``get_array`` (bounded slices, as a viewer that knows the frame's shape from the
  record: an open-ended slice costs the SDK a catalog query a read), and the time it
  arrived is taken;
* ``zarr poll``: a process that polls zarr-python directly every ``POLL_S`` (shrimPy's way:
  reopen the array, read the newest frame past the last one it had).

A frame counts as read once its pixels are the writer's: each frame carries its number in two
corner pixels, so a read of the fill value (zarr-python resizes before it writes, and a
poller can read the frame in between) does not count and the frame is read again. Latency of
frame i = the client's time it had frame i - the writer's time its write of frame i returned;
p50, p99 and max per rate and client. Targets (issue 46): p50 ≤ 200 ms, p99 ≤ 500 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["add_arguments", "main", "measure", "rows_of"]

#: the peer's poll period (shrimPy's viewer)
POLL_S = 0.1
#: the issue's targets (ms)
TARGETS = {"p50": 200.0, "p99": 500.0}
#: frames the writer writes alone before the run (its floor)
FLOOR_FRAMES = 100
#: not frozen: a client that has not had a new frame for this long gives up
PATIENCE_S = 60.0
#: seconds from every process of a rate being ready to its first frame's write
LEAD_S = 0.2


def stamp(frame: np.ndarray, i: int) -> np.ndarray:
    """``frame`` made frame ``i`` in place: ``i + 1`` in its first and last pixels (never the
    fill value). In place: a copy of the 8 MiB frame cost the writer 3 ms a frame."""
    frame[0, 0] = frame[-1, -1] = i + 1
    return frame


def is_frame(pixels: np.ndarray, i: int) -> bool:
    return int(pixels[0, 0]) == int(pixels[-1, -1]) == i + 1


#: zarr-python as the writer: every chunk written, no comparison with the fill value first
WRITER_CONFIG = {"write_empty_chunks": True}


def start_array(path: Path, side: int, chunk: int) -> None:
    """The acquisition's array at its first frame (the server opens it before the run)."""
    import zarr

    z = zarr.create_array(
        str(path),
        shape=(1, side, side),
        chunks=(1, chunk, chunk),
        dtype="uint16",
        compressors=None,
        fill_value=0,
        config=WRITER_CONFIG,
    )
    z[0] = stamp(np.zeros((side, side), np.uint16), 0)


def _write(path: str, frames: int, rate: float, ready: Any, go: Any, out: Any) -> None:
    """The writer process: says ``ready`` once set up, is sent ``start`` on ``go``, and writes
    frame i at ``start + i / rate`` (or as soon as it can)."""
    import zarr

    z = zarr.open_array(path, mode="r+", config=WRITER_CONFIG)
    frame = np.random.default_rng(0).integers(0, 4000, z.shape[1:], dtype=np.uint16)
    ready.put("writer")
    start = go.get(timeout=PATIENCE_S)
    written = {}
    for i in range(1, frames):
        time.sleep(max(0.0, start + i / rate - time.time()))
        z.resize((i + 1, *z.shape[1:]))
        z[i] = stamp(frame, i)
        written[i] = time.time()
    out.put(written)


def _poll(path: str, frames: int, ready: Any, go: Any, out: Any) -> None:
    """The peer process: from ``start`` (sent on ``go`` after it said ``ready``) reopen the
    array with zarr-python every ``POLL_S`` and read the newest frame past the last one it had
    (module docstring)."""
    import zarr

    zarr.open_array(path, mode="r")  # imported and opened once before the clock starts
    ready.put("poller")
    start = go.get(timeout=PATIENCE_S)
    arrived: dict[int, float] = {}
    last = 0
    deadline = time.time() + PATIENCE_S
    time.sleep(max(0.0, start - time.time()))
    while last < frames - 1 and time.time() < deadline:
        z = zarr.open_array(path, mode="r")
        for i in range(z.shape[0] - 1, last, -1):  # the newest written: a frame resized but
            if is_frame(z[i], i):  # not written yet reads as the fill value
                arrived[i] = time.time()
                last = i
                deadline = arrived[i] + PATIENCE_S
                break
        time.sleep(POLL_S)
    out.put(arrived)


def _watch(
    location: str, array_id: str, frames: int, side: int, ready: Callable[[], None] = lambda: None
) -> tuple[dict[int, float], dict[int, float]]:
    """The SDK client: the Flight ``watch`` stream is followed while a reader thread reads the
    newest frame announced (module docstring); when each frame it read was read, and when the
    record announcing each frame arrived. ``ready`` is called once it reads frame 0 and watches."""
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(location)
    client.get_array(array_id, _plane(0, side))  # as a viewer showing frame 0 has
    watcher = flight.FlightClient(location)
    results = watcher.do_action(flight.Action("watch", json.dumps({"array_id": array_id}).encode()))
    ready()
    noticed: dict[int, float] = {}
    arrived: dict[int, float] = {}
    newest = threading.Condition()
    reader = threading.Thread(target=_read_newest, args=(client, array_id, frames, side, noticed, arrived, newest))
    reader.start()
    try:
        for result in results:
            extent, now = json.loads(result.body.to_pybytes())["shape"][0], time.time()
            with newest:
                noticed.update({i: now for i in range(1, extent) if i not in noticed})
                newest.notify()
            if extent >= frames:
                break
    finally:
        watcher.close()
        reader.join(PATIENCE_S)
    if frames - 1 not in arrived:
        raise RuntimeError(f"the SDK client never read the last frame ({len(arrived)} of {frames - 1} read)")
    return arrived, noticed


def _plane(i: int, side: int) -> tuple[slice, ...]:
    """Frame ``i``'s region, bounded: an open-ended slice costs the SDK a catalog query a read."""
    return (slice(i, i + 1), slice(0, side), slice(0, side))


def _read_newest(
    client: Any,
    array_id: str,
    frames: int,
    side: int,
    noticed: dict[int, float],
    arrived: dict[int, float],
    newest: threading.Condition,
) -> None:
    """Read the newest frame announced, each time there is one past the last read."""
    last = 0
    while last < frames - 1:
        with newest:
            if not newest.wait_for(lambda: len(noticed) > last, PATIENCE_S):
                return
            last = len(noticed)  # frames 1..len(noticed) are announced
        if not is_frame(client.get_array(array_id, _plane(last, side))[0], last):
            raise RuntimeError(f"frame {last} was served before it was written")
        arrived[last] = time.time()


def _array_id(location: str, name: str) -> str:
    from biopb.tensor import TensorFlightClient

    for row in TensorFlightClient(location).query("SELECT source_url, tensors FROM sources").to_pylist():
        if row["source_url"].endswith("/" + name):
            return str(row["tensors"][0]["array_id"])
    raise RuntimeError(f"the catalog lists no {name}")


def _latencies(written: dict[int, float], arrived: dict[int, float]) -> dict[int, float]:
    """ms from each frame's write to its arrival, for the frames that arrived."""
    return {i: (arrived[i] - t) * 1e3 for i, t in sorted(written.items()) if i in arrived}


def _one_rate(srv: Any, path: Path, rate: float, frames: int, side: int) -> dict[str, Any]:
    """Writer, zarr poller and SDK watcher over one acquisition at ``rate`` frames/s."""
    spawn = multiprocessing.get_context("spawn")
    written_q, polled_q, ready_q, go_q = spawn.Queue(), spawn.Queue(), spawn.Queue(), spawn.Queue()
    writer = spawn.Process(target=_write, args=(str(path), frames, rate, ready_q, go_q, written_q))
    poller = spawn.Process(target=_poll, args=(str(path), frames, ready_q, go_q, polled_q))
    writer.start()
    poller.start()

    def go() -> None:  # the SDK client is ready: once both processes are too, start the clock
        for _ in (writer, poller):
            ready_q.get(timeout=PATIENCE_S)
        start = time.time() + LEAD_S
        for _ in (writer, poller):
            go_q.put(start)

    try:
        watched, noticed = _watch(srv.location, _array_id(srv.location, path.name), frames, side, go)
        written, polled = written_q.get(timeout=PATIENCE_S), polled_q.get(timeout=PATIENCE_S)
    finally:
        for proc in (writer, poller):
            proc.join(PATIENCE_S)
            if proc.is_alive():
                proc.kill()
    span = max(written.values()) - min(written.values())
    return {
        "rate": rate,
        "frames": frames - 1,
        "achieved_fps": (len(written) - 1) / span if span > 0 else float("nan"),
        "sdk watch": _latencies(written, watched),
        "zarr poll": _latencies(written, polled),
        "noticed": _latencies(written, noticed),
    }


def measure(work: Path, rates: list[float], seconds: float, side: int, chunk: int = 0) -> list[dict[str, Any]]:
    """One acquisition per rate (``seconds`` long, at least 5 frames), all served by one server;
    ``chunk``: the chunks' side (0: a chunk per frame)."""
    from tensor_server.bench.server_process import server_process, wait_idle

    chunk = chunk or side
    root = work / "root"
    root.mkdir()
    plan = {rate: max(5, int(rate * seconds)) + 1 for rate in rates}
    alone = writer_alone(work / "alone.zarr", side, chunk, min(max(plan.values()), FLOOR_FRAMES))
    for rate in rates:
        start_array(root / f"live-{rate:g}fps.zarr", side, chunk)
    with server_process([root], work / "cache") as srv:
        wait_idle(srv.pid)  # the kernels' warm-up after the first scan took a core from the first rate
        results = [_one_rate(srv, root / f"live-{rate:g}fps.zarr", rate, frames, side) for rate, frames in plan.items()]
    return [{**r, "writer_alone_fps": alone} for r in results]


def writer_alone(path: Path, side: int, chunk: int, frames: int) -> float:
    """Frames a second the bench's writer reaches as fast as it can with nothing else of the
    bench running (new files, as in the run): the floor the rates asked are held against.
    The array is deleted after."""
    import shutil

    start_array(path, side, chunk)
    spawn = multiprocessing.get_context("spawn")
    ready, go, out = spawn.Queue(), spawn.Queue(), spawn.Queue()
    proc = spawn.Process(target=_write, args=(str(path), frames, math.inf, ready, go, out))
    proc.start()
    try:
        ready.get(timeout=PATIENCE_S)
        go.put(time.time())
        written = out.get(timeout=PATIENCE_S)
    finally:
        proc.join(PATIENCE_S)
        shutil.rmtree(path)
    times = sorted(written.values())
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else math.nan


def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        for who in ("sdk watch", "zarr poll"):
            ms = sorted(result[who].values())
            p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))] if ms else float("nan")
            noticed = (
                statistics.median(result["noticed"].values()) if who == "sdk watch" and result["noticed"] else None
            )
            rows.append(
                {
                    "rate": f"{result['rate']:g} fps ({result['achieved_fps']:.0f}; alone {result['writer_alone_fps']:.0f})",
                    "client": who,
                    "frames": f"{len(ms)}/{result['frames']}",
                    "p50_ms": statistics.median(ms) if ms else float("nan"),
                    "p99_ms": p99,
                    "max_ms": ms[-1] if ms else float("nan"),
                    "noticed_p50_ms": "" if noticed is None else round(noticed, 1),
                    "target": f"p50 <= {TARGETS['p50']:g}, p99 <= {TARGETS['p99']:g}" if who == "sdk watch" else "peer",
                }
            )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default="10,100", help="frames a second, comma-separated (default 10,100)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each acquisition (default 5)")
    parser.add_argument("--side", type=int, default=2048, help="frame side in pixels (default 2048)")
    parser.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="chunk side in pixels (default 0: a chunk per frame, as acquire-zarr writes)",
    )
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(ns: argparse.Namespace) -> int:
    load = os.getloadavg()
    rates = [float(r) for r in ns.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="ts-bench-live-") as work:
        results = measure(Path(work), rates, ns.seconds, ns.side, ns.chunk)
    rows = rows_of(results)
    chunk = ns.chunk or ns.side
    print(
        f"{ns.side}² uint16 frames, zarr v3 chunks 1x{chunk}², uncompressed, {ns.seconds:g} s per rate "
        f"(the rate the writer reached in brackets, and alone before the run); load average before the run {load[0]:.1f} "
        f"({os.cpu_count()} cores); the clients read the newest frame (frames: read/written)"
    )
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    for result in results:
        if result["achieved_fps"] < 0.9 * result["rate"]:
            print(
                f"the writer reached {result['achieved_fps']:.0f} of the {result['rate']:g} frames/s asked: "
                "its latencies are at the rate reached"
            )
    write_json(ns.json_path, "live", f"{ns.side}", rows)
    return 0
