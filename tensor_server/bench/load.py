"""``python -m tensor_server.bench load``: well-behaved clients beside a hostile one.

A real writable server process (``python -m tensor_server serve``, HTTP door on) over the bench
fixtures; 8 biopb SDK clients (threads of this process, each with its own client) loop over
mixed requests — a whole 2048² plane, a crop, scaled area and nearest, a catalog query, an
upload, ROI writes and reads, HTTP chunks — for ``--seconds``, twice: alone, then with one
hostile client beside them cycling through every finding of issues 12 and 23
(``bench/load_attacks.py``). Reported per phase: requests, errors, p50/p99 latency of the
well-behaved clients, the server's RSS sampled every 0.25 s (peak and last), and the server's
CPU in the 2 s after the last request (``cpu_after_ms``: it must be back to idle).

Targets (issues 12, 23): 0 errors for the well-behaved clients, their p99 within 2× of the
phase without the hostile client, RSS bounded by the cache budget plus a constant, CPU idle
within 2 s of the last request.
"""
from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tensor_server.bench.server_process import cpu_seconds, server_process
from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_load"]

CLIENTS = 8


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _well_behaved(location: str, http_url: str, array_ids: list[str], stop: threading.Event, out: list,
                  errors: list) -> None:
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.load_attacks import extra_well_behaved_ops

    client = TensorFlightClient(location)
    ops = extra_well_behaved_ops(client, array_ids[0], http_url, f"{threading.get_ident()}")
    for aid in array_ids:
        ops += [
            ("full", lambda a=aid: client.get_array(a)),
            ("crop", lambda a=aid: client.get_array(a, slice_hint=(slice(300, 812), slice(100, 612)))),
            ("area x4", lambda a=aid: client.get_array(a, scale_hint=[4, 4], reduction_method="area")),
            ("nearest x8", lambda a=aid: client.get_array(a, scale_hint=[8, 8], reduction_method="nearest")),
        ]
    ops.append(("sql", lambda: client.query("SELECT source_id, source_type FROM sources")))
    i = 0
    while not stop.is_set():
        kind, op = ops[i % len(ops)]
        i += 1
        t0 = time.perf_counter()
        try:
            op()
            out.append((kind, (time.perf_counter() - t0) * 1e3))
        except Exception as exc:  # counted, never fatal to the run
            errors.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")


def _hostile(location: str, http_url: str, array_id: str, stop: threading.Event, sent: list) -> None:
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2, ticket_pb2

    from tensor_server.bench.load_attacks import hostile_attacks
    from tensor_server.core.chunk_id import ChunkId

    raw = flight.FlightClient(location)
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    info = raw.get_flight_info(flight.FlightDescriptor.for_command(
        descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString()))
    real = ticket_pb2.TensorTicket.FromString(info.endpoints[0].ticket.ticket)
    cid = ChunkId.decode(real.chunk_id)
    forged = ChunkId(**{**cid.__dict__, "start": (0, 0), "stop": (1 << 40, 1 << 40)}).encode()
    attacks = hostile_attacks(location, array_id, http_url, ticket_pb2.TensorTicket(chunk_id=forged).SerializeToString())
    i = 0
    while not stop.is_set():
        try:
            attacks[i % len(attacks)]()
        except Exception:  # noqa: BLE001 - refusals are the point
            pass
        sent.append(i)
        i += 1


def _phase(location: str, http_url: str, pid: int, array_ids: list[str], seconds: float, hostile: bool
           ) -> dict[str, Any]:
    stop = threading.Event()
    samples: list[tuple[str, float]] = []
    errors: list[str] = []
    sent: list[int] = []
    rss: list[int] = []
    threads = [threading.Thread(target=_well_behaved, args=(location, http_url, array_ids, stop, samples, errors),
                                daemon=True) for _ in range(CLIENTS)]
    if hostile:
        threads.append(threading.Thread(target=_hostile, args=(location, http_url, array_ids[0], stop, sent),
                                        daemon=True))
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rss.append(_rss_bytes(pid))
        time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    time.sleep(0.2)  # the last replies leave
    cpu0 = cpu_seconds(pid)
    time.sleep(2.0)
    cpu_after_ms = (cpu_seconds(pid) - cpu0) * 1e3
    lat = sorted(ms for _, ms in samples)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")

    return {"phase": "with hostile client" if hostile else "alone", "requests": len(samples), "errors": len(errors),
            "first_error": errors[0] if errors else "", "p50_ms": statistics.median(lat) if lat else float("nan"),
            "p99_ms": pct(0.99), "hostile_requests": len(sent), "rss_peak_mib": max(rss) / 2**20 if rss else 0.0,
            "rss_last_mib": rss[-1] / 2**20 if rss else 0.0, "cpu_after_ms": cpu_after_ms}


def run_load(size: str = "small", data_dir: str | None = None, json_path: str | None = None,
             seconds: float = 60.0, budget: int = 512 << 20) -> list[dict[str, Any]]:
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.fixtures import make_fixtures

    fixtures = make_fixtures(size, data_dir, with_czi=False)
    root = fixtures[0].path.parent
    wanted = {str(f.path.resolve()) for f in fixtures if f.name in ("ome-zarr", "ome-tiff")}
    with tempfile.TemporaryDirectory(prefix="ts-bench-load-") as tmp, \
            server_process([root], Path(tmp) / "cache", "--cache-max-bytes", str(budget),
                           "--write-dir", str(Path(tmp) / "write"), "--writable",
                           "--rois-db", str(Path(tmp) / "annotations.duckdb")) as served:
        location, http_url = served.location, served.http_url
        rows = TensorFlightClient(location).query("SELECT source_id, source_url FROM sources WHERE is_resolved").to_pylist()
        array_ids = [r["source_id"] for r in rows if r["source_url"].removeprefix("file://") in wanted]
        assert len(array_ids) == 2, f"expected the zarr and TIFF fixtures, found {rows}"
        results = [_phase(location, http_url, served.pid, array_ids, seconds, hostile) for hostile in (False, True)]
        alive = TensorFlightClient(location).health_check().get("status") == "SERVING"
    print_table(["phase", "requests", "errors", "p50 ms", "p99 ms", "hostile requests", "RSS peak MiB", "RSS last MiB",
                 "CPU ms in 2 s after"],
                [[r["phase"], r["requests"], r["errors"], r["p50_ms"], r["p99_ms"], r["hostile_requests"],
                  r["rss_peak_mib"], r["rss_last_mib"], r["cpu_after_ms"]] for r in results])
    base, attacked = results
    print(f"\np99 with / without the hostile client: {attacked['p99_ms'] / base['p99_ms']:.2f}x (target <= 2x); "
          f"server alive after the run: {alive}; cache budget {budget / 2**20:.0f} MiB")
    for r in results:
        if r["first_error"]:
            print(f"first error ({r['phase']}): {r['first_error']}")
    write_json(json_path, "load", size, results)
    return results


def add_arguments(parser) -> None:  # noqa: ANN001
    add_common_arguments(parser)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default 60)")
    parser.add_argument("--cache-max-bytes", type=int, default=512 << 20, help="the server's cache budget")


def main(args) -> int:  # noqa: ANN001
    run_load(args.size, args.data_dir, args.json_path, args.seconds, args.cache_max_bytes)
    return 0
