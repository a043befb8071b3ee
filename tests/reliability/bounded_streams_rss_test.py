"""Issue 23 finding 1, measured on a real server process: a write stream is refused as soon as
it carries more than its target can hold, so the server's peak RSS (``VmHWM``) grows by a
bounded amount however much a client sends (before: a junk chunk ticket followed by 1.5 GiB
took the server from 425 MB to 4.1 GB, and ``roi_put`` of a whole stream +1.8 GB)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tests.reliability.server_process import serve_process

MIB = 1 << 20
#: what each hostile stream tries to send
SENT = 768 * MIB


def _peak_rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _flood(client, descriptor, schema, batch) -> int:
    """Send ``batch`` until SENT bytes went or the server refused; bytes the client got off."""
    sent = 0
    try:
        writer, _ = client.do_put(descriptor, schema)
        while sent < SENT:
            writer.write_batch(batch)
            sent += batch.nbytes
        writer.close()
    except flight.FlightError:
        return sent
    pytest.fail(f"the server took a {SENT >> 20} MiB stream whole")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    np.save(root / "img.npy", np.zeros((64, 64), np.uint16))
    home = tmp_path_factory.mktemp("home")
    with serve_process(
        [root],
        home / "cache",
        extra_args=["--write-dir", str(home / "w"), "--writable", "--rois-db", str(home / "a.duckdb")],
    ) as srv:
        yield srv


@pytest.mark.slow
def test_write_streams_are_refused_within_their_budget(server):
    from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

    client = flight.FlightClient(server.location)
    batch = pa.record_batch([pa.array(np.zeros(8 * MIB // 2, np.uint16))], names=["data"])
    before = _peak_rss(server.proc.pid)
    # 1. a ticket carrying a junk chunk id: refused before a byte of the stream is read
    junk_ticket = ticket_pb2.TensorTicket(chunk_id=b"junk").SerializeToString()
    junk = flight.FlightDescriptor.for_command(ticket_pb2.PutCommand(chunk_ticket=junk_ticket).SerializeToString())
    assert _flood(client, junk, batch.schema, batch) < SENT
    # 2. a real ticket of a 1 MiB chunk, and 768 MiB behind it: refused past the chunk's bytes
    sdk = TensorFlightClient(server.location)
    desc = sdk.setup_array_upload(
        "cache://scratch/@fields/flood", np.zeros((1024, 512), np.uint16), chunk_shape=(1024, 512)
    )
    opt = descriptor_pb2.TensorReadOption(array_id=desc.array_id)
    opt.fields.paths.append("endpoints")
    info = client.get_flight_info(
        flight.FlightDescriptor.for_command(descriptor_pb2.FlightRequest(tensor_read=opt).SerializeToString())
    )
    cmd = ticket_pb2.PutCommand(chunk_ticket=info.endpoints[0].ticket.ticket)
    assert _flood(client, flight.FlightDescriptor.for_command(cmd.SerializeToString()), batch.schema, batch) < SENT
    assert sdk.get_upload_status(desc.array_id)["uploaded_chunks"] == 0, "nothing of the flood was stored"
    # 3. roi_put rows past the 64 MiB request budget
    rows = pa.record_batch([pa.array(["x" * 1024] * (8 * 1024))], names=["label"])
    put = ticket_pb2.PutCommand()
    put.roi_put.array_id = next(
        r["source_id"]
        for r in sdk.query("SELECT source_id FROM sources", format="records")
        if r["source_id"].startswith("img")
    )
    assert _flood(client, flight.FlightDescriptor.for_command(put.SerializeToString()), rows.schema, rows) < SENT
    growth = _peak_rss(server.proc.pid) - before
    # one request's budget may be held (roi_put: 64 MiB of rows) plus gRPC's and Arrow's buffers
    # of the batches in flight; unbounded, the same floods grew the server by gigabytes
    assert growth < 384 * MIB, f"peak RSS grew by {growth >> 20} MiB for three {SENT >> 20} MiB floods"
    assert server.action("health")["status"] == "SERVING"
