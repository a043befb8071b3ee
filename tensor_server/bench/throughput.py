"""``python -m tensor_server.bench throughput``: chunks/s and MB/s of 8 MiB chunks.

Through DoGet and through the localhost fast path (chunk_locate + mmap, as the SDK does),
with 1 and 4 client threads, against a bare pyarrow Flight server returning the same bytes
from memory (the ceiling of the transport).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_throughput", "chunk_server", "read_doget", "read_fast_path"]


@contextlib.contextmanager
def chunk_server(arr: np.ndarray, chunk_shape: tuple[int, ...], source_id: str = "tp"):
    """Our server on 127.0.0.1 with a chunk cache, serving ``arr`` in ``chunk_shape`` chunks,
    every chunk read once (so a timed read measures transport, not decode). Yields
    ``(location, tickets)``; the server, its thread and the cache are gone afterwards."""
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.testing import start_serving

    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=chunk_shape), source_id=source_id))
    cat.first_scan_done.set()
    cache_dir = tempfile.mkdtemp(prefix="ts-bench-tp-")
    cache = CacheManager(cache_dir)
    server = start_serving(cat, cache=cache)
    try:
        c = flight.FlightClient(server.location)
        opt = descriptor_pb2.TensorReadOption(array_id=source_id)
        opt.fields.paths.append("endpoints")
        info = c.get_flight_info(
            flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
        )
        tickets = [ep.ticket for ep in info.endpoints]
        for t in tickets:
            c.do_get(t).read_all()
        c.close()
        yield server.location, tickets
    finally:
        server.stop()
        cache.close()
        shutil.rmtree(cache_dir, ignore_errors=True)


def read_doget(client, ticket) -> int:  # pyarrow FlightClient, Ticket
    """One chunk through DoGet; returns its byte count."""
    return client.do_get(ticket).read_all().column("data")[0].as_buffer().size


def read_fast_path(client, ticket) -> int:  # pyarrow FlightClient, Ticket
    """One chunk through the localhost fast path, as the SDK does it: ``chunk_locate``, then
    map the segment file and read the batch in place, faulting every page in (as a consumer
    of the view would). Returns its byte count."""
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.tensor import ticket_pb2

    body = ticket_pb2.TensorTicket.FromString(ticket.ticket).SerializeToString()
    loc = json.loads(next(iter(client.do_action(flight.Action("chunk_locate", body)))).body.to_pybytes())
    with pa.memory_map(loc["segment_path"]) as mm:
        schema = pa.ipc.open_stream(mm).schema
        mm.seek(loc["byte_offset"])
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(mm), schema)
        data = np.frombuffer(batch.column("data").buffers()[2], np.uint8)
        data[::4096].sum()
        return data.size


def run_throughput(size: str = "small", json_path: str | None = None, seconds: float = 3.0) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.flight as flight

    from tensor_server.core.wire import chunk_batch

    n_chunks = 16 if size == "full" else 8
    arr = np.random.default_rng(0).integers(0, 60000, (2048 * n_chunks, 2048), dtype=np.uint16)  # 8 MiB chunks
    table = pa.Table.from_batches([chunk_batch(arr[:2048])])

    class Bare(flight.FlightServerBase):
        def do_get(self, context, ticket):
            return flight.RecordBatchStream(table)

    def per_thread_client(location, read):
        local = threading.local()

        def one(ticket):
            if not hasattr(local, "c"):
                local.c = flight.FlightClient(location)
            return read(local.c, ticket)

        return one

    rows = []
    bare = Bare("grpc://127.0.0.1:0")
    threading.Thread(target=bare.serve, daemon=True).start()
    with chunk_server(arr, (2048, 2048)) as (location, tickets):
        for name, fn, tix in [
            ("ours DoGet", per_thread_client(location, read_doget), tickets),
            ("ours fast path (mmap)", per_thread_client(location, read_fast_path), tickets),
            (
                "bare pyarrow DoGet",
                per_thread_client(f"grpc://127.0.0.1:{bare.port}", read_doget),
                [flight.Ticket(b"x")] * len(tickets),
            ),
        ]:
            for threads in (1, 4):
                count = nbytes = 0
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                    while time.perf_counter() - t0 < seconds:
                        for got in pool.map(fn, tix):
                            count += 1
                            nbytes += got
                dt = time.perf_counter() - t0
                rows.append(
                    {"path": name, "threads": threads, "chunks_per_s": count / dt, "MB_per_s": nbytes / dt / 1e6}
                )
    bare.shutdown()
    print_table(
        ["path", "threads", "chunks/s", "MB/s"],
        [[r["path"], r["threads"], r["chunks_per_s"], r["MB_per_s"]] for r in rows],
    )
    write_json(json_path, "throughput", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, data_dir=False)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")


def main(args: argparse.Namespace) -> int:
    run_throughput(args.size, args.json_path, args.seconds)
    return 0
