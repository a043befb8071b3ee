"""Gate 2 of ``make perf-gate``: floors relative to peers measured in the same run.

Why peers: a gate against the previous commit (gate 1) cannot see a regression that creeps in
1.4x at a time, and an absolute number in ms means nothing on another machine. A ratio to a
peer doing the same work on the same data, in the same process, measured alternately (ours,
peer, peer, ours, ...) and reduced to the best of N, holds on any machine: a slow spell of a
shared machine slows both, and the best of N discards the spells.

``FLOORS`` is the one table: each entry names what is ours, what is the peer, and the largest
``ours / peer`` time ratio allowed. ``enforced=False`` entries are measured and printed on every
run but do not fail the gate; they wait for work that is not landed yet (each says which), and
the lead flips the flag when it lands.

The "decode floor" (``decode_floor.zarr_decode_floor``, the one ``bench peers`` prints) is the
time to only read and decompress the plane's chunks with every core, no reduction: no scaled
read of that plane can beat it, so a scaled read close to it has no overhead left to remove.

An enforced floor that misses is measured again before the gate fails (``measure_confirmed``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Floor", "FLOORS", "FloorResult", "measure_floor", "measure_confirmed", "best_of_alternating"]

Thunk = Callable[[], Any]

#: Plane of the scaled-read floors: 4096² uint16, 1024² blosc-zstd chunks (16 chunks: enough
#: for every core to have work in the decode floor, small enough to stay under a second per read).
_PLANE = 4096
_CHUNK = 1024
_READ_SCALE = 4


@dataclass(frozen=True)
class Floor:
    name: str  # stable id, used by --floors and in the failure message
    ours: str  # what is timed on our side
    peer: str  # what it is compared with
    max_ratio: float  # largest allowed ours_time / peer_time
    enforced: bool  # False: measured and printed, never fails the gate
    setup: Callable[[Path], AbstractContextManager[tuple[Thunk, Thunk]]]  # data dir -> (ours, peer)
    waits_for: str = ""  # why not enforced yet

    def describe_limit(self) -> str:
        if self.max_ratio < 1:
            return f"ours >= {1 / self.max_ratio:.3g}x faster than peer"
        return f"ours <= {self.max_ratio:.3g}x peer's time"


@dataclass(frozen=True)
class FloorResult:
    floor: Floor
    ours_ms: float
    peer_ms: float

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.peer_ms

    @property
    def held(self) -> bool:
        return self.ratio <= self.floor.max_ratio


def best_of_alternating(ours: Thunk, peer: Thunk, rounds: int = 15, min_seconds: float = 1.0) -> tuple[float, float]:
    """Best (minimum) ms of ``ours`` and ``peer`` over at least ``rounds`` rounds, more until
    ``min_seconds`` passed (at most 200). Each round calls both, the order alternating, after
    one untimed warm call each (compilation, page cache, lazy opens)."""
    ours()
    peer()
    best = [float("inf"), float("inf")]
    fns = (ours, peer)
    start = time.perf_counter()
    n = 0
    while n < rounds or (time.perf_counter() - start < min_seconds and n < 200):
        for i in (0, 1) if n % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            fns[i]()
            best[i] = min(best[i], time.perf_counter() - t0)
        n += 1
    return best[0] * 1e3, best[1] * 1e3


# ---- setups: each yields (ours, peer) -----------------------------------------------------------


@contextlib.contextmanager
def _area_kernel(data_dir: Path) -> Iterator[tuple[Thunk, Thunk]]:
    import tensorstore as ts

    from tensor_server.core.downsample import downsample_block

    x = np.random.default_rng(0).integers(0, 65535, (_PLANE, _PLANE), dtype=np.uint16, endpoint=True)
    store = ts.downsample(ts.array(x), [_READ_SCALE, _READ_SCALE], "mean")
    yield (lambda: downsample_block(x, (_READ_SCALE, _READ_SCALE), "area")), (lambda: store.read().result())


def _zarr_plane(data_dir: Path) -> Path:
    """The floors' zarr v2 plane (written once per data dir with zarr-python's own writer)."""
    import numcodecs
    import zarr

    from tensor_server.bench.fixtures import plane

    path = data_dir / f"plane{_PLANE}.zarr"
    if not (path / ".zarray").exists():
        z = zarr.open_array(
            str(path),
            mode="w",
            shape=(_PLANE, _PLANE),
            chunks=(_CHUNK, _CHUNK),
            dtype=np.uint16,
            zarr_format=2,
            compressor=numcodecs.Blosc("zstd", 5, numcodecs.Blosc.SHUFFLE),
        )
        z[...] = plane(_PLANE)
    return path


def _our_scaled_read(path: Path, method: str) -> Thunk:
    import tensor_server
    from tensor_server.core import Bounds

    t = tensor_server.open(path).tensor()  # best_of_alternating's warm call compiles what it uses
    b = Bounds.full(t.shape)
    return lambda: t.get_scaled_data(b, (_READ_SCALE, _READ_SCALE), method)


@contextlib.contextmanager
def _zarr_vs_tensorstore(data_dir: Path) -> Iterator[tuple[Thunk, Thunk]]:
    import tensorstore as ts

    path = _zarr_plane(data_dir)
    store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}, read=True).result()
    view = ts.downsample(store, [_READ_SCALE, _READ_SCALE], "mean")
    yield _our_scaled_read(path, "area"), (lambda: view.read().result())


@contextlib.contextmanager
def _zarr_vs_decode(data_dir: Path) -> Iterator[tuple[Thunk, Thunk]]:
    from tensor_server.bench.decode_floor import zarr_decode_floor

    path = _zarr_plane(data_dir)
    yield _our_scaled_read(path, "area"), zarr_decode_floor(path)


@contextlib.contextmanager
def _fast_path_vs_doget(data_dir: Path) -> Iterator[tuple[Thunk, Thunk]]:
    import pyarrow.flight as flight

    from tensor_server.bench.throughput import chunk_server, read_doget, read_fast_path

    arr = np.random.default_rng(0).integers(0, 60000, (2048, 2048), dtype=np.uint16)  # one 8 MiB chunk
    with chunk_server(arr, (2048, 2048), "gate") as (location, tickets):
        client = flight.FlightClient(location)
        try:
            yield (lambda: read_fast_path(client, tickets[0])), (lambda: read_doget(client, tickets[0]))
        finally:
            client.close()


FLOORS: tuple[Floor, ...] = (
    Floor(
        "area-kernel-vs-tensorstore",
        f"downsample_block area x{_READ_SCALE}, {_PLANE}² uint16",
        "TensorStore downsample 'mean' over ts.array of the same array",
        1 / 3,
        True,
        _area_kernel,
    ),
    # Both zarr limits guard what is landed, not issue 25's targets (0.8x TensorStore, 1.15x the
    # floor). Idle is the worst case (the peers have both cores; under load the ratios fall):
    # 2026-12-03, idle, after the streamed reduction's threads took their own units: 0.72-0.81
    # against TensorStore (0.94-1.18 before), 1.32-1.39 against the floor (1.77-2.39 before);
    # with blocks stacked into 4 MiB units too, 0.72 and 1.25-1.26. The limits leave the idle
    # spread seen across days (1.26-1.35x) room.
    Floor(
        "zarr-scaled-read-vs-tensorstore",
        f"scaled read area x{_READ_SCALE} of a {_PLANE}² blosc zarr (tensor_server.open)",
        "TensorStore downsample 'mean' over the same zarr",
        1.15,
        True,
        _zarr_vs_tensorstore,
    ),
    Floor(
        "zarr-scaled-read-vs-decode-floor",
        f"scaled read area x{_READ_SCALE} of a {_PLANE}² blosc zarr (tensor_server.open)",
        "decode floor: read + decompress its chunks on all cores",
        2.0,
        True,
        _zarr_vs_decode,
    ),
    Floor(
        "fast-path-vs-doget",
        "one cached 8 MiB chunk via chunk_locate + mmap (fast path)",
        "the same chunk via DoGet",
        1 / 3,
        True,
        _fast_path_vs_doget,
    ),
)


#: Re-measurements of an enforced floor that missed, before the gate fails on it.
CONFIRMATIONS = 2


def measure_confirmed(
    floor: Floor, data_dir: Path | None = None, rounds: int = 15
) -> tuple[FloorResult, list[FloorResult]]:
    """The floor's confirmation step: ``measure_floor``, and when an enforced floor misses,
    up to ``CONFIRMATIONS`` more measurements, each with a fresh setup (a fresh open, fresh
    buffers). The verdict takes each side's best over every measurement, as gate 1's
    confirmation does: a slow spell of the shared machine only adds time, so the best is
    each side's true speed, and a floor fails only when its ratio misses every time.
    Returns (verdict, measurements)."""
    runs = [measure_floor(floor, data_dir, rounds)]
    best = runs[0]
    while floor.enforced and not best.held and len(runs) <= CONFIRMATIONS:
        runs.append(measure_floor(floor, data_dir, rounds))
        best = FloorResult(floor, min(r.ours_ms for r in runs), min(r.peer_ms for r in runs))
    return best, runs


def measure_floor(floor: Floor, data_dir: Path | None = None, rounds: int = 15) -> FloorResult:
    """Measure one floor (its fixture is written into ``data_dir``, a temporary dir when None)."""
    own_dir = data_dir is None
    d = Path(tempfile.mkdtemp(prefix="ts-gate-floor-")) if own_dir else Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    try:
        with floor.setup(d) as (ours, peer):
            ours_ms, peer_ms = best_of_alternating(ours, peer, rounds)
    finally:
        if own_dir:
            shutil.rmtree(d, ignore_errors=True)
    return FloorResult(floor, ours_ms, peer_ms)
