"""The downsampling kernels alone (``tensor_server.core.downsample.downsample_block``).

Cases come from ``tensor_server_kernels.cases.BENCH_CASES`` (the same table the
``python -m tensor_server.bench kernels`` script and the tests use). ``setup`` compiles (or loads
from numba's cache) the kernel a case uses, so the timed calls never include compilation;
compilation is measured on its own by ``TimeCompile``, in a fresh process with an empty numba
cache, and loading from a warm cache by ``TimeCachedLoad``. Peers (TensorStore, NumPy, ...) live
in the bench script, which prints ratios from one run; asv tracks our own numbers over commits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from tensor_server_kernels.cases import BENCH_CASES
from tensor_server_kernels.probe import read_probe

from tensor_server.core.downsample import downsample_block

_CASES = {c.name: c for c in BENCH_CASES}


def _gate_test_slowdown() -> float:
    """How many times slower to make ``TimeKernels`` (1.0: not at all).

    Only tests/bench/gate_test.py sets ``TENSOR_SERVER_GATE_TEST_SLOWDOWN=<commit>:<factor>``:
    the run of that commit (``ASV_COMMIT``, set by asv and by the gate's confirmation workers)
    sleeps ``factor - 1`` times each kernel call's own duration after it, a real ``factor``x
    slowdown of that commit only, which the perf gate must catch. Unset everywhere else.
    """
    commit, _, factor = os.environ.get("TENSOR_SERVER_GATE_TEST_SLOWDOWN", "").partition(":")
    if commit and os.environ.get("ASV_COMMIT", "").startswith(commit):
        return float(factor)
    return 1.0


class TimeKernels:
    params = [list(_CASES)]
    param_names = ["case"]
    timeout = 300
    number = 1
    repeat = (5, 10, 60.0)

    def setup(self, name):
        case = _CASES[name]
        self.x = case.make()
        self.scale = case.scale
        self.method = case.method
        downsample_block(self.x, self.scale, self.method)  # compile / load, fault pages
        self.slowdown = _gate_test_slowdown()

    def time_downsample_block(self, name):
        t0 = time.perf_counter()
        downsample_block(self.x, self.scale, self.method)
        if self.slowdown != 1.0:
            time.sleep((self.slowdown - 1.0) * (time.perf_counter() - t0))

    def track_input_gb_per_s(self, name):
        t0 = time.perf_counter()
        downsample_block(self.x, self.scale, self.method)
        return self.x.nbytes / (time.perf_counter() - t0) / 1e9

    track_input_gb_per_s.unit = "GB/s"

    def track_fraction_of_read_bandwidth(self, name):
        """The bandwidth probe's time over the kernel's on the same input (best of 5 each,
        interleaved): the fraction of one core's read bandwidth the kernel reaches."""
        best = {"probe": float("inf"), "kernel": float("inf")}
        read_probe(self.x)
        for _ in range(5):
            for what, call in (
                ("probe", lambda: read_probe(self.x)),
                ("kernel", lambda: downsample_block(self.x, self.scale, self.method)),
            ):
                t0 = time.perf_counter()
                call()
                best[what] = min(best[what], time.perf_counter() - t0)
        return best["probe"] / best["kernel"]

    track_fraction_of_read_bandwidth.unit = "fraction"


_ONE_KERNEL = (
    "import numpy as np\n"
    "from tensor_server.core.downsample import downsample_block\n"
    "downsample_block(np.zeros((64, 64), np.uint16), (2, 2), {method!r})\n"
)


def _run_fresh(code: str, cache_dir: str) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    env.pop("NUMBA_DISABLE_JIT", None)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


class TimeCompile:
    """A fresh process with an empty numba cache reducing once: import + compile of one kernel
    (the first-request cost of a server that skipped ``warm_up``)."""

    params = [["area", "max", "mode"]]
    param_names = ["method"]
    number = 1
    repeat = (3, 5, 120.0)
    timeout = 300

    def setup(self, method):
        self.tmp = tempfile.TemporaryDirectory()

    def teardown(self, method):
        self.tmp.cleanup()

    def time_first_call_cold_cache(self, method):
        _run_fresh(_ONE_KERNEL.format(method=method), tempfile.mkdtemp(dir=self.tmp.name))


class TimeCachedLoad:
    """The same fresh process with numba's cache already filled: what every server start pays."""

    params = [["area", "max", "mode"]]
    param_names = ["method"]
    number = 1
    repeat = (3, 5, 60.0)
    timeout = 300

    def setup(self, method):
        self.tmp = tempfile.TemporaryDirectory()
        _run_fresh(_ONE_KERNEL.format(method=method), self.tmp.name)

    def teardown(self, method):
        self.tmp.cleanup()

    def time_first_call_warm_cache(self, method):
        _run_fresh(_ONE_KERNEL.format(method=method), self.tmp.name)
