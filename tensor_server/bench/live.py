"""``python -m tensor_server.bench live``: frame-to-client latency of a live acquisition (issue 46).

A writer process appends ``side``² uint16 frames to a zarr v3 array (zarr-python: resize along
T, then write the frame, uncompressed as acquire-zarr writes by default) at ``--rates`` frames
a second, and records the wall-clock time each write returned (its side channel: a queue read
after the run). Two clients follow it in the same run:

* ``sdk watch``: the server (a process of its own, ``bench/server_process.py``) is watched
  through the Flight action ``watch``; the frames up to the newest extent announced are read
  with the biopb SDK's ``get_array``, one frame a read (30 cold 2048² frames in one read took
  2151 ms, one at a time 16 ms each: 2026-12-05, load average 4 on the 2 cores), and the time
  each arrived is taken;
* ``zarr poll``: a process that polls zarr-python directly every ``POLL_S`` (shrimPy's way:
  reopen the array, read the frames past the last one seen).

A frame counts as read once its pixels are the writer's: each frame carries its number in two
corner pixels, so a read of the fill value (zarr-python resizes before it writes, and a
poller can read the frame in between) does not count and the frame is read again. Latency of
frame i = the client's time it had frame i - the writer's time its write of frame i returned;
p50, p99 and max per rate and client. Targets (issue 46): p50 ≤ 200 ms, p99 ≤ 500 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["add_arguments", "main", "measure", "rows_of"]

#: the peer's poll period (shrimPy's viewer)
POLL_S = 0.1
#: the issue's targets (ms)
TARGETS = {"p50": 200.0, "p99": 500.0}
#: not frozen: a client that has not had a new frame for this long gives up
PATIENCE_S = 60.0


def stamped(base: np.ndarray, i: int) -> np.ndarray:
    """Frame ``i``: ``base`` with ``i + 1`` in its first and last pixels (never the fill value)."""
    frame = base.copy()
    frame[0, 0] = frame[-1, -1] = i + 1
    return frame


def is_frame(pixels: np.ndarray, i: int) -> bool:
    return int(pixels[0, 0]) == int(pixels[-1, -1]) == i + 1


def start_array(path: Path, side: int, chunk: int) -> None:
    """The acquisition's array at its first frame (the server opens it before the run)."""
    import zarr

    z = zarr.create_array(
        str(path), shape=(1, side, side), chunks=(1, chunk, chunk), dtype="uint16", compressors=None, fill_value=0
    )
    z[0] = stamped(np.zeros((side, side), np.uint16), 0)


def _write(path: str, frames: int, rate: float, start: float, out: Any) -> None:
    """The writer process: frame i is written at ``start + i / rate`` (or as soon as it can)."""
    import zarr

    z = zarr.open_array(path, mode="r+")
    base = np.random.default_rng(0).integers(0, 4000, z.shape[1:], dtype=np.uint16)
    written = {}
    for i in range(1, frames):
        frame = stamped(base, i)
        time.sleep(max(0.0, start + i / rate - time.time()))
        z.resize((i + 1, *z.shape[1:]))
        z[i] = frame
        written[i] = time.time()
    out.put(written)


def _poll(path: str, frames: int, start: float, out: Any) -> None:
    """The peer process: reopen the array with zarr-python every ``POLL_S`` and read the frames
    past the last one it had."""
    import zarr

    arrived: dict[int, float] = {}
    deadline = time.time() + PATIENCE_S
    time.sleep(max(0.0, start - time.time()))
    while len(arrived) < frames - 1 and time.time() < deadline:
        z = zarr.open_array(path, mode="r")
        for i in range(len(arrived) + 1, z.shape[0]):
            if not is_frame(z[i], i):
                break  # resized, not written yet: read again at the next poll
            arrived[i] = time.time()
            deadline = arrived[i] + PATIENCE_S
        time.sleep(POLL_S)
    out.put(arrived)


def _watch(location: str, array_id: str, frames: int) -> tuple[dict[int, float], dict[int, float]]:
    """The SDK client: the Flight ``watch`` stream is followed while a reader thread reads the
    frames up to the newest extent announced (a read per frame, not per record: records that
    arrived while a read ran are not waited on one by one); when each frame was read, and when
    the record announcing it arrived."""
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(location)
    client.get_array(array_id, (slice(0, 1), slice(None), slice(None)))  # as a viewer showing frame 0 has
    watcher = flight.FlightClient(location)
    results = watcher.do_action(flight.Action("watch", json.dumps({"array_id": array_id}).encode()))
    noticed: dict[int, float] = {}
    arrived: dict[int, float] = {}
    newest = threading.Condition()
    reader = threading.Thread(target=_read_newest, args=(client, array_id, frames, noticed, arrived, newest))
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
    if len(arrived) < frames - 1:
        raise RuntimeError(f"the SDK client read {len(arrived)} of {frames - 1} frames")
    return arrived, noticed


def _read_newest(
    client: Any,
    array_id: str,
    frames: int,
    noticed: dict[int, float],
    arrived: dict[int, float],
    newest: threading.Condition,
) -> None:
    while len(arrived) < frames - 1:
        first = len(arrived) + 1
        with newest:
            if not newest.wait_for(lambda: len(noticed) >= first, PATIENCE_S):
                return
            extent = len(noticed) + 1
        for i in range(first, extent):  # a plane a read (one read of many frames is slower per frame)
            if not is_frame(client.get_array(array_id, (slice(i, i + 1), slice(None), slice(None)))[0], i):
                raise RuntimeError(f"frame {i} was served before it was written")
            arrived[i] = time.time()


def _array_id(location: str, name: str) -> str:
    from biopb.tensor import TensorFlightClient

    for row in TensorFlightClient(location).query("SELECT source_url, tensors FROM sources").to_pylist():
        if row["source_url"].endswith("/" + name):
            return str(row["tensors"][0]["array_id"])
    raise RuntimeError(f"the catalog lists no {name}")


def _latencies(written: dict[int, float], arrived: dict[int, float]) -> list[float]:
    return [(arrived[i] - t) * 1e3 for i, t in sorted(written.items()) if i in arrived]


def _one_rate(srv: Any, path: Path, rate: float, frames: int) -> dict[str, Any]:
    """Writer, zarr poller and SDK watcher over one acquisition at ``rate`` frames/s."""
    spawn = multiprocessing.get_context("spawn")
    written_q, polled_q = spawn.Queue(), spawn.Queue()
    start = time.time() + 5.0  # both processes are up and the client has warmed up by then
    writer = spawn.Process(target=_write, args=(str(path), frames, rate, start, written_q))
    poller = spawn.Process(target=_poll, args=(str(path), frames, start, polled_q))
    writer.start()
    poller.start()
    try:
        watched, noticed = _watch(srv.location, _array_id(srv.location, path.name), frames)
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


def measure(work: Path, rates: list[float], seconds: float, side: int, chunk: int) -> list[dict[str, Any]]:
    """One acquisition per rate (``seconds`` long, at least 5 frames), all served by one server."""
    from tensor_server.bench.server_process import server_process

    root = work / "root"
    root.mkdir()
    plan = {rate: max(5, int(rate * seconds)) + 1 for rate in rates}
    for rate in rates:
        start_array(root / f"live-{rate:g}fps.zarr", side, chunk)
    with server_process([root], work / "cache") as srv:
        return [_one_rate(srv, root / f"live-{rate:g}fps.zarr", rate, frames) for rate, frames in plan.items()]


def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        for who in ("sdk watch", "zarr poll"):
            ms = sorted(result[who])
            p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))] if ms else float("nan")
            noticed = statistics.median(result["noticed"]) if who == "sdk watch" and result["noticed"] else None
            rows.append(
                {
                    "rate": f"{result['rate']:g} fps ({result['achieved_fps']:.0f})",
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
    parser.add_argument("--chunk", type=int, default=1024, help="chunk side in pixels (default 1024)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(ns: argparse.Namespace) -> int:
    load = os.getloadavg()
    rates = [float(r) for r in ns.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="ts-bench-live-") as work:
        rows = rows_of(measure(Path(work), rates, ns.seconds, ns.side, ns.chunk))
    print(
        f"{ns.side}² uint16 frames, zarr v3 chunks 1x{ns.chunk}², uncompressed, {ns.seconds:g} s per rate "
        f"(achieved rate in brackets); load average before the run {load[0]:.1f} ({os.cpu_count()} cores)"
    )
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    write_json(ns.json_path, "live", f"{ns.side}", rows)
    return 0
