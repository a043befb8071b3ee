"""``python -m tensor_server.bench kernels``: the downsampling kernels against their peers.

One table, measured in one run (ratios are what to read: the machine is shared): for each case
of ``tensor_server_kernels.cases.BENCH_CASES``, ``downsample_block`` against NumPy reshape-mean /
strided copy / reshape-max, scikit-image (``downscale_local_mean``, ``block_reduce``), tinybrain
and TensorStore's ``downsample`` driver over an in-memory ``ts.array``. Each cell is the median
of ``--repeats`` (>= 5; more for sub-ms cells, to fill 0.3 s) interleaved rounds - every
implementation once per round, rotating order, so a slow spell of the shared machine hits all
alike - after one untimed warm call each, so numba compile time is excluded
(it is reported once, from ``warm_up()``). Columns: ms, GB/s of input, "%bw": the bandwidth
probe's time over this row's time, and TensorStore's time over this row's time. The probe
(``tensor_server_kernels.probe``: a numba sum of the same input as uint64 words, one core) is
timed in the same interleaved rounds as the kernels, so "%bw" is the fraction of one core's
read bandwidth a row reaches on that array, under whatever load the machine had.

Peers differ in what they return (NumPy / scikit-image: float64 means; tinybrain: rounds down,
and copies C-order input first), so only TensorStore's output is compared with ours ("= TS":
exact equality; every benchmark scale divides the shape, so there are no edge blocks, where
TensorStore averages only the valid part). Peers that are not installed are skipped with a note.
Our kernels run on one thread; TensorStore may use its own thread pool.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tensor_server_kernels.cases import BENCH_CASES, BenchCase

Thunk = Callable[[], Any]

# Targets (TensorStore time / ours, or fractions of read bandwidth), from issue 25.
AREA_VS_TS = 5.0
BW_FRACTION = 0.50  # area, nearest, min, max, at every scale
BW_METHODS = ("area", "nearest", "min", "max")
NEAREST_VS_NUMPY = 0.8
MAX_VS_TS = 5.0
MODE_VS_TS = 3.0
PROBE = "probe (numba sum of the input)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small arrays (smoke run; ratios are not representative)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell (>= 5)")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument(
        "--stat",
        choices=("median", "min", "cpu"),
        default="median",
        help="per cell: median of the rounds, the best, or the best thread CPU time "
        "(TensorStore: best wall time, it runs on its own threads); for a heavily "
        "loaded machine",
    )
    parser.add_argument(
        "--peers", default="", help="only peers whose name contains one of these (comma-separated, e.g. tensorstore)"
    )
    parser.add_argument(
        "--plane", type=int, default=0, help="side of the 2-D cases' planes instead of the table's (e.g. 4096)"
    )


def _median_ms(fn: Thunk, repeats: int, min_total_s: float = 0.3) -> float:
    """Median of at least ``repeats`` calls after one untimed warm call."""
    return _interleaved_ms({"fn": fn}, repeats, min_total_s)["fn"]


def _interleaved_ms(
    fns: dict[str, Thunk], repeats: int, min_total_s: float = 0.3, stat: str = "median", threaded: tuple[str, ...] = ()
) -> dict[str, float]:
    """Median ms per function, timed in interleaved rounds (each round calls every function once,
    in a rotating order) so that a slow spell of the shared machine hits all of them alike and
    the ratios stay meaningful. At least ``repeats`` rounds, more (up to 1000) until
    ``min_total_s`` has passed: sub-ms cells would otherwise hinge on one page-fault storm.
    One untimed warm call each first (page faults, caches, lazy compilation). ``stat``:
    "median", or "min" (best of the rounds: on an oversubscribed machine the median of a
    10 ms call mostly measures how often it was descheduled), or "cpu": the best of the calling
    thread's CPU time (``time.thread_time``: the work of a single-threaded call without the
    time it spent descheduled; cache and memory contention stay in), except for the functions
    named in ``threaded``, which work on threads of their own and keep their best wall time."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < repeats or (time.perf_counter() - start < min_total_s and rounds < 1000):
        k = rounds % len(names)
        for name in names[k:] + names[:k]:
            clock = time.thread_time if stat == "cpu" and name not in threaded else time.perf_counter
            t0 = clock()
            fns[name]()
            times[name].append(clock() - t0)
        rounds += 1
    pick = statistics.median if stat == "median" else min
    return {n: pick(v) * 1e3 for n, v in times.items()}


def _try_import(name: str) -> tuple[Any, str]:
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # not installed, or broken: skip with a note
        return None, f"{name} unavailable ({type(exc).__name__}: {exc})"


@dataclass
class _Peers:
    ts: Any
    skimage_transform: Any
    skimage_measure: Any
    tinybrain: Any
    notes: list[str]

    @classmethod
    def load(cls) -> _Peers:
        notes = []
        ts, n1 = _try_import("tensorstore")
        skt, n2 = _try_import("skimage.transform")
        skm, n3 = _try_import("skimage.measure")
        tb, n4 = _try_import("tinybrain")
        notes += [n for n in (n1, n2 or n3, n4) if n]
        return cls(ts, skt, skm, tb, notes)

    def thunks(self, x: np.ndarray, case: BenchCase) -> dict[str, Thunk]:
        """Peer name -> zero-argument call doing the same reduction (as close as it gets)."""
        s, m = case.scale, case.method
        out: dict[str, Thunk] = {}
        split = [d for n, k in zip(x.shape, s) for d in (n // k, k)]
        red = tuple(range(1, 2 * x.ndim, 2))
        if m == "area":
            out["numpy reshape-mean"] = lambda: x.reshape(split).mean(axis=red)
        elif m == "nearest":
            sl = tuple(slice(None, None, k) for k in s)
            out["numpy x[::s].copy()"] = lambda: x[sl].copy()
        elif m in ("max", "min"):
            extreme = x.reshape(split).max if m == "max" else x.reshape(split).min
            out[f"numpy reshape-{m}"] = lambda: extreme(axis=red)
        if self.skimage_transform is not None and m == "area":
            out["scikit-image downscale_local_mean"] = lambda: self.skimage_transform.downscale_local_mean(x, s)
        if self.skimage_measure is not None and m == "max":
            out["scikit-image block_reduce(max)"] = lambda: self.skimage_measure.block_reduce(x, s, np.max)
        if self.tinybrain is not None and m != "min":
            tb = self.tinybrain
            fn = {
                "area": tb.downsample_with_averaging,
                "max": tb.downsample_with_max_pooling,
                "mode": tb.downsample_segmentation,
                "nearest": tb.downsample_with_striding,
            }[m]
            out["tinybrain"] = lambda: fn(x, s, num_mips=1)[0]
        if self.ts is not None:
            ts_method = {"area": "mean", "nearest": "stride", "max": "max", "min": "min", "mode": "mode"}[m]
            store = self.ts.downsample(self.ts.array(x), list(s), ts_method)
            out["tensorstore " + ts_method] = lambda: store.read().result()
        return out


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    from tensor_server_kernels.probe import read_probe

    from tensor_server.core.downsample import downsample_block, warm_up

    repeats = max(5, args.repeats)
    peers = _Peers.load()
    cases = [c for c in BENCH_CASES if args.only in c.name]
    if args.plane:
        cases = [
            dataclasses.replace(c, shape=(args.plane,) * 2, quick_shape=(args.plane,) * 2) if len(c.shape) == 2 else c
            for c in cases
        ]
    t_warm = warm_up()
    print(
        f"kernel warm_up(): {t_warm:.2f} s; {args.stat} of >= {repeats}; load average "
        f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; "
        f"{'QUICK sizes' if args.quick else 'full sizes'}; %bw = probe time / row time"
    )
    for note in peers.notes:
        print("note:", note)

    header = f"{'case':<28} {'implementation':<34} {'ms':>8} {'GB/s':>6} {'%bw':>5} {'TS/x':>6}  check"
    print(header)
    print("-" * len(header))
    data: dict[tuple, np.ndarray] = {}
    verdicts: list[tuple[str, bool, str]] = []
    for case in cases:
        key = (case.dtype, case.quick_shape if args.quick else case.shape, case.fill)
        if key not in data:
            data.clear()  # keep one input resident at a time
            data[key] = case.make(quick=args.quick)
        x = data[key]
        ours_name = "ours (downsample_block)"
        thunks: dict[str, Thunk] = {
            ours_name: lambda: downsample_block(x, case.scale, case.method),
            PROBE: lambda: read_probe(x),
        }
        notes: dict[str, str] = {}
        order = [ours_name, PROBE]
        ts_name, ts_out = None, None
        wanted = [w for w in args.peers.split(",") if w]
        for name, fn in peers.thunks(x, case).items():
            if wanted and not any(w in name for w in wanted):
                continue
            order.append(name)
            try:
                r = np.asarray(fn())
            except Exception as exc:  # a peer that cannot do this case
                notes[name] = f"skipped: {type(exc).__name__}: {str(exc)[:60]}"
                continue
            if name.startswith("tensorstore"):
                ts_name, ts_out = name, r
            if np.shares_memory(r, x):  # e.g. tinybrain mode at factors > 2 strides
                notes[name] = "returns a strided VIEW of the input: not a reduction"
            elif r.shape != tuple(-(-n // k) for n, k in zip(x.shape, case.scale)):
                notes[name] = f"returns shape {r.shape}"
            thunks[name] = fn
        timed = _interleaved_ms(
            thunks, repeats, stat=args.stat, threaded=tuple(n for n in thunks if n.startswith("tensorstore"))
        )
        results: dict[str, float | None] = {n: timed.get(n) for n in order}
        t_ts = timed.get(ts_name) if ts_name else None
        t_probe = timed[PROBE]
        same = None
        if ts_out is not None:
            same = bool(np.array_equal(downsample_block(x, case.scale, case.method), ts_out))
            notes[ours_name] = "= TS" if same else "DIFFERS from TS"
        del ts_out
        for name, ms in results.items():
            gbs = None if ms is None else x.nbytes / (ms / 1e3) / 1e9
            pct = None if ms is None else 100 * t_probe / ms
            ratio = None if (ms is None or t_ts is None) else t_ts / ms
            print(
                f"{case.label(args.quick):<28} {name:<34} {_fmt(ms, '8.1f'):>8} {_fmt(gbs, '6.1f'):>6} "
                f"{_fmt(pct, '5.0f'):>5} {_fmt(ratio, '6.2f'):>6}  {notes.get(name, '')}"
            )
        verdicts += _judge(case.label(args.quick), case, results, t_ts, t_probe, same)
    print()
    print("targets:")
    for what, ok, detail in verdicts:
        print(f"  {'MET ' if ok else 'MISS'} {what}: {detail}")
    return 0


def _judge(
    label: str, case: BenchCase, results: dict[str, float | None], t_ts: float | None, t_probe: float, same: bool | None
) -> list[tuple[str, bool, str]]:
    ms = results["ours (downsample_block)"]
    assert ms is not None
    out = []
    if case.method in ("area", "max", "min", "mode") and t_ts is not None:
        want = {"area": AREA_VS_TS, "max": MAX_VS_TS, "min": MAX_VS_TS, "mode": MODE_VS_TS}[case.method]
        out.append((f"{label} >= {want:g}x TensorStore", t_ts / ms >= want, f"{t_ts / ms:.2f}x"))
    if case.method in BW_METHODS:
        frac = t_probe / ms
        out.append((f"{label} >= {BW_FRACTION:.0%} of read bandwidth (probe)", frac >= BW_FRACTION, f"{frac:.0%}"))
    if case.method == "mode" and same is not None:
        out.append((f"{label} exact (= TensorStore mode)", bool(same), "equal" if same else "differs"))
    if case.method == "nearest":
        t_np = next((v for k, v in results.items() if k.startswith("numpy")), None)
        if t_np is not None:
            out.append(
                (
                    f"{label} >= {NEAREST_VS_NUMPY:g}x NumPy strided copy",
                    t_np / ms >= NEAREST_VS_NUMPY,
                    f"{t_np / ms:.2f}x",
                )
            )
    return out
