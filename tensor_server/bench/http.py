"""``python -m tensor_server.bench http``: the same chunks over HTTP (OME-Zarr) and Flight DoGet.

One server (chunk cache on) over the bench fixtures' OME-Zarr plane, its HTTP front end beside
it. For level 0 and a computed level (area ×4), every chunk of the level is read once cold
(empty cache: decoded from the source) and then warm (cache hits), through a plain HTTP client
(httpx, keep-alive) and through pyarrow Flight DoGet (no localhost fast path, so both move the
bytes over a socket). Reported: median latency per chunk and MB/s, cold and warm.

Then throughput (issue 25): one warm 8 MiB chunk grid (2048² uint16 chunks, every chunk cached
first) read for ``--seconds`` by 1 and by 8 concurrent clients over HTTP (one keep-alive
connection per client) and over Flight DoGet (one FlightClient per client), the two
transports alternating round by round; reported MB/s (medians of the rounds) and HTTP/Flight.

Then precache: a viewer-like burst (every chunk of level 0 in row order, as a pan) timed with
precache off and on, alternating, to show that precache work does not slow a client's burst
(it runs at the lowest priority and only while no client read is in flight).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_http"]


class _Served:
    #: below the fixture's plane, so even ``--size small`` has computed levels
    POLICY_PLANE_PX = 512 * 512

    def __init__(self, root: Path, precache_bytes: int = 0) -> None:
        from tensor_server.cache import CacheManager
        from tensor_server.catalog import Catalog
        from tensor_server.testing import serving

        self.catalog = Catalog([root])
        self.catalog.scan()
        self._stack = contextlib.ExitStack()
        self.cache = CacheManager(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="ts-bench-http-")))
        served = self._stack.enter_context(
            serving(
                self.catalog,
                cache=self.cache,
                http=True,
                precache_bytes=precache_bytes,
                plane_budget_px=self.POLICY_PLANE_PX,
            )
        )
        self.server, self.http = served.flight, served.http
        self.runtime = served.runtime
        self.policy = served.runtime.policy

    def close(self) -> None:
        self.cache.close()  # before the stack removes its folder
        self._stack.close()
        self.catalog.close()


def _level_reads(served: _Served, array_id: str, level_index: int):
    """(http paths, flight tickets, bytes per chunk, level) for every chunk of one level, or
    None when the tensor has no such level."""
    import itertools
    import math

    import pyarrow.flight as flight
    from biopb.tensor import ticket_pb2

    from tensor_server.http.zarr_view import ZarrImage

    tensor, _ = served.runtime.catalog.find_tensor(array_id)
    view = ZarrImage(tensor, name=array_id, policy=served.policy)
    if level_index >= len(view.levels):
        return None
    level = view.levels[level_index]
    keys = list(itertools.product(*[range(g) for g in level.grid()]))
    cids = [view.chunk_id(level, k) for k in keys]
    paths = [f"/zarr/{array_id}/{level.path}/{'.'.join(map(str, k))}" for k in keys]
    tickets = [flight.Ticket(ticket_pb2.TensorTicket(chunk_id=c.encode()).SerializeToString()) for c in cids]
    nbytes = [math.prod(c.output_shape) * tensor.dtype.itemsize for c in cids]
    return paths, tickets, nbytes, level


def _time_each(fetch, items) -> list[float]:
    out = []
    for item in items:
        t0 = time.perf_counter()
        fetch(item)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def run_http(
    size: str = "small", data_dir: str | None = None, json_path: str | None = None, repeats: int = 5
) -> list[dict[str, Any]]:
    import http.client

    import pyarrow.flight as flight

    from tensor_server.bench.fixtures import make_fixtures
    from tensor_server.core.downsample import warm_up

    warm_up()
    fixture = next(f for f in make_fixtures(size, data_dir, with_czi=False) if f.name == "ome-zarr")
    root = fixture.path
    rows: list[dict[str, Any]] = []
    for level_index, label in ((0, "level 0"), (1, "level 1 (area x2)"), (2, "level 2 (area x4)")):
        for transport in ("HTTP (OME-Zarr)", "Flight DoGet"):
            served = _Served(root)
            try:
                array_id = served.runtime.catalog.records()[0].source_id
                reads = _level_reads(served, array_id, level_index)
                if reads is None:
                    continue
                paths, tickets, nbytes, level = reads
                if transport.startswith("HTTP"):
                    # http.client with keep-alive: the least client overhead, so the server is measured
                    client = http.client.HTTPConnection("127.0.0.1", served.http.port, timeout=120)

                    def fetch(i: int) -> None:
                        client.request("GET", paths[i])
                        r = client.getresponse()
                        body = r.read()
                        assert r.status == 200 and len(body) >= nbytes[i]
                else:
                    client = flight.FlightClient(served.server.location)

                    def fetch(i: int) -> None:
                        client.do_get(tickets[i]).read_all()

                idx = list(range(len(paths)))
                cold = _time_each(fetch, idx)
                warm = [statistics.median(_time_each(fetch, [i] * repeats)) for i in idx]
                total = sum(nbytes) / 1e6
                rows.append(
                    {
                        "level": label,
                        "transport": transport,
                        "chunks": len(idx),
                        "chunk": "x".join(map(str, level.chunks)),
                        "cold_ms": statistics.median(cold),
                        "warm_ms": statistics.median(warm),
                        "cold_mb_s": total / (sum(cold) / 1e3),
                        "warm_mb_s": total / (sum(warm) / 1e3),
                    }
                )
                client.close()
            finally:
                served.close()
    print_table(
        ["level", "transport", "chunks", "chunk", "cold ms", "warm ms", "cold MB/s", "warm MB/s"],
        [
            [
                r["level"],
                r["transport"],
                r["chunks"],
                r["chunk"],
                r["cold_ms"],
                r["warm_ms"],
                r["cold_mb_s"],
                r["warm_mb_s"],
            ]
            for r in rows
        ],
    )
    rows += run_http_throughput()
    rows += _precache_burst(root)
    write_json(json_path, "http", size, rows)
    return rows


def run_http_throughput(
    seconds: float = 2.0, rounds: int = 3, clients: tuple[int, ...] = (1, 8), server: str | None = None
) -> list[dict[str, Any]]:
    """MB/s of warm 8 MiB chunks over HTTP and over Flight DoGet, by 1 and 8 concurrent
    clients, rounds alternating between the transports (module docstring). The server runs
    in a child process (``--serve-chunks``), so the clients' Python never holds its GIL;
    ``server`` picks the HTTP server (``HttpFrontEnd``'s choices; None: its default)."""
    import base64
    import concurrent.futures
    import http.client
    import json
    import os
    import subprocess
    import sys
    import threading

    import pyarrow.flight as flight

    from tensor_server.bench.throughput import read_doget

    child = subprocess.Popen(
        [sys.executable, "-m", "tensor_server.bench.http", "--serve-chunks", server or ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        spec = json.loads(child.stdout.readline())
        paths, port, location = spec["paths"], spec["http_port"], spec["flight"]
        tickets = [flight.Ticket(base64.b64decode(t)) for t in spec["tickets"]]
        local = threading.local()

        def http_get(i: int) -> int:
            conn = local.__dict__.get("http")
            if conn is None:
                conn = local.http = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("GET", paths[i])
            r = conn.getresponse()
            body = r.read()
            assert r.status == 200 and len(body) == 8 << 20, (r.status, len(body))
            return len(body)

        def flight_get(i: int) -> int:
            c = local.__dict__.get("flight")
            if c is None:
                c = local.flight = flight.FlightClient(location)
            return read_doget(c, tickets[i])

        for _ in range(rounds):
            for n in clients:
                for name, fn in (("HTTP", http_get), ("Flight DoGet", flight_get)):
                    with concurrent.futures.ThreadPoolExecutor(n) as pool:
                        list(pool.map(fn, range(n)))  # connect every client
                        got, t0 = 0, time.perf_counter()
                        while time.perf_counter() - t0 < seconds:
                            got += sum(pool.map(fn, [k % len(paths) for k in range(4 * n)]))
                        rates.setdefault((name, n), []).append(got / (time.perf_counter() - t0) / 1e6)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    rows = []
    for n in clients:
        h, f = (statistics.median(rates[(t, n)]) for t in ("HTTP", "Flight DoGet"))
        rows.append(
            {
                "level": "warm 8 MiB chunks",
                "transport": "HTTP vs Flight DoGet",
                "server": server or "default",
                "clients": n,
                "http_mb_s": h,
                "flight_mb_s": f,
                "ratio": h / f,
                "load_average": os.getloadavg()[0],
            }
        )
    print(
        f"\nwarm 8 MiB chunks, MB/s (HTTP server: {server or 'default'}; medians of {rounds} rounds of "
        f"{seconds:.0f} s, transports alternating; server in a child process):"
    )
    print_table(
        ["clients", "HTTP MB/s", "Flight DoGet MB/s", "HTTP/Flight", "load avg"],
        [
            [r["clients"], r["http_mb_s"], r["flight_mb_s"], f"{r['ratio']:.2f}", f"{r['load_average']:.1f}"]
            for r in rows
        ],
    )
    return rows


def _serve_chunks(server: str) -> None:
    """The child of ``run_http_throughput``: a 4 x 2 grid of 8 MiB chunks (2048² uint16) in
    memory, served with a chunk cache over Flight and HTTP, every chunk read once; prints the
    HTTP port, the Flight location, the chunk paths and tickets as one JSON line and serves
    until stdin closes."""
    import base64
    import json
    import shutil
    import sys

    import numpy as np

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.testing import serving

    arr = np.random.default_rng(0).integers(0, 60000, (2048 * 4, 2048 * 2), dtype=np.uint16)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(2048, 2048)), source_id="tp"))
    cat.first_scan_done.set()
    cache_dir = tempfile.mkdtemp(prefix="ts-bench-http-tp-")
    cache = CacheManager(cache_dir)
    try:
        with serving(
            cat, cache=cache, http=True, http_parser=server or None, plane_budget_px=_Served.POLICY_PLANE_PX
        ) as served:

            class _View:  # what _level_reads needs of a _Served
                runtime, policy = served.runtime, served.runtime.policy

            paths, tickets, nbytes, _ = _level_reads(_View, "tp", 0)
            assert set(nbytes) == {8 << 20}, nbytes
            import http.client

            conn = http.client.HTTPConnection("127.0.0.1", served.http.port, timeout=120)
            for p in paths:  # every chunk into the cache
                conn.request("GET", p)
                conn.getresponse().read()
            conn.close()
            print(
                json.dumps(
                    {
                        "http_port": served.http.port,
                        "flight": served.flight.location,
                        "paths": paths,
                        "tickets": [base64.b64encode(t.ticket).decode() for t in tickets],
                    }
                ),
                flush=True,
            )
            sys.stdin.read()
    finally:
        cache.close()
        cat.close()
        shutil.rmtree(cache_dir, ignore_errors=True)


def _precache_burst(root: Path, rounds: int = 3) -> list[dict[str, Any]]:
    """A pan over level 0 with precache off and on (alternating, fresh caches): the burst
    must not be slower with precache on."""
    import httpx

    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            served = _Served(root, precache_bytes=(64 << 20) if mode == "on" else 0)
            try:
                array_id = served.runtime.catalog.records()[0].source_id
                paths, _, _, _ = _level_reads(served, array_id, 0)
                with httpx.Client(base_url=served.http.url, timeout=120) as client:
                    t0 = time.perf_counter()
                    for p in paths:
                        client.get(p)
                    times[mode].append((time.perf_counter() - t0) * 1e3)
            finally:
                served.close()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(
        f"\nlevel-0 pan ({len(paths)} chunks, cold): precache off {off:.1f} ms, on {on:.1f} ms "
        f"(on/off {on / off:.2f}; medians of {rounds}, alternating)"
    )
    return [{"level": "pan burst", "transport": "HTTP", "precache_off_ms": off, "precache_on_ms": on}]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def main(args: argparse.Namespace) -> int:
    run_http(args.size, args.data_dir, args.json_path)
    return 0


if __name__ == "__main__" and __import__("sys").argv[1:2] == ["--serve-chunks"]:
    _serve_chunks(__import__("sys").argv[2] if len(__import__("sys").argv) > 2 else "")
