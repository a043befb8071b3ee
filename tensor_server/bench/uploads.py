"""``python -m tensor_server.bench uploads``: upload throughput through the biopb SDK.

A uint16 array (256 MiB by default, 8 MiB chunks) is sent with ``upload_array`` (plan,
parallel DoPuts, READY) to ``cache://`` and to ``zarr://`` (zarr's compression included) on
our server. Peers, measured in the same run with rounds alternating and medians reported:

* the issue's peer: a bare pyarrow Flight server whose DoPut reads the stream and discards
  it, fed the same chunks with plain pyarrow DoPuts (same grid, same batch construction, as
  many threads as the SDK's dask scheduler uses);
* the same ``upload_array`` against a minimal server that answers add_tensor, the write plan
  and set_upload_status and discards every DoPut: the SDK's own client-side cost (it wraps
  the array in ``dask.array.from_array``, which hashes all of it) is then on both sides, so
  ours against it is the server's share alone;
* the same bytes written to the write_dir's filesystem with plain writes and an fsync, no
  Flight: a durable store cannot beat its disk, and neither discarding peer touches one.

All three servers run together in one child process (``--serve``), apart from the client,
so the client's Python never competes with a server's for one interpreter lock.
``--write-dir-on`` picks the filesystem (e.g. /dev/shm takes the disk out).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["run_uploads"]

BARE = "bare pyarrow DoPut (discards)"
SDK_PEER = "SDK upload_array to a server that discards"
DISK = "disk: write + fsync, no Flight"


def run_uploads(
    mib: int = 256, repeats: int = 3, json_path: str | None = None, write_dir_on: str | None = None
) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient
    from biopb.tensor._upload import _plan_write, _put_chunk
    from biopb.tensor.ticket_pb2 import PutCommand

    plane = 2048 * 2048 * 2  # one 8 MiB chunk per plane
    arr = np.random.default_rng(0).integers(0, 4096, (max(1, mib * (1 << 20) // plane), 2048, 2048), dtype=np.uint16)
    chunk = (1, 2048, 2048)
    threads = os.cpu_count() or 1
    write_dir = tempfile.mkdtemp(prefix="ts-bench-up-", dir=write_dir_on)
    host = subprocess.Popen(
        [sys.executable, "-m", "tensor_server.bench.uploads", "--serve", write_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ports = json.loads(host.stdout.readline())
        ours_at, bare_at, peer_at = (f"grpc://127.0.0.1:{ports[k]}" for k in ("ours", "bare", "sdk_peer"))
        client, peer_client = TensorFlightClient(ours_at), TensorFlightClient(peer_at)
        counter = iter(range(1 << 30))
        local = threading.local()
        schema = pa.schema([pa.field("data", pa.uint16())])
        to_discard: list[str] = []

        def pooled(location: str) -> flight.FlightClient:
            clients = local.__dict__.setdefault("clients", {})
            if location not in clients:
                clients[location] = flight.FlightClient(location)
            return clients[location]

        def bare_put(i: int) -> None:
            desc = flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=b"%d" % i).SerializeToString())
            writer, reader = pooled(bare_at).do_put(desc, schema)
            with writer:
                writer.write_batch(pa.record_batch([pa.array(arr[i].ravel(), type=pa.uint16())], schema=schema))
                writer.done_writing()
                reader.read()

        def run_bare() -> None:
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(bare_put, range(arr.shape[0])))

        def run_sdk(c: Any, scheme: str) -> str:
            desc = c.setup_array_upload(f"{scheme}://scratch/@fields/bench-{next(counter)}", arr, chunk_shape=chunk)
            status = c.upload_array(desc, arr)
            assert status["state"] == "READY" and status["uploaded_chunks"] == arr.shape[0], status
            return desc.array_id

        def run_ours_threads() -> str:
            """The SDK's own plan and _put_chunk on plain threads (the bare peer's driver)."""
            desc = client.setup_array_upload(f"cache://scratch/@fields/bench-{next(counter)}", arr, chunk_shape=chunk)

            def put(p: Any) -> None:
                _put_chunk(pooled(ours_at), flight.FlightCallOptions(), desc.array_id, p.ticket, arr[p.start[0]])

            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(put, _plan_write(client._state, desc.array_id, None)))
            assert client.set_upload_status(desc.array_id, "READY")["uploaded_chunks"] == arr.shape[0]
            return desc.array_id

        def run_disk() -> None:
            path = os.path.join(write_dir, "disk-ceiling.bin")
            with open(path, "wb") as fh:
                for plane_ in arr:
                    fh.write(plane_.data)
                fh.flush()
                os.fsync(fh.fileno())
            os.remove(path)

        paths = {
            BARE: run_bare,
            SDK_PEER: lambda: run_sdk(peer_client, "cache"),
            "ours cache:// (SDK upload_array)": lambda: to_discard.append(run_sdk(client, "cache")),
            "ours cache:// (SDK plan + _put_chunk on threads)": lambda: to_discard.append(run_ours_threads()),
            "ours zarr:// lz4 blosc (SDK upload_array)": lambda: to_discard.append(run_sdk(client, "zarr")),
            DISK: run_disk,
        }
        run_bare()  # warm connections and threads on every side
        run_sdk(peer_client, "cache")
        client.set_upload_status(run_sdk(client, "cache"), "DISCARDED")
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(repeats):
            for name, fn in paths.items():  # alternate ours and the peers within every round
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                while to_discard:  # frees the disk for the next round (untimed)
                    client.set_upload_status(to_discard.pop(), "DISCARDED")
    finally:
        host.stdin.close()
        host.wait(timeout=60)
        shutil.rmtree(write_dir, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        {
            "path": k,
            "MiB": arr.nbytes / (1 << 20),
            "chunks": arr.shape[0],
            "threads": threads,
            "median_s": m,
            "MB_per_s": arr.nbytes / m / 1e6,
            "vs_bare": medians[BARE] / m,
            "vs_sdk_peer": medians[SDK_PEER] / m,
        }
        for k, m in medians.items()
    ]
    print(
        f"write_dir on {os.path.dirname(write_dir)}; {threads} DoPut threads (the SDK's dask default); "
        f"servers in one child process; medians of {repeats}"
    )
    print_table(
        ["path", "MiB", "chunks", "median s", "MB/s", "× bare", "× SDK peer"],
        [
            [
                r["path"],
                r["MiB"],
                r["chunks"],
                r["median_s"],
                r["MB_per_s"],
                f"{r['vs_bare']:.2f}",
                f"{r['vs_sdk_peer']:.2f}",
            ]
            for r in rows
        ],
    )
    write_json(json_path, "uploads", f"{mib}MiB", rows)
    return rows


def _serve(write_dir: str) -> None:
    """The child process: our server, the bare discarding DoPut and the SDK peer; prints their
    ports as one JSON line and serves until stdin closes."""
    import pyarrow.flight as flight

    from tensor_server.catalog import Catalog
    from tensor_server.testing import start_serving

    cat = Catalog([])
    cat.first_scan_done.set()
    ours = start_serving(cat, write_dir=write_dir, writable=True, scratch_ttl=0)

    class Discard(flight.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            reader.read_all()

    bare, peer = Discard("grpc://127.0.0.1:0"), _discarding_upload_server()
    for s in (bare, peer):
        threading.Thread(target=s.serve, daemon=True).start()
    print(json.dumps({"ours": ours.flight.port, "bare": bare.port, "sdk_peer": peer.port}), flush=True)
    sys.stdin.read()
    ours.stop()
    for s in (bare, peer):
        s.shutdown()
    cat.close()


def _discarding_upload_server() -> Any:
    """The upload half of the protocol and nothing else: add_tensor echoes the request, the
    write plan is the requested grid, DoPut reads the chunk and drops it, READY is a reply."""
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2, ticket_pb2

    from tensor_server.core.wire import PLAN_SCHEMA

    class Server(flight.FlightServerBase):
        def __init__(self) -> None:
            super().__init__("grpc://127.0.0.1:0")
            self.tensors: dict[str, Any] = {}

        def do_action(self, context, action):
            if action.type == "health":
                return iter([flight.Result(json.dumps({"protocol": 3, "status": "SERVING"}).encode())])
            if action.type == "add_tensor":
                d = descriptor_pb2.TensorDescriptor.FromString(action.body.to_pybytes())
                d.array_id = d.array_id.partition("://")[2]
                self.tensors[d.array_id] = d
                return iter([flight.Result(d.SerializeToString())])
            req = ticket_pb2.SetUploadStatus.FromString(action.body.to_pybytes())
            d = self.tensors[req.array_id]
            n = int(np.prod([-(-a // c) for a, c in zip(d.shape, d.chunk_shape)]))
            st = descriptor_pb2.UploadStatus(state=req.state, expected_chunks=n, uploaded_chunks=n)
            return iter([flight.Result(st.SerializeToString())])

        def get_flight_info(self, context, descriptor):
            opt = descriptor_pb2.FlightRequest.FromString(descriptor.command).tensor_read
            d = self.tensors[opt.array_id]
            grids = [range(0, a, c) for a, c in zip(d.shape, d.chunk_shape)]
            endpoints = []
            for i, cell in enumerate(np.ndindex(*[len(g) for g in grids])):
                lo = [g[k] for g, k in zip(grids, cell)]
                hi = [min(a + c, n) for a, c, n in zip(lo, d.chunk_shape, d.shape)]
                bounds = ticket_pb2.ChunkBounds(start=lo, stop=hi).SerializeToString()
                endpoints.append(flight.FlightEndpoint(b"%d" % i, [], app_metadata=bounds))
            return flight.FlightInfo(
                PLAN_SCHEMA,
                flight.FlightDescriptor.for_command(d.SerializeToString()),
                endpoints,
                -1,
                -1,
                app_metadata=opt.SerializeToString(),
            )

        def do_put(self, context, descriptor, reader, writer):
            reader.read_all()

    return Server()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=256, help="array size in MiB (8 MiB chunks)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (ours and the peers alternate)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    parser.add_argument(
        "--write-dir-on", help="folder on the filesystem to put the server's write_dir on (default: the temp dir)"
    )


def main(args: argparse.Namespace) -> int:
    run_uploads(args.mib, args.repeats, args.json_path, args.write_dir_on)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    _serve(sys.argv[2])
