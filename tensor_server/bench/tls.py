"""``python -m tensor_server.bench tls``: what TLS costs, against plaintext, in one run.

Two servers over one catalog, one plaintext (``grpc://``, ``http://``) and one with the
self-signed certificate of ``service/tls.py`` (``grpc+tls://``, ``https://``), each with its
own warmed chunk cache, so a timed read measures the transport, not a decode. Read in rounds
that alternate plaintext and TLS (background load drifting during the run hits both):

* 8 MiB chunks by DoGet (one client thread): MB/s and median latency per chunk;
* 64 KiB chunks by DoGet: median latency per chunk (where the handshake-free per-call cost
  shows);
* 1 MiB chunks over HTTP (httpx, keep-alive): MB/s and median latency.

The target (issue 24): TLS at >= 0.7x plaintext MB/s for 8 MiB chunks. Every connection is made
before the timing, so no handshake is in the numbers (a client pays it once per connection).
"""

from __future__ import annotations

import argparse
import shutil
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_tls"]

_SETS = {  # name -> (shape, chunk shape): 8 MiB, 64 KiB and 1 MiB uint16 chunks
    "big": ((2048 * 6, 2048), (2048, 2048)),
    "small": ((128 * 16, 256 * 4), (128, 256)),
    "http": ((512 * 8, 1024 * 2), (512, 1024)),
}


class _Pair:
    """A serving runtime over ``catalog`` behind both doors, plaintext or TLS, with its own
    chunk cache (so each transport's warm reads come from its own cache)."""

    def __init__(self, catalog: Any, tls: Any) -> None:
        from tensor_server.cache import CacheManager
        from tensor_server.testing import start_serving

        self.cache_dir = tempfile.mkdtemp(prefix="ts-bench-tls-")
        self.cache = CacheManager(self.cache_dir)
        self.served = start_serving(catalog, cache=self.cache, http=True, tls=tls, precache_bytes=0)
        self.tls = tls

    def flight_client(self):  # pyarrow FlightClient
        import pyarrow.flight as flight

        extra = {"tls_root_certs": self.tls.cert_pem} if self.tls is not None else {}
        return flight.FlightClient(self.served.location, **extra)

    def http_client(self):  # httpx Client
        import httpx

        verify = ssl.create_default_context(cadata=self.tls.cert_pem.decode()) if self.tls is not None else True
        return httpx.Client(base_url=self.served.http_url, verify=verify, timeout=60)

    def close(self) -> None:
        self.served.stop()
        self.cache.close()
        shutil.rmtree(self.cache_dir, ignore_errors=True)


def _tickets(client, array_id: str) -> list:
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2

    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    info = client.get_flight_info(
        flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
    )
    return [ep.ticket for ep in info.endpoints]


def _doget(client, ticket) -> int:
    return client.do_get(ticket).read_all().column("data")[0].as_buffer().size


def _rounds(contenders: dict[str, Callable[[], list[tuple[float, int]]]], rounds: int) -> dict[str, dict[str, float]]:
    """Each contender's reads (a list of (seconds, bytes) per chunk), alternating per round;
    returns median ms per chunk, MB/s over all rounds, and CPU ms per chunk (this process:
    server and client both, so the encryption on both ends; unlike wall time it does not
    grow with other sessions' load on a shared machine)."""
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in contenders}
    cpu: dict[str, float] = {name: 0.0 for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            c0 = time.process_time()
            samples[name] += fn()
            cpu[name] += time.process_time() - c0
    out = {}
    for name, got in samples.items():
        seconds = sum(s for s, _ in got)
        out[name] = {
            "median_ms": statistics.median(s for s, _ in got) * 1e3,
            "MB_per_s": sum(b for _, b in got) / seconds / 1e6,
            "chunks": len(got),
            "cpu_ms_per_chunk": cpu[name] / len(got) * 1e3,
        }
    return out


def _timed(read: Callable[[Any], int], items: list) -> Callable[[], list[tuple[float, int]]]:
    def run() -> list[tuple[float, int]]:
        out = []
        for item in items:
            t0 = time.perf_counter()
            n = read(item)
            out.append((time.perf_counter() - t0, n))
        return out

    return run


def run_tls(
    rounds: int = 5, json_path: str | None = None, sets: dict[str, tuple[tuple[int, int], tuple[int, int]]] = _SETS
) -> list[dict[str, Any]]:
    """The table's rows; ``sets`` (name -> (shape, chunk shape) of ``_SETS``' three names) lets
    a test run the same code on tiny arrays."""
    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.catalog import Catalog
    from tensor_server.http.zarr_view import ZarrImage
    from tensor_server.service.tls import server_tls

    rng = np.random.default_rng(0)
    cat = Catalog([])
    for name, (shape, chunks) in sets.items():
        cat.add_source(
            MemorySource(
                ArrayAdapter(rng.integers(0, 60000, shape, dtype=np.uint16), "yx", chunk_shape=chunks), source_id=name
            )
        )
    cat.first_scan_done.set()
    home = Path(tempfile.mkdtemp(prefix="ts-bench-tls-home-"))
    pairs = {"plaintext": _Pair(cat, None), "TLS": _Pair(cat, server_tls(home))}
    rows: list[dict[str, Any]] = []
    try:
        flights = {k: p.flight_client() for k, p in pairs.items()}
        https = {k: p.http_client() for k, p in pairs.items()}
        tickets = {s: _tickets(flights["plaintext"], s) for s in ("big", "small")}
        view = ZarrImage(cat.find_tensor("http")[0], name="http")
        level = view.levels[0]
        grid = level.grid()
        paths = [f"/zarr/http/0/{i}.{j}" for i in range(grid[0]) for j in range(grid[1])]
        for k in pairs:  # warm: every chunk in each server's cache, every connection open
            for s in ("big", "small"):
                for t in tickets[s]:
                    _doget(flights[k], t)
            for p in paths:
                https[k].get(p).raise_for_status()
        cases = [
            ("8 MiB DoGet", {k: _timed(lambda t, c=flights[k]: _doget(c, t), tickets["big"]) for k in pairs}),
            ("64 KiB DoGet", {k: _timed(lambda t, c=flights[k]: _doget(c, t), tickets["small"]) for k in pairs}),
            ("1 MiB HTTP chunk", {k: _timed(lambda p, c=https[k]: len(c.get(p).content), paths) for k in pairs}),
        ]
        for case, contenders in cases:
            got = _rounds(contenders, rounds)
            plain = got["plaintext"]
            for k, r in got.items():
                rows.append({"case": case, "transport": k, **r, "x_plaintext": r["MB_per_s"] / plain["MB_per_s"]})
        for c in https.values():
            c.close()
    finally:
        for p in pairs.values():
            p.close()
        cat.close()
        shutil.rmtree(home, ignore_errors=True)
    print_table(
        ["case", "transport", "median ms/chunk", "MB/s", "x plaintext", "CPU ms/chunk"],
        [
            [
                r["case"],
                r["transport"],
                r["median_ms"],
                r["MB_per_s"],
                round(r["x_plaintext"], 2),
                r["cpu_ms_per_chunk"],
            ]
            for r in rows
        ],
    )
    write_json(json_path, "tls", "small", rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, data_dir=False)
    parser.add_argument("--rounds", type=int, default=5, help="alternating plaintext/TLS rounds per case")


def main(args: argparse.Namespace) -> int:
    run_tls(args.rounds, args.json_path)
    return 0
