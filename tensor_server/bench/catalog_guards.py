"""``python -m tensor_server.bench guards``: what the catalog's safety guards cost.

1. A catalog query in its own throwaway DuckDB database (the guard that keeps a writing CTE
   from changing other clients' view) vs the same query on one shared connection.
2. A warm (cached) chunk through the biopb SDK with the stale-data check before it (a stat
   per chunk file under the chunk) vs the same read with the check switched off.
3. Opening a zarr array whose chunk files are stat'ed once (for the content version and
   the stale check) vs zarr-python's own ``open_array``.
4. A well-behaved client's catalog query while a hostile client sends never-ending SQL
   (``count(*) FROM range(1e15)``, stopped by the 10 s cap) vs the same query alone.

Ours and the peer alternate within each measurement; medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import median_ms, print_table, write_json

__all__ = ["run_guards"]


def _alternating(ours, peer, repeats: int) -> tuple[float, float]:  # callables
    """Medians of ours and the peer, run turn about so drift hits both alike."""
    a, b = [], []
    for _ in range(repeats):
        a.append(median_ms(ours, 1))
        b.append(median_ms(peer, 1))
    return float(np.median(a)), float(np.median(b))


def _sql_rows(repeats: int) -> list[dict[str, Any]]:
    import duckdb

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.catalog import Catalog

    cat = Catalog()
    for i in range(1000):
        cat.add_source(MemorySource(ArrayAdapter(np.zeros((4, 4), np.uint8)), source_id=f"s{i:04d}"))
    sql = "SELECT source_id, tensors FROM sources WHERE is_resolved ORDER BY source_id LIMIT 100"
    shared = duckdb.connect(":memory:", config={"enable_external_access": False})
    shared.register("sources", cat.sources_table())

    def ours() -> None:
        assert cat.query(sql).num_rows == 100

    def peer() -> None:
        assert shared.sql(sql).to_arrow_table().num_rows == 100

    ours(), peer()
    o, p = _alternating(ours, peer, repeats)
    cat.close()
    return [
        {
            "case": "catalog query, 1000 sources",
            "detail": "SELECT ... LIMIT 100",
            "baseline": "shared connection",
            "baseline_ms": p,
            "ours": "read-only snapshot + caps",
            "ours_ms": o,
        }
    ]


def _stale_check_rows(work: Path, repeats: int) -> list[dict[str, Any]]:
    import tifffile
    import zarr
    from biopb.tensor import TensorFlightClient

    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.testing import start_serving

    root = work / "root"
    root.mkdir()
    img = (np.arange(2048 * 2048, dtype=np.uint32) % 65521).astype(np.uint16).reshape(2048, 2048)
    zarr.open_array(
        str(root / "img.zarr"), mode="w", shape=img.shape, chunks=(256, 256), dtype=img.dtype, zarr_format=3
    )[...] = img
    tifffile.imwrite(root / "img.tif", img, tile=(256, 256))
    cat = Catalog([root])
    cat.scan()
    cache = CacheManager(work / "cache", max_total_bytes=1 << 30)
    server = start_serving(cat, cache=cache)
    rows = []
    try:
        client = TensorFlightClient(server.location)
        for rec in cat.records():
            tensor = rec.source.tensor()
            crop = (slice(0, 1024), slice(0, 2048))  # one 4 MiB chunk: 32 zarr chunk files
            client.get_array(tensor.array_id, slice_hint=crop)  # now cached

            def ours() -> None:
                client.get_array(tensor.array_id, slice_hint=crop)

            def peer() -> None:
                tensor.stale_reason = lambda bounds, exact=False: None  # the check switched off
                try:
                    client.get_array(tensor.array_id, slice_hint=crop)
                finally:
                    del tensor.stale_reason

            o, p = _alternating(ours, peer, repeats)
            rows.append(
                {
                    "case": f"warm 4 MiB read, {rec.type}",
                    "detail": "cached chunk via the SDK",
                    "baseline": "no stale check",
                    "baseline_ms": p,
                    "ours": "stale check",
                    "ours_ms": o,
                }
            )
    finally:
        server.stop()
        cat.close()
        cache.close()
    return rows


def _hostile_rows(repeats: int) -> list[dict[str, Any]]:
    from biopb.tensor import TensorFlightClient

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.catalog import Catalog
    from tensor_server.testing import start_serving

    cat = Catalog()
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((4, 4), np.uint8)), source_id="img"))
    server = start_serving(cat)
    stop = threading.Event()

    def hostile() -> None:
        c = TensorFlightClient(server.location)
        while not stop.is_set():
            try:
                c.query("SELECT count(*) FROM range(1000000000000000)")
            except Exception:  # refused at the cap, or the server shutting down
                pass

    try:
        client = TensorFlightClient(server.location)
        sql = "SELECT source_id FROM sources WHERE is_resolved"
        client.query(sql)
        alone = float(np.median([median_ms(lambda: client.query(sql), 1) for _ in range(repeats)]))
        attackers = [threading.Thread(target=hostile, daemon=True) for _ in range(2)]
        for a in attackers:
            a.start()
        import time

        time.sleep(0.5)  # both never-ending queries are running now
        beside = float(np.median([median_ms(lambda: client.query(sql), 1) for _ in range(repeats)]))
    finally:
        stop.set()
        server.stop()
        cat.close()
    return [
        {
            "case": "catalog query, 2 hostile SQL clients",
            "detail": "range(1e15) running beside",
            "baseline": "no hostile client",
            "baseline_ms": alone,
            "ours": "hostile beside",
            "ours_ms": beside,
        }
    ]


def _open_rows(work: Path, repeats: int) -> list[dict[str, Any]]:
    import zarr

    import tensor_server

    rows = []
    for n in (16, 64):
        path = work / f"grid{n}.zarr"
        zarr.open_array(str(path), mode="w", shape=(n * 16, n * 16), chunks=(16, 16), dtype="u1", zarr_format=3)[
            ...
        ] = 1

        def ours() -> None:
            tensor_server.open(path).close()

        def peer() -> None:
            zarr.open_array(str(path), mode="r")

        o, p = _alternating(ours, peer, repeats)
        rows.append(
            {
                "case": f"open zarr, {n * n} chunk files",
                "detail": "plain array",
                "baseline": "zarr.open_array",
                "baseline_ms": p,
                "ours": "tensor_server.open",
                "ours_ms": o,
            }
        )
    return rows


def run_guards(json_path: str | None = None, repeats: int = 15) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="ts-bench-guards-"))
    try:
        rows = (
            _sql_rows(repeats) + _stale_check_rows(work, repeats) + _open_rows(work, repeats) + _hostile_rows(repeats)
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(
        ["case", "detail", "baseline", "ms", "ours", "ms"],
        [[r["case"], r["detail"], r["baseline"], r["baseline_ms"], r["ours"], r["ours_ms"]] for r in rows],
    )
    write_json(json_path, "guards", "small", rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=15, help="alternating runs per case (default 15)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(args: argparse.Namespace) -> int:
    run_guards(args.json_path, args.repeats)
    return 0
