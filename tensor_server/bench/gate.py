"""``python -m tensor_server.bench gate``: the performance gate ``make perf-gate`` and CI run.

Two gates; the run fails when either does, and says which benchmark, both timings, the ratio
and the command that reproduces it:

1. *Against the base commit* (default ``HEAD~1``): ``asv continuous`` over ``GATED_BENCHMARKS``
   screens every ``time_``/``timeraw_`` benchmark (``track_`` metrics are higher-is-better and
   never gated). Whatever it sees at least ``SCREEN_FRACTION`` of the factor slower is re-run
   alone, base and head interleaved, in three fresh pairs of processes (``gate_confirm``); the
   gate fails when each side's best call over all pairs still differs by at least
   ``CONFIRM_FRACTION`` of the factor.
   Why thresholds below the factor: on a quiet machine a pair measures a real 1.5x slowdown
   within a few percent, so failing from 1.4x catches it, and the screen at 1.3x sends a real
   1.5x that asv happened to measure low to confirmation anyway. Why three pairs: on an
   oversubscribed machine one pair of processes running identical code was seen 1.64x apart.
   A benchmark that errors on head fails the gate; one that only exists on head is new.
   No base commit (a first commit, or a shallow clone that cannot deepen): gate 1 is skipped
   with a note, and gate 2 still runs.
2. *Against peers in the same run* (``gate_floors.FLOORS``): ratios to a peer doing the same
   work, measured alternately, best of N; they hold on any machine. An enforced floor that
   misses is re-measured (``gate_floors.measure_confirmed``) and fails only when it still does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GATED_BENCHMARKS", "FACTOR", "main"]

#: What gate 1 runs: part -> asv ``--bench`` regex (matched against ``name(params)``).
GATED_BENCHMARKS: dict[str, str] = {
    "kernels": r"^kernels\.TimeKernels\.time_downsample_block\('(area 8192\^2 uint16 s(2|16)"
    r"|nearest 8192\^2 uint16 s4|max 8192\^2 uint16 s8|mode 8192\^2 labels s4)'\)",
    "kernel load at server start": r"^kernels\.TimeCachedLoad\.time_first_call_warm_cache\('area'\)",
    "scaled reads (zarr, TIFF)": r"^read_path\.ScaledRead(Zarr|Tiff)\.time_scaled_read\('(nearest|area)', 4\)",
    "a chunk through the server": r"^flight\.ChunkThroughServer\.time_(doget|fast_path)",
    "import time": r"^imports\.timeraw_",
    # The uploads benchmark: asv_bench/benchmarks/uploads.py (time_ methods), once uploads land.
    "uploads": r"^uploads\..*\.time_",
}
FACTOR = 1.5
SCREEN_FRACTION = 0.87  # re-measure from 1.3x
CONFIRM_FRACTION = 0.93  # fail from 1.4x (confirmed)
_GATED_KIND = re.compile(r"(^|\.)(time|timeraw)_")


@dataclass
class Failure:
    what: str
    detail: str
    reproduce: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", default="HEAD~1", help="commit to compare HEAD with (gate 1)")
    parser.add_argument(
        "--bench",
        action="append",
        default=[],
        help="asv --bench regex (repeatable); default: the gated set, GATED_BENCHMARKS",
    )
    parser.add_argument("--floors", default="all", help="comma-separated floor names of gate 2, 'all' or 'none'")
    parser.add_argument("--skip-commits", action="store_true", help="run gate 2 only")
    parser.add_argument("--factor", type=float, default=FACTOR, help="slowdown that fails gate 1")
    parser.add_argument("--asv-dir", default=".asv", help="asv environments, results and logs (under the repo)")
    parser.add_argument(
        "--asv-args", default="", help="extra asv continuous arguments, e.g. '-a processes=1' (one round)"
    )
    parser.add_argument(
        "--confirm-seconds",
        type=float,
        default=None,
        help="seconds of interleaved calls per confirmation pair (default 10; at least 9 rounds run)",
    )


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, rev: str) -> str | None:
    r = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", rev + "^{commit}"], capture_output=True, text=True
    )
    return r.stdout.strip() or None


def resolve_base(repo: Path, rev: str) -> tuple[str | None, str]:
    """The base commit's sha, or None and why not. A shallow clone (CI's clone may be one) is
    deepened by one commit first; a first commit has no base."""
    sha = _commit(repo, rev)
    if sha is None and _git(repo, "rev-parse", "--is-shallow-repository") == "true":
        subprocess.run(["git", "-C", str(repo), "fetch", "--quiet", "--deepen=1"], capture_output=True)
        sha = _commit(repo, rev)
    if sha is None:
        return None, f"{rev} does not exist (first commit, or history not fetched)"
    return sha, ""


def _asv(repo: Path, asv_dir: Path, args: list[str], log) -> int:  # text file
    """Run asv from asv_bench/ with the gate's config; stream its output to stdout and ``log``."""
    conf = json.loads((repo / "asv_bench" / "asv.conf.json").read_text())
    conf.update(
        repo=str(repo),
        env_dir=str(asv_dir / "env"),
        results_dir=str(asv_dir / "results"),
        html_dir=str(asv_dir / "html"),
        benchmark_dir=str(repo / "asv_bench" / "benchmarks"),
    )
    conf_path = asv_dir / "asv-gate.conf.json"
    conf_path.write_text(json.dumps(conf, indent=1))
    # the install step runs {conf_dir}/share_deps.py, and asv's conf_dir is the config's folder
    shutil.copy(repo / "asv_bench" / "share_deps.py", asv_dir / "share_deps.py")
    env = dict(os.environ, TENSOR_SERVER_BENCH_SITE=sysconfig.get_paths()["purelib"])
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "asv", *args[:1], "--config", str(conf_path), *args[1:]]
    proc = subprocess.Popen(
        cmd, cwd=repo / "asv_bench", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
    return proc.wait()


def _results(asv_dir: Path, machine: str, sha: str) -> dict[tuple[str, int], tuple[float | None, str]]:
    """(benchmark, param index) -> (seconds or None when it failed, ``name(params)``)."""
    from asv import results as asv_results

    out: dict[tuple[str, int], tuple[float | None, str]] = {}
    for res in asv_results.iter_results_for_machine_and_hash(str(asv_dir / "results"), machine, sha):
        for key in res.get_all_result_keys():
            params = res.get_result_params(key)
            values = res.get_result_value(key, params)
            combos = [", ".join(c) for c in itertools.product(*params)] if params else [None]
            for i, (v, combo) in enumerate(zip(values, combos)):
                ok = v is not None and not (isinstance(v, float) and math.isnan(v))
                out[(key, i)] = (float(v) if ok else None, key if combo is None else f"{key}({combo})")
    return out


def _machine() -> str:
    import socket

    return socket.gethostname()


def gate_commits(
    repo: Path,
    asv_dir: Path,
    base_rev: str,
    regexes: list[str],
    factor: float,
    asv_args: list[str] = (),
    confirm_s: float | None = None,
) -> tuple[list[Failure], list[str]]:
    from tensor_server.bench.gate_confirm import CONFIRM_BUDGET_S, confirm_pairs, export_tree

    notes: list[str] = []
    head = _git(repo, "rev-parse", "HEAD")
    base, why = resolve_base(repo, base_rev)
    if base is None:
        return [], [f"gate 1 skipped: {why}"]
    if base == head:
        return [], [f"gate 1 skipped: base {base_rev} is HEAD"]
    asv_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(asv_dir / "results", ignore_errors=True)  # only this run's results may decide
    machine = _machine()
    with open(asv_dir / "perf-gate.log", "w") as log:
        subprocess.run(
            [sys.executable, "-m", "asv", "machine", "--yes", "--machine", machine],
            cwd=repo / "asv_bench",
            capture_output=True,
            check=True,
        )
        args = ["continuous", "--machine", machine, "--factor", str(factor), "--split", "--show-stderr"]
        for r in regexes:
            args += ["--bench", r]
        _asv(repo, asv_dir, args + list(asv_args) + [base, head], log)
    got_base, got_head = _results(asv_dir, machine, base), _results(asv_dir, machine, head)
    failures: list[Failure] = []
    if not got_head:
        return [
            Failure(
                "gate 1: asv produced no results for HEAD",
                f"see {asv_dir / 'perf-gate.log'}",
                f"make perf-gate PERF_BASE={base[:12]}",
            )
        ], notes
    trees: dict[str, Path] = {}
    selected = [re.compile(r) for r in regexes]
    for (key, idx), (h, label) in sorted(got_head.items()):
        # asv files the parameter combinations it did not run as failures: skip them
        if not _GATED_KIND.search(key.rsplit(".", 1)[-1]) or not any(r.search(label) for r in selected):
            continue
        b = got_base.get((key, idx), (None, label))[0]
        reproduce = f"make perf-gate PERF_BASE={base[:12]} PERF_BENCH={shlex.quote('^' + re.escape(label) + '$')} PERF_FLOORS=none"
        if h is None:
            failures.append(
                Failure(
                    f"gate 1: {label}", f"failed on HEAD {head[:10]} (traceback in the asv output above)", reproduce
                )
            )
            continue
        if b is None:
            notes.append(f"gate 1: {label}: new, or failed on base ({h * 1e3:.3g} ms on HEAD)")
            continue
        if h / b < SCREEN_FRACTION * factor:
            continue
        if not trees:
            trees = {sha: export_tree(repo, sha, asv_dir / "gate-trees" / sha[:12]) for sha in (base, head)}
        print(
            f"\nconfirming {label}: asv measured {b * 1e3:.3g} ms -> {h * 1e3:.3g} ms ({h / b:.2f}x); "
            "re-running it alone, base and head interleaved ...",
            flush=True,
        )
        try:
            pairs = confirm_pairs(
                repo / "asv_bench",
                key,
                idx,
                (trees[base], base),
                (trees[head], head),
                budget_s=CONFIRM_BUDGET_S if confirm_s is None else confirm_s,
            )
        except RuntimeError as exc:  # a worker that crashed or hung: not noise, so not a pass
            failures.append(Failure(f"gate 1: {label}: the confirmation re-run failed", str(exc), reproduce))
            continue
        c, runs = pairs
        verdict = (
            f"base {base[:10]} {c.base_ms:.3g} ms, head {head[:10]} {c.head_ms:.3g} ms, ratio {c.ratio:.2f}x "
            f"(best call of each side over {len(runs)} fresh base/head process pairs, {c.rounds} interleaved "
            f"rounds; pair ratios {', '.join(f'{r.ratio:.2f}' for r in runs)}; "
            f"asv measured {b * 1e3:.3g} -> {h * 1e3:.3g} ms)"
        )
        if c.ratio >= CONFIRM_FRACTION * factor:
            failures.append(
                Failure(f"gate 1: {label} is {c.ratio:.2f}x slower (limit {factor:g}x)", verdict, reproduce)
            )
        else:
            notes.append(f"gate 1: {label}: noise, not confirmed: {verdict}")
    return failures, notes


def gate_floors(names: str, data_dir: Path) -> tuple[list[Failure], list[str]]:
    from tensor_server.bench.gate_floors import FLOORS, measure_confirmed

    if names == "none":
        return [], []
    wanted = None if names == "all" else set(names.split(","))
    unknown = (wanted or set()) - {f.name for f in FLOORS}
    if unknown:
        raise SystemExit(f"unknown floor(s) {sorted(unknown)}; known: {[f.name for f in FLOORS]}")
    failures, notes = [], []
    print("\ngate 2: floors relative to peers in this run (best of N, alternating)", flush=True)
    for floor in FLOORS:
        if wanted is not None and floor.name not in wanted:
            continue
        r, runs = measure_confirmed(floor, data_dir)
        status = "held" if r.held else ("FAILED" if floor.enforced else "not held (not enforced)")
        confirmed = (
            ""
            if len(runs) == 1
            else (
                f" (best of each side over {len(runs)} measurements; their ratios {', '.join(f'{x.ratio:.3f}' for x in runs)})"
            )
        )
        line = (
            f"{floor.name}: ours {r.ours_ms:.3g} ms ({floor.ours}), peer {r.peer_ms:.3g} ms ({floor.peer}), "
            f"ratio {r.ratio:.3f}, limit {floor.max_ratio:.3f} ({floor.describe_limit()}){confirmed}: {status}"
        )
        print("  " + line, flush=True)
        reproduce = f"make perf-gate PERF_SKIP_COMMITS=1 PERF_FLOORS={floor.name}"
        if not r.held and floor.enforced:
            failures.append(Failure(f"gate 2: {floor.name}", line, reproduce))
        elif not r.held:
            notes.append(f"gate 2: {line}; waits for {floor.waits_for}")
    return failures, notes


def main(args: argparse.Namespace) -> int:
    repo = Path(_git(Path.cwd(), "rev-parse", "--show-toplevel"))
    asv_dir = (repo / args.asv_dir).resolve()
    t0 = time.perf_counter()
    failures, notes = [], []
    if not args.skip_commits:
        f, n = gate_commits(
            repo,
            asv_dir,
            args.base,
            args.bench or list(GATED_BENCHMARKS.values()),
            args.factor,
            shlex.split(args.asv_args),
            args.confirm_seconds,
        )
        failures += f
        notes += n
    t1 = time.perf_counter()
    f, n = gate_floors(args.floors, asv_dir / "gate-data")
    failures += f
    notes += n
    t2 = time.perf_counter()
    print(f"\nperf gate: gate 1 {t1 - t0:.0f} s, gate 2 {t2 - t1:.0f} s")
    for note in notes:
        print("note:", note)
    if not failures:
        print("PERF GATE PASSED")
        return 0
    print("PERF GATE FAILED")
    for f in failures:
        print(f"  {f.what}\n    {f.detail}\n    reproduce: {f.reproduce}")
    return 1
