"""The perf gate's confirmation step: re-measure one flagged benchmark, base and head interleaved.

Why: asv measures base and head minutes apart; a noisy neighbour on a shared 2-core machine
during one of them is enough to make a benchmark look 1.5x slower. Before the gate fails, the
flagged benchmark is re-run alone: two worker processes (``asv_bench/confirm_worker.py``), one
per commit's source tree, both set up and idle; then single calls alternate base, head, head,
base, ... so a slow spell hits both sides alike, and each side is reduced to its best call
(noise only ever adds time). Three such pairs run, fresh processes each, and each side's best
call over all of them makes the verdict (``confirm_pairs``). Only a slowdown that survives this fails the gate.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Confirmation", "export_tree", "confirm", "confirm_pairs"]

#: Seconds a worker may take to set up (import, compile a kernel, write a fixture) or for one call.
_WORKER_TIMEOUT_S = 600.0
#: Seconds of interleaved calls per pair of workers (``confirm``'s ``budget_s``; the gate's
#: ``--confirm-seconds``, ``make perf-gate PERF_CONFIRM_S=``): at most 200 rounds, at least 9.
CONFIRM_BUDGET_S = 10.0


@dataclass(frozen=True)
class Confirmation:
    base_ms: float  # best call of the base commit
    head_ms: float  # best call of the head commit
    rounds: int

    @property
    def ratio(self) -> float:
        return self.head_ms / self.base_ms


def export_tree(repo: Path, commit: str, dest: Path) -> Path:
    """``commit``'s files (not the working tree) under ``dest``, via ``git archive``: nothing in
    the repository (worktrees, index, checkout) changes."""
    if (dest / ".complete").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], check=True, stdout=subprocess.PIPE
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / ".complete").write_text(commit)
    return dest


class _Worker:
    def __init__(self, suite_dir: Path, tree: Path, commit: str, name: str, param_index: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "kernels")]), ASV_COMMIT=commit)
        self.proc = subprocess.Popen(
            [sys.executable, str(suite_dir / "confirm_worker.py"), name, str(param_index)],
            cwd=suite_dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.label = f"{name} at {commit[:10]}"

    def _line(self) -> str:
        if not self.sel.select(_WORKER_TIMEOUT_S):
            raise RuntimeError(f"confirmation worker for {self.label} gave no answer in {_WORKER_TIMEOUT_S:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"confirmation worker for {self.label} exited (code {self.proc.wait()}); its traceback is above"
            )
        return line.strip()

    def ready(self) -> None:
        if self._line() != "ready":
            raise RuntimeError(f"confirmation worker for {self.label} did not start")

    def call_s(self) -> float:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return float(self._line())

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.sel.close()


def confirm(
    suite_dir: Path,
    name: str,
    param_index: int,
    base: tuple[Path, str],
    head: tuple[Path, str],
    min_rounds: int = 9,
    max_rounds: int = 200,
    budget_s: float = CONFIRM_BUDGET_S,
) -> Confirmation:
    """Re-measure benchmark ``name`` (its ``param_index``-th parameter combination) for the
    ``(source tree, commit)`` pairs ``base`` and ``head``: at least ``min_rounds`` interleaved
    rounds, more (up to ``max_rounds``) while ``budget_s`` of calls has not passed."""
    workers = [_Worker(suite_dir, tree, commit, name, param_index) for tree, commit in (base, head)]
    try:
        for w in workers:
            w.ready()
        best = [float("inf"), float("inf")]
        start = time.perf_counter()
        rounds = 0
        while rounds < min_rounds or (rounds < max_rounds and time.perf_counter() - start < budget_s):
            for i in (0, 1) if rounds % 2 == 0 else (1, 0):
                best[i] = min(best[i], workers[i].call_s())
            rounds += 1
    finally:
        for w in workers:
            w.close()
    return Confirmation(best[0] * 1e3, best[1] * 1e3, rounds)


def confirm_pairs(
    suite_dir: Path,
    name: str,
    param_index: int,
    base: tuple[Path, str],
    head: tuple[Path, str],
    pairs: int = 3,
    budget_s: float = CONFIRM_BUDGET_S,
) -> tuple[Confirmation, list[Confirmation]]:
    """``confirm`` with ``pairs`` fresh pairs of workers, ``budget_s`` of calls each. Returns the
    verdict, each side's best call over every pair, and the pairs. Why several processes, and the
    best over all of them:
    on an oversubscribed machine a pair of workers running identical code measured 1.59x and
    1.64x apart over 47 interleaved best-of calls (a per-process draw: which core and which
    neighbour it lands with), which no number of calls within the pair removes; a slow process
    only adds time, so each side's best process is its true speed."""
    runs = [confirm(suite_dir, name, param_index, base, head, budget_s=budget_s) for _ in range(pairs)]
    best = Confirmation(min(r.base_ms for r in runs), min(r.head_ms for r in runs), sum(r.rounds for r in runs))
    return best, runs
