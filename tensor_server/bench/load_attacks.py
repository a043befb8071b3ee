"""What the load bench's clients send (``bench/load.py``): the well-behaved mix beyond plain
reads (uploads, ROIs, HTTP chunks) and the hostile client's cycle through every finding of
issues 12 and 23 — huge scales, forged chunk ids, endless SQL, junk DoPut streams, stats over a
declared 10¹¹-element upload with a short client timeout, ``add_source`` of ``/`` and
``/proc``, ROI floods (a 10⁶-point polygon, 10⁶ ids, a 32 MiB label, NaN coordinates),
100,000-deep JSON bodies, ``roi_prune`` 2³¹−1, a 5 MB catalog key, HTTP keys like ``%C2%B2``
and a 30,000-segment URL. Each is expected to be refused; none may slow the others past 2×."""
from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import numpy as np

__all__ = ["extra_well_behaved_ops", "hostile_attacks"]


def _call(raw: Any, name: str, body: bytes, timeout: float | None = None) -> list:
    import pyarrow.flight as flight

    options = flight.FlightCallOptions(timeout=timeout) if timeout else None
    return list(raw.do_action(flight.Action(name, body), options) if options else raw.do_action(flight.Action(name, body)))


def _flood(raw: Any, command: bytes, batch: Any, mib: int = 64) -> None:
    import pyarrow.flight as flight

    writer, _ = raw.do_put(flight.FlightDescriptor.for_command(command), batch.schema)
    for _ in range(max(1, (mib << 20) // max(batch.nbytes, 1))):
        writer.write_batch(batch)
    writer.close()


def _roi(points: int = 1, label: str = "", nan: bool = False) -> Any:
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    roi = ROI()
    if points == 1:
        roi.point.x, roi.point.y = (float("nan"), 1.0) if nan else (1.0, 1.0)
    else:
        for i in range(points):
            p = roi.polygon.points.add()
            p.x, p.y = float(i % 1000), float(i // 1000)
    return RoiAnnotation(roi=roi, label=label)


def extra_well_behaved_ops(client: Any, array_id: str, http_url: str | None, tag: str) -> list[tuple[str, Callable]]:
    """Uploads (a small cache:// result, then discarded), ROI put/list, HTTP chunk reads."""
    result = np.arange(256 * 256, dtype=np.uint16).reshape(256, 256)

    def upload() -> None:  # a fresh name each time: a discarded name stays taken until the sweep
        desc = client.setup_array_upload(f"cache://scratch/@fields/load-{tag}-{uuid.uuid4().hex[:12]}", result,
                                         chunk_shape=(128, 128))
        client.upload_array(desc, result)
        client.set_upload_status(desc.array_id, "DISCARDED")

    def rois() -> None:
        client.put_rois(array_id, [_roi()])
        client.list_rois(array_id)

    ops = [("upload", upload), ("rois", rois)]
    if http_url:
        import httpx

        http = httpx.Client(timeout=60)
        ops.append(("http chunk", lambda: http.get(f"{http_url}/zarr/{array_id}/0/0.0").raise_for_status()))
    return ops


def hostile_attacks(location: str, array_id: str, http_url: str | None, forged_chunk_ticket: bytes
                    ) -> list[Callable[[], Any]]:
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.image.annotation_pb2 import RoiPruneRequest
    from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

    sdk = TensorFlightClient(location)
    raw = flight.FlightClient(location)
    declared = descriptor_pb2.TensorDescriptor(array_id=f"cache://scratch/@fields/hostile-huge-{id(sdk)}",
                                               shape=[100_000, 1_000_000], dtype="uint8", chunk_shape=[1024, 1024])
    try:
        big_id = descriptor_pb2.TensorDescriptor.FromString(
            _call(raw, "add_tensor", declared.SerializeToString())[0].body.to_pybytes()).array_id
    except flight.FlightError:
        big_id = array_id  # a quota refused the declaration: stats on the image instead
    junk = ticket_pb2.PutCommand(chunk_ticket=ticket_pb2.TensorTicket(chunk_id=b"junk").SerializeToString())
    data = pa.record_batch([pa.array(np.zeros(1 << 20, np.uint8))], names=["data"])
    deep = b"[" * 100_000 + b"]" * 100_000
    attacks: list[Callable[[], Any]] = [
        lambda: sdk.get_array(array_id, scale_hint=[1 << 28, 1 << 28], reduction_method="area"),
        lambda: raw.do_get(flight.Ticket(forged_chunk_ticket)).read_all(),
        lambda: sdk.query("SELECT count(*) FROM range(1000000000000000)"),
        lambda: _flood(raw, junk.SerializeToString(), data),
        lambda: _call(raw, "tensor_stats", json.dumps({"array_id": big_id}).encode(), timeout=3),
        lambda: sdk.register_local_path("/"),
        lambda: sdk.register_local_path("/proc"),
        lambda: sdk.put_rois(array_id, [_roi(points=1_000_000)]),
        lambda: sdk.put_rois(array_id, [_roi(label="x" * (32 << 20))]),
        lambda: sdk.put_rois(array_id, [_roi(nan=True)]),
        lambda: sdk.delete_rois(array_id, [f"id-{i}" for i in range(1_000_000)]),
        lambda: _call(raw, "tensor_stats", deep),
        lambda: _call(raw, "catalog_children", json.dumps({"key": "k" * (5 << 20)}).encode()),
        lambda: _call(raw, "roi_prune", RoiPruneRequest(unseen_days=2**31 - 1).SerializeToString()),
    ]
    if http_url:
        import httpx

        http = httpx.Client(timeout=30)
        attacks += [lambda: http.get(f"{http_url}/zarr/{array_id}/0/0.%C2%B2"),
                    lambda: http.get(f"{http_url}/zarr/{array_id}/" + "a/" * 30_000)]
    return attacks
