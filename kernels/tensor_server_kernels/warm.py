"""``python -m tensor_server_kernels.warm``: compile the kernels of the case table into numba's
on-disk cache, one process per kernel family, before a test run.

Why: numba compiles a kernel per (dtype, constant last-axis scale, argument types) on its first
call, about 0.6 s each here, and the test suite reaches about 170 of them (157 from the case
table). On a fresh clone every pytest-xdist worker compiled the ones it met, which are mostly
the same ones, so each was compiled once per worker. Measured on 2 idle cores: pytest took
440 s with an empty cache and 306 s with a warm one; ``tests/adapters/hdf5_test.py`` alone
38 s and 3 s. Warming first compiles each kernel once, on every core.

Why the work is split by kernel family and not by case: numba keeps one index file per kernel
function. The process that compiles a new signature reads the index, adds its entry and
rewrites the file, without a lock. Two processes extending the same index at once can lose an
entry, or both pick the same data-file number for different signatures. The three families share
no compiled function: *averaging* is nearest and area, *extremes* min and max, *gathering*
mode and median (measured 22, 22 and 36 s, two at a time on 2 cores). So each index file has one
writer. ``tests/kernels/warm_test.py`` checks that the families' index files are disjoint.

The decode kernels (``decode.py``, eight signatures) and the compositing kernel
(``composite.py``, one per planes dtype) are left to their first call.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import math
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing.queues import Queue
from typing import TextIO

from tensor_server_kernels import cases
from tensor_server_kernels.reference import METHODS

__all__ = ["FAMILIES", "family_cases", "warm_family", "main"]

#: kernel family -> its methods; no compiled function is reached from two families. Longest
#: first: on 2 cores gathering runs beside averaging then extremes (44 s, against 60 s when
#: gathering came last)
FAMILIES: dict[str, tuple[str, ...]] = {
    "gathering": ("mode", "median"),
    "averaging": ("nearest", "area"),
    "extremes": ("min", "max"),
}


def _coarse_cases() -> Iterator[cases.Case]:
    """What a server reduces at coarse levels, beyond the test table: every method on the
    image dtypes at last-axis scales 8, 16 and 32 (each a constant-``s2`` kernel), on rows of
    even width (the plain-rows kernels) and odd width; and the area gate's geometries."""
    for dtype in ("bool", "uint8", "uint16", "uint32", "int16", "float32"):
        for s in (8, 16, 32):
            for width in (2 * s + 2, 2 * s + 1):
                for method in METHODS:
                    yield cases.Case(method, dtype, (2 * s + 1, width), (s, s))
    for dtype, scale, _ in cases.GATE_CASES:
        block = math.prod(scale)
        lead = tuple(2 * s + 1 if block <= 4096 else s + 1 for s in scale[:-1])
        for width in (2 * scale[-1] + 2, 2 * scale[-1] + 1):
            yield cases.Case("area", dtype, lead + (width,), scale)


def family_cases(family: str, table: Iterable[cases.Case] | None = None) -> list[cases.Case]:
    """One case per distinct call signature (method, dtype, shape, scale) of ``family`` in
    ``table`` (default: the test and wide-scale cases, then the coarse ones). The fill changes
    values, not types."""
    methods = FAMILIES[family]
    picked: dict[tuple, cases.Case] = {}
    default = itertools.chain(cases.TEST_CASES, cases.WIDE_S2_CASES, _coarse_cases())
    for case in table if table is not None else default:
        if case.method in methods:
            picked.setdefault((case.method, case.dtype, case.shape, case.scale), case)
    return list(picked.values())


#: where a worker process reports each call it made (set by ``_report_to``; None: no one counts)
_done: Queue[int] | None = None


def _report_to(done: Queue[int]) -> None:
    global _done
    _done = done


def warm_family(family: str, table: Sequence[cases.Case] | None = None) -> tuple[str, int, float]:
    """Run every call of ``family`` once (compiling, or loading from the cache). Returns
    (family, calls, seconds)."""
    from tensor_server_kernels.downsample import downsample

    t0 = time.perf_counter()
    todo = family_cases(family, table)
    for case in todo:
        downsample(case.make(), case.scale, case.method)
        if _done is not None:
            _done.put(1)
    return family, len(todo), time.perf_counter() - t0


def _count(done: Queue[int], total: int, pending: set[concurrent.futures.Future], out: TextIO) -> None:
    """Print ``calls k/total`` while ``pending`` runs: one line rewritten in place on a terminal,
    a line per tenth elsewhere (make, CI logs), so two silent minutes on a fresh clone show progress."""
    calls, shown = 0, 0
    while pending:
        pending = {f for f in pending if not f.done()}
        try:
            while True:
                calls += done.get(timeout=0.5)
        except queue.Empty:
            pass
        tenth = calls * 10 // max(total, 1)
        if out.isatty():
            out.write(f"\rkernels warm: {calls}/{total} calls")
        elif tenth > shown and calls < total:
            out.write(f"kernels warm: {calls}/{total} calls\n")
        out.flush()
        shown = tenth
    if out.isatty():
        out.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensor_server_kernels.warm", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--family",
        action="append",
        choices=sorted(FAMILIES),
        help="warm only this family (repeatable); default: all, in parallel",
    )
    args = parser.parse_args(argv)
    families = args.family or list(FAMILIES)
    t0 = time.perf_counter()
    workers = max(1, min(len(families), os.cpu_count() or 1))
    # spawn: a fresh interpreter per family (fork would copy this process's numba state)
    context = multiprocessing.get_context("spawn")
    done: Queue[int] = context.Queue()
    total = sum(len(family_cases(f)) for f in families)
    print(f"kernels warm: {total} calls of {len(families)} kernel families on {workers} processes", flush=True)
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_report_to, initargs=(done,)
    ) as pool:
        futures = [pool.submit(warm_family, f) for f in families]
        _count(done, total, set(futures), sys.stdout)
        for future in futures:
            family, calls, seconds = future.result()
            print(f"kernels warm: {family}: {calls} calls in {seconds:.1f} s", flush=True)
    print(
        f"kernels warm: numba's cache holds the case table's kernels ({time.perf_counter() - t0:.1f} s, "
        f"{workers} processes)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
