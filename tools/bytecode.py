"""``python tools/bytecode.py FOLDER...``: compile every ``.py`` under the folders to bytecode on
every core, printing a count as it goes (the Makefile's set-up step).

Why not ``python -m compileall -q -j 0``: it does the same work but says nothing for the whole
of it (85 s for the full test install on 2 cores), so a newcomer cannot tell progress from a
hang. This does what compileall does for each file (``compileall.compile_file``: skipped when the
bytecode is up to date, the same timestamp invalidation) and reports ``done/total``: one line
that updates on a terminal, a line per tenth elsewhere (make, CI logs). A file that does not
compile for this Python (luxar's 3.12-only tests) is counted and left out, as pip leaves it.
Standard library only: it runs in a venv that holds nothing else yet.
"""

from __future__ import annotations

import compileall
import concurrent.futures
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO


def sources(folders: Sequence[str]) -> list[str]:
    """Every ``.py`` file under ``folders``, sorted (the order compileall walks in)."""
    found: list[str] = []
    for folder in folders:
        for parent, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [os.path.join(parent, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _compile(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2))


class Counter:
    """``label: done/total files``, rewritten in place on a terminal, else one line per tenth."""

    def __init__(self, label: str, total: int, out: TextIO) -> None:
        self.label, self.total, self.out = label, total, out
        self.tty = out.isatty()
        self.shown_tenth = 0

    def update(self, done: int) -> None:
        tenth = done * 10 // max(self.total, 1)
        if self.tty:
            self.out.write(f"\r{self.label}: {done}/{self.total} files")
        elif tenth > self.shown_tenth and done < self.total:
            self.out.write(f"{self.label}: {done}/{self.total} files\n")
        else:
            return
        self.shown_tenth = tenth
        self.out.flush()


def compile_all(files: Sequence[str], counter: Counter, workers: int | None = None) -> int:
    """Compile ``files`` on ``workers`` processes (default: the cores); the number that failed."""
    failed = 0
    with concurrent.futures.ProcessPoolExecutor(workers or os.cpu_count() or 1) as pool:
        results: Iterator[bool] = pool.map(_compile, files, chunksize=64)
        for done, ok in enumerate(results, 1):
            failed += not ok
            if done % 64 == 0 or done == len(files):
                counter.update(done)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    folders = list(sys.argv[1:] if argv is None else argv)
    missing = [f for f in folders if not Path(f).is_dir()]
    if not folders or missing:
        print(
            f"usage: python tools/bytecode.py FOLDER... ({'no such folder: ' + ', '.join(missing) if missing else 'no folder given'})",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    files = sources(folders)
    counter = Counter("bytecode", len(files), sys.stdout)
    failed = compile_all(files, counter)
    end = "\n" if counter.tty else ""
    left_out = f", {failed} that do not compile for this Python left out" if failed else ""
    print(f"{end}bytecode: {len(files)} files in {time.perf_counter() - t0:.0f} s{left_out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
