"""``python -m tensor_server.bench load``: well-behaved clients beside a hostile one.

A real writable server process (``python -m tensor_server serve``, HTTP and metrics doors on)
over the bench fixtures; 8 well-behaved clients (threads of this process, each with its own
biopb SDK client and HTTP client) loop over mixed requests — a whole 2048² plane, a crop, scaled
area and nearest, a catalog query, an upload read back, ROI writes and reads, an OME-Zarr chunk,
an IIIF tile, a metrics scrape — in three phases:

1. **quiet** (``--seconds``): the well-behaved clients alone;
2. **attacked** (``--hostile-seconds``, 180 by default): one hostile client beside them,
   cycling through every finding of issues 12, 23 and 38 (``bench/load_attacks.py``);
3. **after** (``--after-seconds``, 60 by default): the well-behaved clients alone again, so the
   server's memory can be seen to come back once the hostile client has stopped.

Every answer of a well-behaved client is checked: SDK reads against the fixture's pixels (the
NumPy oracle for scaled reads), an upload against what was uploaded, HTTP bodies against the
bytes the same URL answered before the phases (each verified once against the pixels where it
is raw). A mismatch is a *wrong answer*, counted apart from errors.

Reported per phase: requests, errors, wrong answers, p50/p99 latency, the server's RSS sampled
every 0.25 s (peak, the median of the phase's last 10 s), and the server's CPU in the 2 s after
the last request (``cpu_after_ms``: it must be back to idle).

Targets (issues 12, 23, 38): 0 errors and 0 wrong answers for the well-behaved clients; their
p99 with the hostile client within 2× of the quiet phase; RSS at the end of the after phase
within 10 % of the quiet phase's; CPU idle within 2 s of the last request.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.server_process import cpu_seconds, server_process
from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_load"]

CLIENTS = 8
#: the RSS a phase ends at: the median of its samples in the last this many seconds
RSS_TAIL_SECONDS = 10.0
Op = tuple[str, Callable[[], Any], Callable[[Any], bool]]


def _rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident bytes of ``pid``: all of it (``VmRSS``), or its anonymous memory (``RssAnon``:
    the heap, without the chunk cache's mapped segment files, which the kernel may drop)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _expected(n: int) -> dict[str, np.ndarray]:
    """The pixels each read of the well-behaved mix must return (every fixture holds ``plane(n)``)."""
    from tensor_server_kernels.reference import downsample

    from tensor_server.bench.fixtures import plane

    data = plane(n)
    return {
        "full": data,
        "crop": data[300:812, 100:612],
        "area x4": downsample(data, [4, 4], "area"),
        "nearest x8": downsample(data, [8, 8], "nearest"),
    }


def _http_references(http_url: str, metrics_url: str | None, array_id: str, pixels: np.ndarray) -> dict[str, bytes]:
    """The bytes each HTTP URL of the mix answers on the quiet server (the reference every
    later answer must equal); the OME-Zarr chunk is also checked against the pixels here."""
    import json

    import httpx

    from tensor_server.bench.load_attacks import well_behaved_urls

    refs = {}
    with httpx.Client(timeout=120) as http:
        for kind, url in well_behaved_urls(http_url, array_id).items():
            refs[kind] = http.get(url).raise_for_status().content
        zarray = json.loads(http.get(f"{http_url}/zarr/{array_id}/0/.zarray").raise_for_status().content)
        if zarray.get("compressor") is None:
            cy, cx = zarray["chunks"]
            chunk = np.frombuffer(refs["http chunk"], np.dtype(zarray["dtype"])).reshape(cy, cx)
            want = pixels[:cy, :cx]
            if not np.array_equal(chunk[: want.shape[0], : want.shape[1]], want):
                raise AssertionError("the quiet server's OME-Zarr chunk 0.0 differs from the fixture's pixels")
        if metrics_url:
            http.get(metrics_url).raise_for_status()
    return refs


def _well_behaved_ops(
    client: Any,
    http: Any,
    http_url: str,
    metrics_url: str | None,
    array_ids: list[str],
    expected: dict[str, np.ndarray],
    refs: dict[str, bytes],
) -> list[Op]:
    from tensor_server.bench.load_attacks import extra_well_behaved_ops, well_behaved_urls

    ops: list[Op] = list(extra_well_behaved_ops(client, array_ids[0], f"{threading.get_ident()}"))
    for aid in array_ids:
        reads = {
            "full": lambda a=aid: client.get_array(a),
            "crop": lambda a=aid: client.get_array(a, slice_hint=(slice(300, 812), slice(100, 612))),
            "area x4": lambda a=aid: client.get_array(a, scale_hint=[4, 4], reduction_method="area"),
            "nearest x8": lambda a=aid: client.get_array(a, scale_hint=[8, 8], reduction_method="nearest"),
        }
        ops += [
            (kind, read, lambda got, want=expected[kind]: np.array_equal(np.asarray(got), want))
            for kind, read in reads.items()
        ]
    ops.append(
        (
            "sql",
            lambda: client.query("SELECT source_id, source_type FROM sources"),
            lambda table: table.num_rows >= len(array_ids),
        )
    )
    for kind, url in well_behaved_urls(http_url, array_ids[0]).items():
        ops.append((kind, lambda u=url: http.get(u).raise_for_status().content, lambda body, k=kind: body == refs[k]))
    if metrics_url:
        ops.append(
            ("metrics", lambda: http.get(metrics_url).raise_for_status().text, lambda text: "tensor_server_" in text)
        )
    return ops


def _well_behaved(ops_of: Callable[[], list[Op]], stop: threading.Event, out: list, errors: list, wrong: list) -> None:
    ops = ops_of()
    i = 0
    while not stop.is_set():
        kind, op, check = ops[i % len(ops)]
        i += 1
        t0 = time.perf_counter()
        try:
            result = op()
        except AssertionError as exc:  # an op's own read-back check (the upload)
            wrong.append(f"{kind}: {str(exc)[:200]}")
            continue
        except Exception as exc:  # counted, never fatal to the run
            errors.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        out.append((kind, (time.perf_counter() - t0) * 1e3))
        if not check(result):
            wrong.append(f"{kind}: the answer differs from the expected one")


def _hostile(
    location: str, http_url: str, metrics_url: str | None, array_id: str, stop: threading.Event, sent: list
) -> None:
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2, ticket_pb2

    from tensor_server.bench.load_attacks import hostile_attacks
    from tensor_server.core.chunk_id import ChunkId

    raw = flight.FlightClient(location)
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    info = raw.get_flight_info(
        flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
    )
    real = ticket_pb2.TensorTicket.FromString(info.endpoints[0].ticket.ticket)
    cid = ChunkId.decode(real.chunk_id)
    forged = dataclasses.replace(cid, start=(0, 0), stop=(1 << 40, 1 << 40)).encode()
    attacks, close = hostile_attacks(
        location, array_id, http_url, metrics_url, ticket_pb2.TensorTicket(chunk_id=forged).SerializeToString()
    )
    i = 0
    try:
        while not stop.is_set():
            try:
                attacks[i % len(attacks)]()
            except Exception:  # refusals are the point
                pass
            sent.append(i)
            i += 1
    finally:
        close()


def _phase(
    name: str,
    ops_of: Callable[[], list[Op]],
    pid: int,
    seconds: float,
    hostile: Callable[[threading.Event, list], None] | None = None,
) -> dict[str, Any]:
    stop = threading.Event()
    samples: list[tuple[str, float]] = []
    errors: list[str] = []
    wrong: list[str] = []
    sent: list[int] = []
    rss: list[tuple[float, int]] = []
    anon: list[tuple[float, int]] = []
    threads = [
        threading.Thread(target=_well_behaved, args=(ops_of, stop, samples, errors, wrong), daemon=True)
        for _ in range(CLIENTS)
    ]
    if hostile is not None:
        threads.append(threading.Thread(target=hostile, args=(stop, sent), daemon=True))
    for t in threads:
        t.start()
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        rss.append((time.monotonic() - start, _rss_bytes(pid)))
        anon.append((time.monotonic() - start, _rss_bytes(pid, "RssAnon")))
        time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    time.sleep(0.2)  # the last replies leave
    cpu0 = cpu_seconds(pid)
    time.sleep(2.0)
    cpu_after_ms = (cpu_seconds(pid) - cpu0) * 1e3
    lat = sorted(ms for _, ms in samples)

    def tail(samples: list[tuple[float, int]]) -> float:
        last = [b for t, b in samples if t >= seconds - RSS_TAIL_SECONDS] or [b for _, b in samples[-1:]]
        return statistics.median(last) / 2**20 if last else 0.0

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")

    by_kind: dict[str, list[float]] = {}
    for kind, ms in samples:
        by_kind.setdefault(kind, []).append(ms)
    return {
        "phase": name,
        "requests": len(samples),
        "errors": len(errors),
        "wrong": len(wrong),
        "p50_ms_by_kind": {k: statistics.median(v) for k, v in sorted(by_kind.items())},
        "first_error": errors[0] if errors else "",
        "first_wrong": wrong[0] if wrong else "",
        "p50_ms": statistics.median(lat) if lat else float("nan"),
        "p99_ms": pct(0.99),
        "hostile_requests": len(sent),
        "rss_peak_mib": max(b for _, b in rss) / 2**20 if rss else 0.0,
        "rss_end_mib": tail(rss),
        "rss_anon_end_mib": tail(anon),
        "cpu_after_ms": cpu_after_ms,
    }


def run_load(
    size: str = "small",
    data_dir: str | None = None,
    json_path: str | None = None,
    seconds: float = 60.0,
    budget: int = 512 << 20,
    hostile_seconds: float = 180.0,
    after_seconds: float = 60.0,
    control: bool = False,
) -> list[dict[str, Any]]:
    import socket

    import httpx
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.fixtures import SIZES, make_fixtures

    fixtures = make_fixtures(size, data_dir, with_czi=False)
    root = fixtures[0].path.parent
    wanted = {str(f.path.resolve()) for f in fixtures if f.name in ("ome-zarr", "ome-tiff")}
    expected = _expected(SIZES[size])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    with (
        tempfile.TemporaryDirectory(prefix="ts-bench-load-") as tmp,
        server_process(
            [root],
            Path(tmp) / "cache",
            "--cache-max-bytes",
            str(budget),
            "--write-dir",
            str(Path(tmp) / "write"),
            "--writable",
            "--rois-db",
            str(Path(tmp) / "annotations.duckdb"),
            "--metrics-port",
            str(metrics_port),
        ) as served,
    ):
        location, http_url = served.location, served.http_url
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        rows = (
            TensorFlightClient(location)
            .query("SELECT source_id, source_url FROM sources WHERE is_resolved")
            .to_pylist()
        )
        array_ids = [r["source_id"] for r in rows if r["source_url"].removeprefix("file://") in wanted]
        assert len(array_ids) == 2, f"expected the zarr and TIFF fixtures, found {rows}"
        refs = _http_references(http_url, metrics_url, array_ids[0], expected["full"])

        def ops_of() -> list[Op]:
            return _well_behaved_ops(
                TensorFlightClient(location),
                httpx.Client(timeout=120),
                http_url,
                metrics_url,
                array_ids,
                expected,
                refs,
            )

        def hostile(stop: threading.Event, sent: list) -> None:
            _hostile(location, http_url, metrics_url, array_ids[0], stop, sent)

        _phase("warm-up", ops_of, served.pid, min(seconds, 10.0))
        results = [
            _phase("quiet", ops_of, served.pid, seconds),
            _phase(
                "control: no hostile client" if control else "with hostile client",
                ops_of,
                served.pid,
                hostile_seconds,
                None if control else hostile,
            ),
            _phase("after", ops_of, served.pid, after_seconds),
        ]
        alive = TensorFlightClient(location).health_check().get("status") == "SERVING"
    _report(results, alive, budget)
    write_json(json_path, "load", size, results)
    return results


def _report(results: list[dict[str, Any]], alive: bool, budget: int) -> None:
    print_table(
        [
            "phase",
            "requests",
            "errors",
            "wrong",
            "p50 ms",
            "p99 ms",
            "hostile requests",
            "RSS peak MiB",
            "RSS end MiB",
            "anon end MiB",
            "CPU ms in 2 s after",
        ],
        [
            [
                r["phase"],
                r["requests"],
                r["errors"],
                r["wrong"],
                r["p50_ms"],
                r["p99_ms"],
                r["hostile_requests"],
                r["rss_peak_mib"],
                r["rss_end_mib"],
                r["rss_anon_end_mib"],
                r["cpu_after_ms"],
            ]
            for r in results
        ],
    )
    quiet, attacked, after = results
    kinds = sorted(quiet["p50_ms_by_kind"])
    print("\np50 ms by request kind:")
    print_table(
        ["kind", *(r["phase"] for r in results)],
        [[k, *(r["p50_ms_by_kind"].get(k, float("nan")) for r in results)] for k in kinds],
    )
    print(
        f"\np99 with / without the hostile client: {attacked['p99_ms'] / quiet['p99_ms']:.2f}x (target <= 2x); "
        f"RSS after / quiet: {after['rss_end_mib'] / quiet['rss_end_mib']:.3f} (target <= 1.10), anonymous "
        f"{after['rss_anon_end_mib'] / quiet['rss_anon_end_mib']:.3f}; "
        f"server alive after the run: {alive}; cache budget {budget / 2**20:.0f} MiB"
    )
    for r in results:
        for key in ("first_error", "first_wrong"):
            if r[key]:
                print(f"{key.replace('_', ' ')} ({r['phase']}): {r[key]}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the quiet phase (default 60)")
    parser.add_argument(
        "--hostile-seconds", type=float, default=180.0, help="length of the phase with the hostile client (default 180)"
    )
    parser.add_argument(
        "--after-seconds",
        type=float,
        default=60.0,
        help="length of the phase after it, whose end RSS is compared (default 60)",
    )
    parser.add_argument("--cache-max-bytes", type=int, default=512 << 20, help="the server's cache budget")
    parser.add_argument(
        "--control",
        action="store_true",
        help="the same phases with no hostile client: the memory growth of the honest load alone",
    )


def main(args: argparse.Namespace) -> int:
    run_load(
        args.size,
        args.data_dir,
        args.json_path,
        args.seconds,
        args.cache_max_bytes,
        args.hostile_seconds,
        args.after_seconds,
        args.control,
    )
    return 0
