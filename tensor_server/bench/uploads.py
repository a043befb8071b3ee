"""``python -m tensor_server.bench uploads``: upload throughput through the biopb SDK.

A uint16 array (256 MiB by default) is sent with ``upload_array`` (plan, parallel DoPuts,
READY) to ``cache://`` and to ``zarr://`` (zarr's compression included) on an in-process
server, against the peer: a bare pyarrow Flight server whose DoPut reads the stream and
discards it, fed the same chunks (same grid, same batch construction, as many threads as the
SDK's dask scheduler uses). Rounds alternate peer/ours and the table reports medians.

A second reference row writes the same bytes to the write_dir's filesystem with plain file
writes and an fsync (no Flight): a durable store cannot beat its disk, and the peer never
touches one. ``--write-dir-on`` picks the filesystem (e.g. /dev/shm to take the disk out).
"""
from __future__ import annotations

import concurrent.futures
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["run_uploads"]


def run_uploads(mib: int = 256, repeats: int = 3, json_path: str | None = None,
                write_dir_on: str | None = None) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient
    from biopb.tensor.ticket_pb2 import PutCommand

    from tensor_server.catalog import Catalog
    from tensor_server.flight import ServerConfig, TensorFlightServer

    plane = 2048 * 2048 * 2  # one 8 MiB chunk per plane
    arr = np.random.default_rng(0).integers(0, 4096, (max(1, mib * (1 << 20) // plane), 2048, 2048), dtype=np.uint16)
    chunk = (1, 2048, 2048)
    nbytes = arr.nbytes
    threads = os.cpu_count() or 1

    write_dir = tempfile.mkdtemp(prefix="ts-bench-up-", dir=write_dir_on)
    cat = Catalog([])
    cat.first_scan_done.set()
    ours = TensorFlightServer(cat, ServerConfig(port=0, write_dir=write_dir, writable=True, scratch_ttl=0))
    threading.Thread(target=ours.serve, daemon=True).start()

    class Discard(flight.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):  # noqa: ANN001
            reader.read_all()

    bare = Discard("grpc://127.0.0.1:0")
    threading.Thread(target=bare.serve, daemon=True).start()
    bare_location = f"grpc://127.0.0.1:{bare.port}"
    schema = pa.schema([pa.field("data", pa.uint16())])
    local = threading.local()

    def bare_put(i: int) -> None:
        if not hasattr(local, "c"):
            local.c = flight.FlightClient(bare_location)
        desc = flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=b"%d" % i).SerializeToString())
        writer, reader = local.c.do_put(desc, schema)
        with writer:
            writer.write_batch(pa.record_batch([pa.array(arr[i].ravel(), type=pa.uint16())], schema=schema))
            writer.done_writing()
            reader.read()

    def run_bare() -> None:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(bare_put, range(arr.shape[0])))

    def run_disk() -> None:
        path = os.path.join(write_dir, "disk-ceiling.bin")
        with open(path, "wb") as fh:
            for plane in arr:
                fh.write(plane.data)
            fh.flush()
            os.fsync(fh.fileno())
        os.remove(path)

    client = TensorFlightClient(ours.location)
    counter = iter(range(1 << 30))

    def run_ours(scheme: str):
        def go() -> None:
            name = f"{scheme}://scratch/@fields/bench-{next(counter)}"
            desc = client.setup_array_upload(name, arr, chunk_shape=chunk)
            status = client.upload_array(desc, arr)
            assert status["state"] == "READY" and status["uploaded_chunks"] == arr.shape[0], status
            go.last = desc.array_id
        return go

    def run_ours_threads() -> None:
        """The SDK's own plan and _put_chunk on plain threads (the peer's driver), no dask:
        the server's share of the cost without the SDK's dask graph."""
        from biopb.tensor._upload import _plan_write, _put_chunk

        desc = client.setup_array_upload(f"cache://scratch/@fields/bench-{next(counter)}", arr, chunk_shape=chunk)
        plan = _plan_write(client._state, desc.array_id, None)

        def put(p) -> None:  # noqa: ANN001
            if not hasattr(local, "ours"):
                local.ours = flight.FlightClient(ours.location)
            _put_chunk(local.ours, flight.FlightCallOptions(), desc.array_id, p.ticket, arr[p.start[0]])

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(put, plan))
        assert client.set_upload_status(desc.array_id, "READY")["uploaded_chunks"] == arr.shape[0]
        run_ours_threads.last = desc.array_id

    paths = {"bare pyarrow DoPut (discards)": run_bare, "ours cache:// (SDK upload_array)": run_ours("cache"),
             "ours cache:// (SDK _put_chunk on threads, no dask)": run_ours_threads,
             "ours zarr:// lz4 blosc (SDK upload_array)": run_ours("zarr"),
             "disk: write + fsync, no Flight": run_disk}
    times: dict[str, list[float]] = {k: [] for k in paths}
    run_bare()  # warm connections and threads on both sides
    warm = run_ours("cache")
    warm()
    client.set_upload_status(warm.last, "DISCARDED")
    for _ in range(repeats):
        for name, fn in paths.items():  # alternate ours/peer within every round
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            if fn not in (run_bare, run_disk):
                client.set_upload_status(fn.last, "DISCARDED")  # frees the disk for the next round
    bare_s = statistics.median(times["bare pyarrow DoPut (discards)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"path": name, "MiB": nbytes / (1 << 20), "chunks": arr.shape[0], "threads": threads,
                     "median_s": med, "MB_per_s": nbytes / med / 1e6, "vs_bare": bare_s / med})
    ours.shutdown()
    bare.shutdown()
    cat.close()
    print(f"write_dir on {os.path.dirname(write_dir)}; {threads} DoPut threads (the SDK's dask default)")
    print_table(["path", "MiB", "chunks", "median s", "MB/s", "× bare"],
                [[r["path"], r["MiB"], r["chunks"], r["median_s"], r["MB_per_s"], f"{r['vs_bare']:.2f}"] for r in rows])
    write_json(json_path, "uploads", f"{mib}MiB", rows)
    return rows


def add_arguments(parser) -> None:  # noqa: ANN001 - argparse parser
    parser.add_argument("--mib", type=int, default=256, help="array size in MiB (8 MiB chunks)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (ours and the peer alternate)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    parser.add_argument("--write-dir-on", help="folder on the filesystem to put the server's write_dir on "
                                               "(default: the temp dir)")


def main(args) -> int:  # noqa: ANN001
    run_uploads(args.mib, args.repeats, args.json_path, args.write_dir_on)
    return 0
