"""Small timing helpers shared by the bench commands: medians, a progress line, tables."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence

__all__ = ["median_ms", "alternating_median_ms", "Progress", "print_table", "add_common_arguments", "write_json"]


def median_ms(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` runs; ``before`` runs untimed first
    (e.g. dropping the page cache for a cold read)."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def alternating_median_ms(
    fns: dict[str, Callable[[], object]], repeats: int, before: Callable[[str], object] | None = None
) -> dict[str, float]:
    """Median wall time in ms of each of ``fns``, run in turn within every repeat (ours, peer,
    ours, peer, ...) so that background load drifting during the run hits every contender;
    ``before(name)`` runs untimed before each call."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if before is not None:
                before(name)
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


class Progress:
    """``[12/40] label`` on one terminal line (plain lines when not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        bar = "#" * int(20 * self.done / max(self.total, 1))
        line = f"[{bar:<20}] {self.done}/{self.total} {label}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line[:120])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], stream=sys.stdout) -> None:
    cells = [[str(h) for h in headers]] + [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for i, r in enumerate(cells):
        stream.write("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) + "\n")
        if i == 0:
            stream.write("  ".join("-" * w for w in widths) + "\n")


def add_common_arguments(parser, *, data_dir: bool = True, sizes: str | None = None) -> None:
    """The options every fixture-based bench command takes (``sizes``: what ``--size`` means
    for this command, when not the plane benches' 2048² / 8192²)."""
    parser.add_argument(
        "--size",
        choices=("small", "full"),
        default="small",
        help=sizes or "small: 2048² planes (minutes); full: 8192² planes as in the design doc",
    )
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    if data_dir:
        parser.add_argument("--data-dir", help="where fixtures are generated once (default: the user's cache dir)")


def write_json(path: str | None, benchmark: str, size: str, rows: Sequence[dict]) -> None:
    """``{"benchmark", "size", "rows"}`` to ``path`` (nothing when path is None)."""
    if path:
        import json
        from pathlib import Path

        Path(path).write_text(json.dumps({"benchmark": benchmark, "size": size, "rows": list(rows)}, indent=1))
