"""The kernel warm-up (``tensor_server_kernels.warm``): its families may run at the same time
because no two of them write the same numba cache index, and together they cover every method."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensor_server_kernels import cases, warm
from tensor_server_kernels.reference import METHODS

#: geometries that reach the kernels of every method: plain rows (even width) and non-dyadic 3
#: (the area gate's other path); uint8 and float32 (the float kernels)
_PATHS = {((8, 8), (2, 2)), ((10, 11), (3, 3))}
_SMALL = [c for c in cases.TEST_CASES if (c.shape, c.scale) in _PATHS and c.dtype in ("uint8", "float32")]


def test_every_method_is_in_exactly_one_family():
    members = [m for methods in warm.FAMILIES.values() for m in methods]
    assert sorted(members) == sorted(METHODS)


def test_family_cases_are_one_per_signature_and_only_the_familys_methods():
    picked = warm.family_cases("extremes", _SMALL)
    keys = [(c.method, c.dtype, c.shape, c.scale) for c in picked]
    assert len(keys) == len(set(keys)) == 2 * 2 * len(_PATHS)
    assert {c.method for c in picked} == {"min", "max"}


def _index_files(family: str, cache_dir: Path) -> subprocess.Popen:
    code = (
        "import sys; from tensor_server_kernels import warm; from tests.kernels.warm_test import _SMALL; "
        f"print(warm.warm_family({family!r}, _SMALL)[1])"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    env.pop("NUMBA_DISABLE_JIT", None)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_no_two_families_write_the_same_cache_index(tmp_path):
    """Each family compiled alone into its own cache: the sets of index files (one per compiled
    function) do not meet, so running the families in parallel never races on one index."""
    procs = {f: _index_files(f, tmp_path / f) for f in warm.FAMILIES}
    written: dict[str, set[str]] = {}
    for family, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        assert int(out.strip()) > 0
        written[family] = {p.name for p in (tmp_path / family).rglob("*.nbi")}
        assert written[family], f"{family} wrote no cache index"
    names = list(written)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not written[a] & written[b], (a, b, sorted(written[a] & written[b]))


def test_the_warm_up_counts_calls_as_they_come_off_a_terminal():
    """The count the Makefile's warm-up prints while it runs (a line per tenth in make's log)."""
    import concurrent.futures
    import io
    import queue

    done: queue.Queue[int] = queue.Queue()
    for _ in range(40):
        done.put(1)
    finished: concurrent.futures.Future = concurrent.futures.Future()
    finished.set_result(None)
    out = io.StringIO()
    warm._count(done, 100, {finished}, out)
    assert out.getvalue() == "kernels warm: 40/100 calls\n"
