"""``python -m tensor_server.bench plate-open``: opening a big plate (issue 42: "bounded memory
and time to open").

A plate of ``--rows`` × ``--columns`` wells (default 1536: 32 × 48) of ``--fields`` fields (9)
with ``--levels``-level pyramids (4), metadata only (``bench/writers.write_metadata_plate``),
opened by each ``--checkout`` (default: this one) one after the other, same run:

* ``open``: ``ZarrSource`` in a fresh interpreter (wall, CPU with its imports, peak RSS);
* ``listed``: ``serve`` of the plate's folder from the process's start until its catalog lists
  ``<source>/plate``, or its row says why it cannot (a server of that checkout, in a folder of
  its own: ``python -m`` puts the working directory first on the path, which would run this
  checkout whatever ``PYTHONPATH`` says), and its peak RSS.

Target (the issue's): a few seconds, bounded memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tensor_server.bench.timing import print_table, write_json
from tensor_server.bench.writers import write_metadata_plate

__all__ = ["add_arguments", "main", "measure"]

#: the open timed in a fresh interpreter: wall and CPU seconds, peak RSS (MB), tensors
_OPEN = """
import json, resource, sys, time
t0 = time.perf_counter()
from tensor_server.adapters.zarr import ZarrSource
src = ZarrSource(sys.argv[1], require_ome=True)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "rss_mb": ru.ru_maxrss / 1024, "tensors": len(src.tensors)}))
"""


def _env(checkout: Path, home: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{checkout}:{checkout / 'kernels'}", "TENSOR_SERVER_HOME": home}


def _open(plate: Path, checkout: Path, work: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _OPEN, str(plate)], env=_env(checkout, work), cwd=work, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"{checkout}: the open failed: {out.stderr[-400:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _listed(plate: Path, checkout: Path, work: str, limit_s: float = 600.0) -> dict[str, Any]:
    """Seconds from the server's start until its catalog lists the plate image (or why not)."""
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.server_process import server_process

    t0 = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(work)  # the server's ``python -m`` runs the checkout PYTHONPATH names, not this one
    try:
        with server_process(
            [plate.parent], Path(work) / "cache", env=_env(checkout, work), ready_seconds=limit_s
        ) as srv:
            client = TensorFlightClient(srv.location)
            while time.perf_counter() - t0 < limit_s:
                for row in client.query("SELECT unresolved_reason, tensors FROM sources").to_pylist():
                    if row["unresolved_reason"] or any(t["array_id"].endswith("/plate") for t in row["tensors"] or ()):
                        status = open(f"/proc/{srv.pid}/status").read()
                        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
                        return {
                            "listed_s": time.perf_counter() - t0,
                            "server_rss_mb": hwm / 1024,
                            "unreadable": row["unresolved_reason"] or "",
                        }
                time.sleep(0.05)
    finally:
        os.chdir(cwd)
    raise RuntimeError(f"{checkout}: the catalog listed no plate within {limit_s:.0f} s")


def measure(plate: Path, checkouts: list[Path]) -> list[dict[str, Any]]:
    """One row per checkout: its open in a fresh interpreter and its server's listing."""
    rows = []
    for checkout in checkouts:
        with tempfile.TemporaryDirectory(prefix="ts-bench-plate-open-") as work:
            row: dict[str, Any] = {"checkout": str(checkout), **_open(plate, checkout, work)}
            row.update(_listed(plate, checkout, work))
            row["load"] = os.getloadavg()[0]
        rows.append(row)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=32, help="plate rows (32 × 48 = 1536 wells)")
    parser.add_argument("--columns", type=int, default=48, help="plate columns")
    parser.add_argument("--fields", type=int, default=9, help="fields per well")
    parser.add_argument("--levels", type=int, default=4, help="levels of each field's pyramid")
    parser.add_argument(
        "--checkout", action="append", type=Path, help="a checkout to measure (repeat for an A/B; default: this one)"
    )
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(ns: argparse.Namespace) -> int:
    checkouts = ns.checkout or [Path(__file__).resolve().parents[2]]
    with tempfile.TemporaryDirectory(prefix="ts-bench-plate-open-data-") as data:
        t0 = time.perf_counter()
        plate = write_metadata_plate(
            Path(data) / "plates" / "plate.ome.zarr", ns.rows, ns.columns, ns.fields, levels=ns.levels
        )
        written_s = time.perf_counter() - t0
        rows = measure(plate, checkouts)
    print(
        f"{ns.rows}x{ns.columns} wells of {ns.fields} fields, {ns.levels}-level pyramids, metadata only "
        f"(written in {written_s:.0f} s); {os.cpu_count()} cores"
    )
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    write_json(ns.json_path, "plate-open", f"{ns.rows}x{ns.columns}x{ns.fields}x{ns.levels}", rows)
    return 0
