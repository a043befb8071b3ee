"""``python -m tensor_server.bench throughput``: chunks/s and MB/s of 8 MiB chunks.

Through DoGet and through the localhost fast path (chunk_locate + mmap, as the SDK does),
with 1 and 4 client threads, against a bare pyarrow Flight server returning the same bytes
from memory (the ceiling of the transport).
"""
from __future__ import annotations

import concurrent.futures
import json
import tempfile
import threading
import time
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_throughput"]


def run_throughput(size: str = "small", json_path: str | None = None, seconds: float = 3.0) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2, ticket_pb2

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.flight import ServerConfig, TensorFlightServer
    from tensor_server.flight.wire import chunk_batch

    n_chunks = 16 if size == "full" else 8
    arr = np.random.default_rng(0).integers(0, 60000, (2048 * n_chunks, 2048), dtype=np.uint16)  # 8 MiB chunks
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(2048, 2048)), source_id="tp"))
    cat.first_scan_done.set()
    cache = CacheManager(tempfile.mkdtemp(prefix="ts-bench-tp-"))
    ours = TensorFlightServer(cat, ServerConfig(port=0), cache_manager=cache)
    threading.Thread(target=ours.serve, daemon=True).start()
    c = flight.FlightClient(ours.location)
    opt = descriptor_pb2.TensorReadOption(array_id="tp")
    opt.fields.paths.append("endpoints")
    info = c.get_flight_info(flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString()))
    tickets = [ep.ticket for ep in info.endpoints]
    for t in tickets:  # warm the chunk cache: we measure transport, not decode
        c.do_get(t).read_all()
    table = pa.Table.from_batches([chunk_batch(arr[:2048])])

    class Bare(flight.FlightServerBase):
        def do_get(self, context, ticket):
            return flight.RecordBatchStream(table)

    bare = Bare("grpc://127.0.0.1:0")
    threading.Thread(target=bare.serve, daemon=True).start()

    def doget(location):
        local = threading.local()

        def one(ticket):
            if not hasattr(local, "c"):
                local.c = flight.FlightClient(location)
            return local.c.do_get(ticket).read_all().column("data")[0].as_buffer().size

        return one

    def fast_path(location):
        local = threading.local()

        def one(ticket):
            if not hasattr(local, "c"):
                local.c = flight.FlightClient(location)
            body = ticket_pb2.TensorTicket.FromString(ticket.ticket).SerializeToString()
            loc = json.loads(next(iter(local.c.do_action(flight.Action("chunk_locate", body)))).body.to_pybytes())
            with pa.memory_map(loc["segment_path"]) as mm:
                schema = pa.ipc.open_stream(mm).schema
                mm.seek(loc["byte_offset"])
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(mm), schema)
                data = np.frombuffer(batch.column("data").buffers()[2], np.uint8)
                data[::4096].sum()  # fault every page in, as a consumer of the view would
                return data.size

        return one

    rows = []
    for name, fn, tix in [("ours DoGet", doget(ours.location), tickets),
                          ("ours fast path (mmap)", fast_path(ours.location), tickets),
                          ("bare pyarrow DoGet", doget(f"grpc://127.0.0.1:{bare.port}"), [flight.Ticket(b"x")] * len(tickets))]:
        for threads in (1, 4):
            count = nbytes = 0
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                while time.perf_counter() - t0 < seconds:
                    for got in pool.map(fn, tix):
                        count += 1
                        nbytes += got
            dt = time.perf_counter() - t0
            rows.append({"path": name, "threads": threads, "chunks_per_s": count / dt, "MB_per_s": nbytes / dt / 1e6})
    ours.shutdown()
    bare.shutdown()
    cache.close()
    print_table(["path", "threads", "chunks/s", "MB/s"], [[r["path"], r["threads"], r["chunks_per_s"], r["MB_per_s"]] for r in rows])
    write_json(json_path, "throughput", size, rows)
    return rows


def add_arguments(parser) -> None:  # noqa: ANN001 - argparse parser
    add_common_arguments(parser, data_dir=False)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")


def main(args) -> int:  # noqa: ANN001
    run_throughput(args.size, args.json_path, args.seconds)
    return 0
