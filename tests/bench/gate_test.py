"""The performance gate itself: it fails on a real slowdown, with the message a developer needs,
and passes without one (on a noisy shared machine, which is the point of its confirmation step).

The end-to-end test runs ``make perf-gate`` in a throwaway clone whose HEAD is an empty commit
on top of this repository's HEAD: the same code twice, so any slowdown is the one injected by
``TENSOR_SERVER_GATE_TEST_SLOWDOWN`` (asv_bench/benchmarks/kernels.py), into HEAD's kernel
benchmark only. One kernel benchmark, asv's screen cut to one round per commit, and one cheap
floor keep it to under a minute (53 s alone on an idle 2-core machine): the test is of the gate's
logic (screen, confirmation, verdict). The confirmation step it exercises runs as in CI (three
fresh base/head process pairs, interleaved, best call of each side) except that the slowed run
gives each pair 2 s of calls (``PERF_CONFIRM_S``) instead of 10: an 8x slowdown needs no more
(each pair still runs its 9 rounds at least), and the 10 s were 30 of the test's 73 s. The clean
run keeps the default, so a screen that mistakes load for a slowdown is confirmed at full
strength, as in CI, and does not fail the test.

The injected slowdown is 8x, not the 1.5x the gate exists for: this test runs beside the rest of
the suite, and asv's one-round screen measures base and head seconds apart. In CI's make test
the base measured 41.7 ms against 11.6 ms idle (3.6x, the other worker's tests), so an injected
3x read as under the screen's 1.3x and the gate passed. The gate's own CI run comes after the
tests, on an idle machine, with asv's two interleaved rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensor_server.bench import gate, gate_floors

REPO = Path(__file__).resolve().parents[2]
KERNEL_BENCH = r"^kernels\.TimeKernels\.time_downsample_block\('area 8192\^2 uint16 s16'\)$"
LABEL = "kernels.TimeKernels.time_downsample_block('area 8192^2 uint16 s16')"
SLOWDOWN = 8
#: seconds of interleaved calls per confirmation pair in the slowed run (the gate's default: 10)
CONFIRM_S = 2


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=gate test", "-c", "user.email=gate@test.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """This repository's HEAD cloned, plus an empty commit: base and head hold the same code."""
    if shutil.which("make") is None or not (REPO / ".git").exists():
        pytest.skip("needs make and a git checkout of the repository")
    dest = tmp_path_factory.mktemp("gate") / "repo"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(dest)], check=True)
    _git(dest, "commit", "--quiet", "--allow-empty", "-m", "gate test: same code as HEAD~1")
    return dest


def _perf_gate(clone: Path, slowdown: str | None, confirm_s: str = "") -> subprocess.CompletedProcess:
    base_stamp, stamp = clone / ".gate-test-base-stamp", clone / ".gate-test-stamp"
    base_stamp.touch()  # both newer than pyproject.toml, the full install's newer than the serving
    stamp.touch()  # one's: make uses this interpreter and installs nothing
    later = base_stamp.stat().st_mtime + 1
    os.utime(stamp, (later, later))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TENSOR_SERVER_GATE_TEST_SLOWDOWN")}
    if slowdown:
        env["TENSOR_SERVER_GATE_TEST_SLOWDOWN"] = slowdown
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "perf-gate",
            f"PY={sys.executable}",
            f"STAMP={stamp}",
            f"BASE_STAMP={base_stamp}",
            f"PERF_BENCH={KERNEL_BENCH}",
            "PERF_FLOORS=fast-path-vs-doget",
            "PERF_ASV_ARGS=-a processes=1 -a repeat=5",
            f"PERF_CONFIRM_S={confirm_s}",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_perf_gate_fails_on_a_slowed_kernel_and_passes_without(clone):
    head = _git(clone, "rev-parse", "HEAD")
    base = _git(clone, "rev-parse", "HEAD~1")

    slowed = _perf_gate(clone, f"{head}:{SLOWDOWN}", confirm_s=str(CONFIRM_S))
    out = slowed.stdout
    assert slowed.returncode != 0, out[-3000:]
    verdict = out[out.index("PERF GATE FAILED") :]
    assert f"gate 1: {LABEL} is " in verdict, verdict
    m = re.search(rf"base {base[:10]} ([\d.]+) ms, head {head[:10]} ([\d.]+) ms, ratio ([\d.]+)x", verdict)
    assert m, verdict
    base_ms, head_ms, ratio = map(float, m.groups())
    # the gate's own threshold is 1.4x, and on an oversubscribed machine one process pair can be
    # 1.5x off either way, so only the verdict's consistency is asserted tightly
    assert 1.4 <= ratio <= 1.5 * SLOWDOWN and abs(ratio - head_ms / base_ms) < 0.02 * ratio, verdict
    rounds = re.search(
        r"best call of each side over 3 fresh base/head process pairs, (\d+) interleaved rounds", verdict
    )
    assert rounds and 3 * 9 <= int(rounds[1]) <= 3 * 200, verdict  # each pair ran its minimum, at least
    assert f"reproduce: make perf-gate PERF_BASE={base[:12]} PERF_BENCH=" in verdict, verdict
    assert "fast-path-vs-doget" not in verdict  # the floor held; only the slowed kernel is named

    clean = _perf_gate(clone, None)
    assert clean.returncode == 0, clean.stdout[-3000:]
    assert "PERF GATE PASSED" in clean.stdout
    assert re.search(r"fast-path-vs-doget: ours [\d.]+ ms .* held", clean.stdout), clean.stdout[-2000:]


def _args(**kw) -> argparse.Namespace:
    """The gate command's own defaults (floors off), with ``kw`` replacing some."""
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    ns = parser.parse_args(["--floors", "none"])
    ns.__dict__.update(kw)
    return ns


def test_first_commit_skips_gate_1_with_a_note(tmp_path, capsys, monkeypatch):
    repo = tmp_path / "one"
    repo.mkdir()
    _git(repo, "init", "--quiet")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "commit", "--quiet", "-m", "first")
    assert gate.resolve_base(repo, "HEAD~1") == (None, "HEAD~1 does not exist (first commit, or history not fetched)")
    monkeypatch.chdir(repo)
    assert gate.main(_args()) == 0
    out = capsys.readouterr().out
    assert "note: gate 1 skipped: HEAD~1 does not exist" in out and out.rstrip().endswith("PERF GATE PASSED")
    assert not (repo / ".asv").exists()  # nothing was built


def _fake_floors(monkeypatch, ours_s: float, peer_s: float, enforced: bool) -> gate_floors.Floor:
    calls = (lambda: time.sleep(ours_s), lambda: time.sleep(peer_s))
    floor = gate_floors.Floor(
        "fake-floor",
        "ours thing",
        "peer thing",
        1 / 3,
        enforced,
        lambda data_dir: contextlib.nullcontext(calls),
        "issue 99",
    )
    monkeypatch.setattr(gate_floors, "FLOORS", (floor,))
    return floor


def test_a_broken_floor_fails_with_both_timings_ratio_and_command(tmp_path, capsys, monkeypatch):
    _fake_floors(monkeypatch, ours_s=0.02, peer_s=0.02, enforced=True)
    monkeypatch.chdir(REPO)
    assert gate.main(_args(skip_commits=True, floors="all", asv_dir=str(tmp_path / "asv"))) == 1
    out = capsys.readouterr().out
    verdict = out[out.index("PERF GATE FAILED") :]
    m = re.search(
        r"gate 2: fake-floor\n    fake-floor: ours ([\d.]+) ms \(ours thing\), peer ([\d.]+) ms \(peer thing\), "
        r"ratio ([\d.]+), limit 0\.333 \(ours >= 3x faster than peer\) \(best of each side over 3 "
        r"measurements; their ratios [\d.]+, [\d.]+, [\d.]+\): FAILED\n"
        r"    reproduce: make perf-gate PERF_SKIP_COMMITS=1 PERF_FLOORS=fake-floor",
        verdict,
    )
    assert m, verdict
    ours, peer, ratio = map(float, m.groups())
    assert 20 <= ours < 40 and 20 <= peer < 40 and 0.6 < ratio < 1.6


def test_a_floor_that_misses_once_is_confirmed_before_it_fails(tmp_path, capsys, monkeypatch):
    """The confirmation step: the first measurement misses (a slow spell), the re-measurement
    holds, so the gate passes and says the floor held."""
    spells = iter([0.03] * 40)  # the first measurement's calls of ours are slow, later ones are not

    def ours():
        time.sleep(next(spells, 0.001))

    floor = gate_floors.Floor(
        "flaky-floor",
        "ours thing",
        "peer thing",
        1.0,
        True,
        lambda data_dir: contextlib.nullcontext((ours, lambda: time.sleep(0.01))),
    )
    monkeypatch.setattr(gate_floors, "FLOORS", (floor,))
    monkeypatch.chdir(REPO)
    assert gate.main(_args(skip_commits=True, floors="all", asv_dir=str(tmp_path / "asv"))) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"flaky-floor: .*\(best of each side over 2 measurements; their ratios [\d.]+, [\d.]+\): held", out
    ), out
    assert out.rstrip().endswith("PERF GATE PASSED")


def test_an_unenforced_floor_is_reported_but_does_not_fail(tmp_path, capsys, monkeypatch):
    _fake_floors(monkeypatch, ours_s=0.02, peer_s=0.01, enforced=False)
    monkeypatch.chdir(REPO)
    assert gate.main(_args(skip_commits=True, floors="all", asv_dir=str(tmp_path / "asv"))) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"note: gate 2: fake-floor: ours [\d.]+ ms .*: not held \(not enforced\); waits for issue 99", out
    ), out
    assert out.rstrip().endswith("PERF GATE PASSED")
