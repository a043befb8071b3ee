"""``python -m tensor_server.bench crowd``: many viewers at once. A 63-tile viewport of the
viewport bench's 8192² image (no stored pyramid) fetched by 1, 2, 4 and 8 concurrent clients,
over HTTP (IIIF 512² JPEG tiles, one keep-alive connection per client, as browser connections)
and over Flight (the biopb SDK's ``get_array`` per tile, one ``TensorFlightClient`` per client,
each client a process of its own as viewers are: ``_SdkClients``), against a server process of
its own (``bench/server_process.py``).

* *warm*: the viewport's chunks cached (one untimed pass first); ``--repeats`` passes, the
  median pass reported: its wall time (the screen is drawn when the last tile lands), tiles
  per second, and the p50/p99 of every tile of every pass;
* *cold*: a fresh server (empty chunk cache) per client count, one pass;
* *nginx-N*: ``--replicas`` counts of ``--read-only`` servers, each with its own chunk cache,
  behind nginx configured by ``nginx-config`` (docs/deploying.md), warm, HTTP and Flight
  (``nginx-N-flight``); on one machine the replicas share its cores, so these rows measure
  what the balancer costs a tile, not what more machines add.

Beside it, in the same run, the floor of the HTTP stack: a bare uvicorn + Starlette server
answering a fixed 512² JPEG encoded per request by our encoder (``floor``), and its bytes
without the encode (``floor-static``), with the same clients; and the floor of the Flight
stack: bare pyarrow Flight answering the two calls a warm SDK tile makes on loopback
(``GetFlightInfo``, ``DoAction`` chunk_locate) with fixed answers, called by pyarrow clients
(``flight-floor``), and the floor of the SDK's path: the same SDK clients against bare pyarrow
Flight replaying our server's answers (``flight-replay``). What a warm IIIF tile costs above
``floor`` is ours: look-up, read of cached chunks, render, and the door's middleware; what a
warm SDK tile costs above ``flight-replay`` is our two calls' work.

Targets (issue 41): 8 clients' warm throughput >= 1.3x one client's and p50 <= 4x one
client's p50, for HTTP and for 6 Flight clients.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.fixtures import default_data_dir
from tensor_server.bench.server_process import ServerProcess, server_process, wait_idle
from tensor_server.bench.timing import add_common_arguments, print_table, write_json
from tensor_server.bench.viewport import TILE, viewport, write_fixtures
from tensor_server.deploy.nginx import nginx_config, parse_addresses, parse_listen
from tensor_server.deploy.nginx_process import nginx_binary, running_nginx

__all__ = ["add_arguments", "main", "serve_floor"]

Fetch = Callable[[tuple[int, int, int, int]], None]


def _pass(make_fetch: Callable[[], Fetch], tiles: list[tuple], clients: int) -> tuple[float, list[float]]:
    """(wall ms, per-tile ms) of one viewport: ``clients`` threads, each with its own client
    (``make_fetch``), taking the next tile from one queue until none is left."""
    todo: queue.SimpleQueue[tuple] = queue.SimpleQueue()
    for t in tiles:
        todo.put(t)
    fetchers = [make_fetch() for _ in range(clients)]

    def client(fetch: Fetch) -> list[float]:
        took: list[float] = []
        while True:
            try:
                t = todo.get_nowait()
            except queue.Empty:
                return took
            t0 = time.perf_counter()
            fetch(t)
            took.append((time.perf_counter() - t0) * 1e3)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        each = [ms for took in pool.map(client, fetchers) for ms in took]
    return (time.perf_counter() - t0) * 1e3, each


def _sdk_client(location: str, aid: str, factor: int, tasks: Any, results: Any) -> None:
    """One SDK client process: fetch each batch of tiles it is given, answer their times."""
    fetch = _flight_fetch(location, aid, factor)()
    results.put([])  # ready: imported and connected
    for batch in iter(tasks.get, None):
        took = []
        for t in batch:
            t0 = time.perf_counter()
            fetch(t)
            took.append((time.perf_counter() - t0) * 1e3)
        results.put(took)


class _SdkClients:
    """``clients`` SDK clients, each a process of its own, as viewers are: the biopb SDK
    spends 0.7-0.9 ms of Python per warm tile (2026-12-05), so SDK clients sharing one
    interpreter contend for its lock and measure the bench, not the server (threads: 6 clients
    1.10x one client's throughput, 2026-12-04; processes against the same server: 1.13-1.39x,
    machine shared). A pass deals the tiles round-robin, so each client has its share at once."""

    def __init__(self, location: str, aid: str, factor: int, clients: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding gRPC state
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(clients)]
        self.procs = [
            ctx.Process(target=_sdk_client, args=(location, aid, factor, q, self.results), daemon=True)
            for q in self.tasks
        ]
        for p in self.procs:
            p.start()
        for _ in self.procs:  # none is timed while it starts
            self.results.get(timeout=120)

    def run(self, tiles: list[tuple]) -> tuple[float, list[float]]:
        n = len(self.tasks)
        t0 = time.perf_counter()
        for i, q in enumerate(self.tasks):
            q.put(tiles[i::n])
        each = [ms for _ in range(n) for ms in self.results.get(timeout=600)]
        return (time.perf_counter() - t0) * 1e3, each

    def close(self) -> None:
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)


def _http_fetch(url: str, path_of: Callable[[tuple], str]) -> Callable[[], Fetch]:
    import http.client

    host, port = url.removeprefix("http://").split(":")

    def make() -> Fetch:
        conn = http.client.HTTPConnection(host, int(port), timeout=600)

        def fetch(t: tuple) -> None:
            conn.request("GET", path_of(t))
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")

        return fetch

    return make


def _flight_fetch(location: str, aid: str, factor: int) -> Callable[[], Fetch]:
    from biopb.tensor import TensorFlightClient

    def make() -> Fetch:
        client = TensorFlightClient(location, cache_bytes=0)  # every pass reads the server, not the SDK's cache

        def fetch(t: tuple) -> None:
            y, x, h, w = t
            client.get_array(
                aid, slice_hint=(slice(y, y + h), slice(x, x + w)), scale_hint=[factor, factor], reduction_method="mean"
            )

        return fetch

    return make


def _stats(passes: list[tuple[float, list[float]]], tiles: int) -> dict[str, float]:
    walls = [w for w, _ in passes]
    every = [ms for _, each in passes for ms in each]
    wall = float(np.median(walls))
    return {
        "wall_ms": wall,
        "tiles_per_s": tiles / wall * 1e3,
        "p50_ms": float(np.percentile(every, 50)),
        "p99_ms": float(np.percentile(every, 99)),
    }


Run = Callable[[list[tuple]], tuple[float, list[float]]]


def _warm(run: Run, tiles: list[tuple], repeats: int) -> dict[str, float]:
    run(tiles)  # untimed: chunks cached, rendering window measured, connections made
    return _stats([run(tiles) for _ in range(repeats)], len(tiles))


@contextmanager
def _clients(target: Any, clients: int) -> Iterator[Run]:
    """How ``clients`` clients fetch a viewport: SDK clients (``target`` is ``(location, array
    id, factor)``) each in a process of their own (``_SdkClients``); HTTP clients and the bare
    pyarrow floor client (``target`` makes a fetch) as threads, whose client-side Python is a
    fraction of a tile's cost."""
    if isinstance(target, tuple):
        location, aid, factor = target
        sdk = _SdkClients(location, aid, factor, clients)
        try:
            yield sdk.run
        finally:
            sdk.close()
    else:
        yield lambda tiles: _pass(target, tiles, clients)


def serve_floor(port: int) -> None:
    """The floor server, on uvicorn with httptools as our door: ``/tile`` answers a fixed 512²
    uint8 image encoded per request as our tiles are (``render.image.encode``: JPEG quality 90,
    in a worker thread), ``/static`` the same JPEG's bytes (the HTTP stack alone)."""
    import uvicorn
    from PIL import Image
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    from tensor_server.render.image import encode

    rng = np.random.default_rng(0)
    image = Image.fromarray((np.arange(TILE)[None, :] // 4 + rng.integers(0, 16, (TILE, TILE))).astype(np.uint8))
    static = encode(image, "jpg")

    async def tile(request: Any) -> Response:
        return Response(await run_in_threadpool(encode, image, "jpg"), media_type="image/jpeg")

    async def fixed(request: Any) -> Response:
        return Response(static, media_type="image/jpeg")

    app = Starlette(routes=[Route("/tile", tile), Route("/static", fixed)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools", access_log=False)


def serve_flight_floor(port: int) -> None:
    """The Flight floor server: bare pyarrow Flight, answering the two calls a warm tile costs
    the biopb SDK on loopback (``GetFlightInfo`` for the plan, ``DoAction`` for the chunk's
    location) with fixed answers of the same sizes as ours. What ours spends above it is
    its plan, look-up, rules and cache."""
    import pyarrow as pa
    from pyarrow import flight

    schema = pa.schema([("data", pa.binary())])
    location = b"x" * 200  # a chunk_locate answer's size (path, offset, length, inode)

    class Floor(flight.FlightServerBase):
        def get_flight_info(self, context: Any, descriptor: Any) -> Any:
            endpoint = flight.FlightEndpoint(b"t" * 120, [])
            return flight.FlightInfo(schema, descriptor, [endpoint], -1, -1)

        def do_action(self, context: Any, action: Any) -> Any:
            return [location]

    Floor(f"grpc://127.0.0.1:{port}").serve()


def serve_flight_replay(port: int, upstream: str) -> None:
    """The floor of the SDK's path: bare pyarrow Flight answering the SDK's ``GetFlightInfo``
    and ``chunk_locate`` with our server's own answers, asked of ``upstream`` once per distinct
    request and replayed after (the warm-up pass records them). The SDK clients then do all
    they do against ours (plan parsing, mapping the cached segment, the Arrow read); what ours
    spends above this is its work per call."""
    from pyarrow import flight

    source = flight.FlightClient(upstream)
    infos: dict[bytes, Any] = {}
    actions: dict[tuple[str, bytes], list[bytes]] = {}

    class Replay(flight.FlightServerBase):
        def get_flight_info(self, context: Any, descriptor: Any) -> Any:
            key = bytes(descriptor.command)
            if key not in infos:
                infos[key] = source.get_flight_info(descriptor)
            return infos[key]

        def do_action(self, context: Any, action: Any) -> Any:
            key = (action.type, action.body.to_pybytes())
            if key in actions:
                return actions[key]
            answer = [r.body.to_pybytes() for r in source.do_action(action)]
            if b'"available": false' not in answer[0]:  # a chunk not in the file tier yet: ask again
                actions[key] = answer
            return answer

        def do_get(self, context: Any, ticket: Any) -> Any:  # a chunk the fast path does not offer
            return flight.RecordBatchStream(source.do_get(ticket).read_all())

    Replay(f"grpc://127.0.0.1:{port}").serve()


def _flight_floor_fetch(location: str) -> Callable[[], Fetch]:
    from pyarrow import flight

    def make() -> Fetch:
        client = flight.FlightClient(location)
        descriptor = flight.FlightDescriptor.for_command(b"c" * 60)

        def fetch(t: tuple) -> None:
            client.get_flight_info(descriptor)
            list(client.do_action(flight.Action("chunk_locate", b"k" * 60)))

        return fetch

    return make


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _floor_process(serve: str, *args: str) -> Iterator[int]:
    """``serve(port, *args)`` of this module in a process of its own; yields the port once it
    listens."""
    port = _free_port()
    call = ", ".join([str(port), *(repr(a) for a in args)])
    code = f"from tensor_server.bench.crowd import {serve}; {serve}({call})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the floor server {serve} did not start") from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def _replicas_behind_nginx(
    image: Path, work: Path, count: int, serve_args: list[str]
) -> Iterator[tuple[ServerProcess, list[int]]]:
    """``count`` ``--read-only`` servers of ``image`` (each its own chunk cache, as replicas on
    separate machines) behind nginx configured by ``nginx-config``; yields nginx's HTTP and
    Flight addresses (as a ``ServerProcess`` of nginx's pid-less front) and the replicas' pids."""

    with ExitStack() as stack:
        replicas = [
            stack.enter_context(server_process([image], work / f"cache-{i}", "--read-only", *serve_args))
            for i in range(count)
        ]
        http_port, grpc_port = _free_port(), _free_port()
        config = nginx_config(
            parse_addresses(",".join(r.http_url.removeprefix("http://") for r in replicas), "--http"),
            parse_addresses(",".join(r.location.removeprefix("grpc://") for r in replicas), "--flight"),
            parse_listen(f"127.0.0.1:{http_port}", "--listen-http"),
            parse_listen(f"127.0.0.1:{grpc_port}", "--listen-flight"),
        )
        stack.enter_context(running_nginx(config, work / "nginx", [http_port, grpc_port]))
        front = ServerProcess(0, f"grpc://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}")
        yield front, [r.pid for r in replicas]


def _served_id(location: str) -> str:
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(location)
    aid = client.query("SELECT source_id FROM sources").to_pylist()[0]["source_id"]
    return client.get_descriptor(aid).array_id


def _iiif_path(aid: str, factor: int) -> Callable[[tuple], str]:
    def path(t: tuple) -> str:
        y, x, h, w = t
        return f"/iiif/3/{aid}/{x},{y},{w},{h}/{-(-w // factor)},/0/default.jpg"

    return path


def _measure(ns: argparse.Namespace, image: Path, factor: int, tiles: list[tuple]) -> list[dict[str, Any]]:

    counts = [int(c) for c in ns.clients.split(",")]
    replica_counts = [int(c) for c in ns.replicas.split(",") if c]
    if replica_counts and nginx_binary() is None:
        print("nginx is not installed (make test installs it): no rows through nginx", file=sys.stderr)
        replica_counts = []
    rows: list[dict[str, Any]] = []

    def row(door: str, state: str, clients: int, stats: dict[str, float]) -> None:
        rows.append({"door": door, "state": state, "scale": factor, "clients": clients, **stats})
        print_table(list(rows[-1]), [list(rows[-1].values())])

    with (
        tempfile.TemporaryDirectory(prefix="ts-bench-crowd-") as work,
        _floor_process("serve_floor") as http_floor,
        _floor_process("serve_flight_floor") as flight_floor,
    ):
        floor_url = f"http://127.0.0.1:{http_floor}"
        with (
            server_process([image], Path(work) / "warm-cache", *ns.serve_args) as srv,
            _floor_process("serve_flight_replay", srv.location) as replay,
        ):
            aid = _served_id(srv.location)
            doors: dict[str, Any] = {
                "http": _http_fetch(srv.http_url, _iiif_path(aid, factor)),
                "flight": (srv.location, aid, factor),
                "floor": _http_fetch(floor_url, lambda t: "/tile"),
                "floor-static": _http_fetch(floor_url, lambda t: "/static"),
                "flight-replay": (f"grpc://127.0.0.1:{replay}", aid, factor),
                "flight-floor": _flight_floor_fetch(f"grpc://127.0.0.1:{flight_floor}"),
            }
            for clients in counts:
                for door, target in doors.items():
                    with _clients(target, clients) as run:
                        wait_idle(srv.pid)
                        row(door, "warm", clients, _warm(run, tiles, ns.repeats))
        for n in replica_counts:
            with _replicas_behind_nginx(image, Path(work) / f"replicas-{n}", n, ns.serve_args) as (front, pids):
                aid = _served_id(front.location)
                doors = {
                    f"nginx-{n}": _http_fetch(front.http_url, _iiif_path(aid, factor)),
                    f"nginx-{n}-flight": (front.location, aid, factor),
                }
                for clients in counts:
                    for door, target in doors.items():
                        with _clients(target, clients) as run:
                            for pid in pids:
                                wait_idle(pid)
                            row(door, "warm", clients, _warm(run, tiles, ns.repeats))
        if ns.cold:
            for clients in counts:
                for door in ("http", "flight"):
                    with server_process([image], Path(work) / f"cold-{door}-{clients}", *ns.serve_args) as srv:
                        aid = _served_id(srv.location)
                        target = (
                            _http_fetch(srv.http_url, _iiif_path(aid, factor))
                            if door == "http"
                            else (srv.location, aid, factor)
                        )
                        with _clients(target, clients) as run:
                            wait_idle(srv.pid)
                            row(door, "cold", clients, _stats([run(tiles)], len(tiles)))
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, sizes="small: 8192² (the viewport bench's image); full: 32768²")
    parser.add_argument("--clients", default="1,2,4,8", help="comma-separated client counts")
    parser.add_argument("--scales", default="1,4", help="comma-separated viewport scale factors")
    parser.add_argument("--repeats", type=int, default=5, help="warm passes per measurement (median reported)")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold passes")
    parser.add_argument(
        "--replicas",
        default="1,3",
        help="comma-separated replica counts served through nginx (warm, HTTP and Flight); '' for none",
    )
    parser.add_argument(
        "--serve-args", default="", help="extra arguments for the server, e.g. '--workers 2' (one string)"
    )


def main(ns: argparse.Namespace) -> int:
    ns.serve_args = ns.serve_args.split()
    side = 8192 if ns.size == "small" else 32768
    root = Path(ns.data_dir or default_data_dir()) / f"viewport-{side}"
    root.mkdir(parents=True, exist_ok=True)
    write_fixtures(root, side)
    load = os.getloadavg()
    rows = []
    for factor in (int(f) for f in ns.scales.split(",")):
        rows += _measure(ns, root / "big.zarr", factor, viewport(side, factor))
    print(
        f"\n{side}² uint8 zarr, no stored pyramid; 63-tile viewports of 512² at each scale; "
        f"load average before the run {load[0]:.1f} ({os.cpu_count()} cores). warm: median of "
        f"{ns.repeats} passes, p50/p99 over every tile; floor = bare uvicorn + our 512² JPEG encode, "
        "floor-static = its bytes"
    )
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    for door in dict.fromkeys(r["door"] for r in rows):
        warm = {r["clients"]: r for r in rows if r["door"] == door and r["state"] == "warm" and r["scale"] == 1}
        if 1 in warm and max(warm) > 1:
            top = warm[max(warm)]
            print(
                f"{door}: {max(warm)} clients / 1 client at scale 1: throughput "
                f"{top['tiles_per_s'] / warm[1]['tiles_per_s']:.2f}x, p50 {top['p50_ms'] / warm[1]['p50_ms']:.2f}x"
            )
    write_json(ns.json_path, "crowd", ns.size, rows)
    return 0


if __name__ == "__main__":  # the floor server is started as ``python -c``; nothing else runs this
    raise SystemExit("run: python -m tensor_server.bench crowd")
