"""One 8 MiB chunk through the server: DoGet (ours and a bare pyarrow Flight server) and the
localhost fast path (chunk_locate + mmap)."""

from __future__ import annotations

import threading

import numpy as np


class DoGetRoundTrip:
    timeout = 300

    def setup(self):
        import pyarrow as pa
        import pyarrow.flight as flight
        from biopb.tensor import descriptor_pb2

        from tensor_server.adapters.memory import ArrayAdapter, MemorySource
        from tensor_server.catalog import Catalog
        from tensor_server.core.wire import chunk_batch
        from tensor_server.testing import serving

        arr = np.random.default_rng(0).integers(0, 60000, (2048, 2048), dtype=np.uint16)
        cat = Catalog([])
        cat.add_source(MemorySource(ArrayAdapter(arr, chunk_shape=(2048, 2048)), source_id="b"))
        cat.first_scan_done.set()
        self._served = serving(cat)
        self.ours = self._served.__enter__()
        self.client = flight.FlightClient(self.ours.location)
        opt = descriptor_pb2.TensorReadOption(array_id="b")
        opt.fields.paths.append("endpoints")
        info = self.client.get_flight_info(
            flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
        )
        self.ticket = info.endpoints[0].ticket
        table = pa.Table.from_batches([chunk_batch(arr)])

        class Bare(flight.FlightServerBase):
            def do_get(self, context, ticket):
                return flight.RecordBatchStream(table)

        self.bare = Bare("grpc://127.0.0.1:0")
        threading.Thread(target=self.bare.serve, daemon=True).start()
        self.bare_client = flight.FlightClient(f"grpc://127.0.0.1:{self.bare.port}")

    def teardown(self):
        self._served.__exit__(None, None, None)
        self.bare.shutdown()

    def time_doget_8mib_ours(self):
        self.client.do_get(self.ticket).read_all()

    def time_doget_8mib_bare_pyarrow(self):
        import pyarrow.flight as flight

        self.bare_client.do_get(flight.Ticket(b"x")).read_all()


class ChunkThroughServer:
    """One cached 8 MiB chunk through our server with a chunk cache, by DoGet and by the fast
    path (the reads of ``python -m tensor_server.bench throughput``, one client thread)."""

    timeout = 300

    def setup(self):
        import pyarrow.flight as flight

        from tensor_server.bench.throughput import chunk_server

        arr = np.random.default_rng(0).integers(0, 60000, (2048, 2048), dtype=np.uint16)
        self.served = chunk_server(arr, (2048, 2048), "b")
        location, tickets = self.served.__enter__()
        self.client = flight.FlightClient(location)
        self.ticket = tickets[0]

    def teardown(self):
        self.client.close()
        self.served.__exit__(None, None, None)

    def time_doget(self):
        from tensor_server.bench.throughput import read_doget

        read_doget(self.client, self.ticket)

    def time_fast_path(self):
        from tensor_server.bench.throughput import read_fast_path

        read_fast_path(self.client, self.ticket)
