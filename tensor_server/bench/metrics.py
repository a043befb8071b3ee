"""``python -m tensor_server.bench metrics``: what metrics on costs a small cached chunk.

Two servers in one process over the same in-memory plane (uint16, 64×64 chunks: 8 KiB, the
size where per-request overhead shows most), each with its own chunk cache, every chunk read
once first so the timed reads are cache hits: one with ``metrics_port`` set (Prometheus
instruments recording, the listener up), one without (requests still timed for
Server-Timing and server_stats, as on every server). Timed: DoGet through pyarrow Flight and
GET of the same chunk over HTTP (httpx, keep-alive), one request at a time, alternating
between the two servers request by request (and which goes first, round by round) so that
drifting machine load hits both alike. Reported: p50
and p90 per request and the on/off ratio of the p50s (the target is ≤ 1.03).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

from tensor_server.bench.timing import print_table, write_json

__all__ = ["run_metrics"]

SHAPE, CHUNK = (512, 512), (64, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=400, help="requests per door, server and round (default 400)")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds (default 8)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_metrics(requests: int = 400, rounds: int = 8) -> list[dict]:
    import httpx
    import numpy as np
    import pyarrow.flight as flight
    from biopb.tensor import ticket_pb2

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.service import IN_PROCESS
    from tensor_server.testing import serving

    catalog = Catalog([])
    data = np.random.default_rng(1).integers(0, 60000, SHAPE, dtype=np.uint16)
    catalog.add_source(MemorySource(ArrayAdapter(data, "yx", chunk_shape=CHUNK), source_id="img"))
    catalog.first_scan_done.set()
    times: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for mode, extra in (("on", {"metrics_port": 0}), ("off", {})):
            cache_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"ts-bench-metrics-{mode}-"))
            cache = stack.enter_context(CacheManager(cache_dir))
            srv = stack.enter_context(serving(catalog, cache=cache, http=True, precache_bytes=0, **extra))
            plan = srv.runtime.describe(IN_PROCESS, "img", fields=["endpoints"]).plan
            tickets = [
                flight.Ticket(ticket_pb2.TensorTicket(chunk_id=c.chunk_id.encode()).SerializeToString())
                for c in plan.chunks[:16]
            ]
            paths = [
                f"/zarr/img/0/{c.chunk_id.bounds.start[0] // CHUNK[0]}.{c.chunk_id.bounds.start[1] // CHUNK[1]}"
                for c in plan.chunks[:16]
            ]
            fc = flight.FlightClient(srv.location)
            hc = stack.enter_context(httpx.Client(base_url=srv.http_url))
            for t, p in zip(tickets, paths):  # warm: every timed read is a cache hit
                fc.do_get(t).read_all()
                assert hc.get(p).status_code == 200
            servers[mode] = (fc, hc, tickets, paths)
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for door in ("flight", "http"):
                for i in range(requests):
                    for mode in order:  # request by request, so load drifting hits both alike
                        fc, hc, tickets, paths = servers[mode]
                        t0 = time.perf_counter()
                        if door == "flight":
                            fc.do_get(tickets[i % len(tickets)]).read_all()
                        else:
                            hc.get(paths[i % len(paths)])
                        times.setdefault((door, mode), []).append((time.perf_counter() - t0) * 1e3)
    catalog.close()
    rows = []
    for door in ("flight", "http"):
        on, off = times[(door, "on")], times[(door, "off")]
        rows.append(
            {
                "door": door,
                "p50_on_ms": statistics.median(on),
                "p50_off_ms": statistics.median(off),
                "p90_on_ms": _percentile(on, 0.9),
                "p90_off_ms": _percentile(off, 0.9),
                "ratio_p50": statistics.median(on) / statistics.median(off),
                "requests": len(on),
            }
        )
    return rows


def main(args: argparse.Namespace) -> int:
    load = os.getloadavg()
    rows = run_metrics(args.requests, args.rounds)
    print(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    print_table(
        ["door", "p50 on ms", "p50 off ms", "on/off p50", "p90 on ms", "p90 off ms", "requests"],
        [
            [
                r["door"],
                f"{r['p50_on_ms']:.3f}",
                f"{r['p50_off_ms']:.3f}",
                f"{r['ratio_p50']:.3f}",
                f"{r['p90_on_ms']:.3f}",
                f"{r['p90_off_ms']:.3f}",
                r["requests"],
            ]
            for r in rows
        ],
    )
    write_json(args.json_path, "metrics", "small", rows)
    return 0
