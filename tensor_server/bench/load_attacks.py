"""What the load bench's clients send (``bench/load.py``): the well-behaved mix beyond plain
reads (uploads, ROIs, HTTP chunks) and the hostile client's cycle through every finding of
issues 12 and 23 — huge scales, forged chunk ids, endless SQL, junk DoPut streams, stats over a
declared 10¹¹-element upload with a short client timeout, ``add_source`` of ``/`` and
``/proc``, ROI floods (a 10⁶-point polygon, 10⁶ ids, a 32 MiB label, NaN coordinates),
100,000-deep JSON bodies, ``roi_prune`` 2³¹−1, a 5 MB catalog key, HTTP keys like ``%C2%B2``
and a 30,000-segment URL — and of issue 38: a JSON body of escaped quotes, an export of a file
per pixel, thin and huge IIIF sizes, script in a viewer link, idle and half-sent connections to
the HTTP and metrics doors. Each is expected to be refused; none may slow the others past 2×."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["extra_well_behaved_ops", "hostile_attacks", "well_behaved_urls"]


def _call(raw: Any, name: str, body: bytes, timeout: float | None = None) -> list:
    import pyarrow.flight as flight

    options = flight.FlightCallOptions(timeout=timeout) if timeout else None
    return list(
        raw.do_action(flight.Action(name, body), options) if options else raw.do_action(flight.Action(name, body))
    )


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


def extra_well_behaved_ops(client: Any, array_id: str, tag: str) -> list[tuple[str, Callable, Callable]]:
    """(kind, call, check) of the mix beyond plain reads: an upload read back (a mismatch
    raises AssertionError: a wrong answer), then discarded; ROI put, list and delete (so the
    workload itself does not grow the server's state from one phase to the next)."""
    result = np.arange(256 * 256, dtype=np.uint16).reshape(256, 256)

    def upload() -> None:  # a fresh name each time: a discarded name stays taken until the sweep
        desc = client.setup_array_upload(
            f"cache://scratch/@fields/load-{tag}-{uuid.uuid4().hex[:12]}", result, chunk_shape=(128, 128)
        )
        client.upload_array(desc, result)
        back = np.asarray(client.get_array(desc.array_id))
        client.set_upload_status(desc.array_id, "DISCARDED")
        assert np.array_equal(back, result), "an uploaded tensor read back differs from what was uploaded"

    def rois() -> bool:  # what it stores it deletes: the tensor's annotations stay as many
        stored = [r.roi_id for r in client.put_rois(array_id, [_roi()]).stored]
        listed = {r.roi_id for r in client.list_rois(array_id).rois}
        return set(client.delete_rois(array_id, stored).deleted) == set(stored) and set(stored) <= listed

    return [("upload", upload, lambda _: True), ("rois", rois, lambda ok: ok)]


def well_behaved_urls(http_url: str, array_id: str) -> dict[str, str]:
    """The HTTP requests of the well-behaved mix: an OME-Zarr chunk and an IIIF tile."""
    return {
        "http chunk": f"{http_url}/zarr/{array_id}/0/0.0",
        "iiif tile": f"{http_url}/iiif/3/{array_id}/0,0,512,512/256,/0/default.png",
    }


class _HeldSockets:
    """Connections a hostile client opens and leaves idle or half-sent (no TLS handshake, a
    header never finished), up to ``count`` per port at a time: each call closes the previous
    batch and opens a new one, so the server must not give a thread or a handshake to each."""

    def __init__(self, urls: list[str], count: int = 64) -> None:
        from urllib.parse import urlsplit

        self.addresses = [(urlsplit(u).hostname, urlsplit(u).port) for u in urls]
        self.count = count
        self.held: list[Any] = []

    def __call__(self) -> None:
        import socket

        self.close()
        for host, port in self.addresses:
            for i in range(self.count):
                try:
                    sock = socket.create_connection((host, port), timeout=2)
                except OSError:
                    break
                if i % 2:  # every other one starts a request and never ends its headers
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                self.held.append(sock)

    def close(self) -> None:
        for sock in self.held:
            sock.close()
        self.held.clear()


def _issue38_attacks(raw: Any, array_id: str, http_url: str | None) -> list[Callable[[], Any]]:
    """Issue 38's findings: a quadratic-regex JSON body, an export of a file per pixel, thin
    and huge IIIF sizes, script in a viewer link."""
    escapes = b'"' + b'\\"' * (1 << 18)  # 512 KiB of escaped quotes in an unterminated string
    export = json.dumps(
        {"array_id": array_id, "dest": f"hostile-{uuid.uuid4().hex[:8]}", "options": {"chunks": [1, 1], "levels": 1}}
    ).encode()
    attacks: list[Callable[[], Any]] = [
        lambda: _call(raw, "tensor_stats", escapes, timeout=10),
        lambda: _call(raw, "export", export, timeout=5),
    ]
    if http_url:
        import httpx

        http = httpx.Client(timeout=30)
        iiif = f"{http_url}/iiif/3/{array_id}"
        attacks += [
            lambda path=path: http.get(f"{iiif}/{path}")
            for path in (
                "full/2048,16/0/default.jpg",
                "full/16,2048/0/default.jpg",
                "full/^1,16777216/0/default.jpg",
                "full/99999999999999999999,/0/default.jpg",
                "0,0,99999999999999999999,1/max/0/default.jpg",
                "full/pct:1e308/0/default.jpg",
                "full/!0,0/0/default.jpg",
            )
        ]
        attacks.append(
            lambda: http.get(f"{http_url}/view/{array_id}", params={"token": "</script><script>alert(1)</script>"})
        )
    return attacks


def hostile_attacks(
    location: str, array_id: str, http_url: str | None, metrics_url: str | None, forged_chunk_ticket: bytes
) -> tuple[list[Callable[[], Any]], Callable[[], None]]:
    """The hostile client's cycle, and what closes the connections it holds open."""
    import pyarrow as pa
    import pyarrow.flight as flight
    from biopb.image.annotation_pb2 import RoiPruneRequest
    from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

    sdk = TensorFlightClient(location)
    raw = flight.FlightClient(location)
    declared = descriptor_pb2.TensorDescriptor(
        array_id=f"cache://scratch/@fields/hostile-huge-{id(sdk)}",
        shape=[100_000, 1_000_000],
        dtype="uint8",
        chunk_shape=[1024, 1024],
    )
    try:
        big_id = descriptor_pb2.TensorDescriptor.FromString(
            _call(raw, "add_tensor", declared.SerializeToString())[0].body.to_pybytes()
        ).array_id
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
        attacks += [
            lambda: http.get(f"{http_url}/zarr/{array_id}/0/0.%C2%B2"),
            lambda: http.get(f"{http_url}/zarr/{array_id}/" + "a/" * 30_000),
        ]
    attacks += _issue38_attacks(raw, array_id, http_url)
    held = _HeldSockets([u for u in (http_url, metrics_url) if u])
    attacks.append(held)
    return attacks, held.close
