"""Issue 38 (Critical): one unauthenticated request froze the whole process. A ``tensor_stats``
body of escaped quotes (``"`` + ``\\"`` x 24,576, 48 KiB) sent with no token held the GIL in
the JSON decoder's string regex for 10 s, Flight and HTTP with it; 1 MiB extrapolated to ~80
minutes. Here every verb that takes a body gets hostile bodies up to its size limit, with no
token, a wrong one and the right one, through the real doors: each answers within 5 s with a
clean code (a stranger: UNAUTHENTICATED, before its body is parsed), and a health check on
both doors keeps answering throughout. Against the regex this replaces, the first escape run
with the token already breaks the 5 s bound (it would have taken over an hour), and against
the old order (body before caller) the first one with no token does."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2
from biopb.tensor._roi_rows import ROI_ID_SCHEMA, ROI_ROW_SCHEMA

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.service.actions import ACTIONS
from tensor_server.testing import serving

TOKEN = "adversarial-bodies-token"
MIB = 1 << 20
#: a request must answer within this (the regex took minutes on the escape runs below)
PER_REQUEST_S = 5.0
#: the health checks' worst latency while the hostile bodies are served
HEALTH_BOUND_S = 2.0
IMAGE = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)

_PAIRS = (MIB - 4) // 2
#: hostile JSON (all within the 1 MiB limit but the last), as bytes and as the label a failure names
JSON_BODIES = {
    "escape run": b'"' + b'\\"' * _PAIRS,
    "escape run in an object": b'{"array_id": "' + b'\\"' * ((MIB - 20) // 2),
    "backslash run, closed": b'{"array_id": "' + b"\\\\" * ((MIB - 20) // 2) + b'"}',
    "unterminated string": b'{"array_id": "img", "key": "' + b"a" * (MIB - 40),
    "deep nesting": b"[" * MIB,
    "deep objects": b'{"a":' * (MIB // 5),
    "long integer": b"1" * MIB,
    "long exponent": b"1e" + b"9" * (MIB - 2),
    "float overflow": b'{"array_id": "img", "slice": {"start": [1e99999], "stop": [1]}}',
    "invalid UTF-8": b'{"array_id": "' + b"\xff\xfe" * ((MIB - 20) // 2) + b'"}',
    "over the limit": b'"' + b"a" * MIB + b'"',
}
#: the same as text, for string fields of protobuf messages (which hold valid UTF-8 only)
TEXTS = {label: body.decode() for label, body in JSON_BODIES.items() if label != "invalid UTF-8"}
JSON_ACTIONS = (
    "tensor_stats",
    "catalog_children",
    "export",
    "rois_geojson",
    "put_rois_geojson",
    "share",
    "share_revoke",
    "warm",
    "watch",
)
#: protobuf-bodied actions and what each answers these bodies with the token (resolve reads its
#: body as a URL, which names no source)
PROTOBUF_ACTIONS = {
    "add_source": "INVALID_ARGUMENT",
    "remove_source": "INVALID_ARGUMENT",
    "resolve": "NOT_FOUND",
    "roi_prune": "INVALID_ARGUMENT",
    "set_upload_status": "INVALID_ARGUMENT",
    "chunk_locate": "INVALID_ARGUMENT",
}

#: what a JSON verb answers the one valid body (a long, closed run of escaped backslashes): what it says
VALID_BODY_ANSWERS = {
    "tensor_stats": "NOT_FOUND",
    "watch": "NOT_FOUND",
    "catalog_children": "OK",
    "export": "INVALID_ARGUMENT",
    "add_tensor": "INVALID_ARGUMENT",
    "rois_geojson": "OK",  # no annotations under that id
    "put_rois_geojson": "INVALID_ARGUMENT",  # a header line and no GeoJSON after it
    "share": "NOT_FOUND",  # no such tensor
    "share_revoke": "INVALID_ARGUMENT",  # no id
    "warm": "NOT_FOUND",  # no such tensor
}  # no dest; a tensor carries no metadata of its own


def _json_answer(verb: str, label: str) -> set[str]:
    if label == "over the limit":
        return {"RESOURCE_EXHAUSTED"}
    return {VALID_BODY_ANSWERS[verb] if label == "backslash run, closed" else "INVALID_ARGUMENT"}


@dataclass(frozen=True)
class Endpoints:
    location: str
    http_url: str


def _serve(conn, folders: dict[str, str]) -> None:
    """The server, in a child process: until the test sends anything down ``conn``."""
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(16, 16)), source_id="img"))
    cat.first_scan_done.set()
    cache = CacheManager(folders["cache"])  # chunk_locate is served with a cache
    with serving(
        cat,
        cache=cache,
        token=TOKEN,
        http=True,
        write_dir=folders["write"],
        writable=True,
        allowed_paths=[folders["addable"]],
    ) as srv:  # add_source may walk that empty folder only
        conn.send(Endpoints(srv.location, srv.http_url))
        conn.recv()
    cache.close()
    cat.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server runs in a child process: a server stuck holding its process's GIL would
    freeze a client in the same process too, before it could notice its deadline; from
    outside, a regression fails in seconds rather than hanging the run for an hour."""
    folders = {name: str(tmp_path_factory.mktemp(name)) for name in ("cache", "write", "addable")}
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(theirs, folders), name="adversarial-bodies-server", daemon=True)
    child.start()
    try:
        assert ours.poll(120), "the server child did not start"
        yield ours.recv()
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        child.join(timeout=20)
        if child.is_alive():  # frozen: nothing left to learn from it
            child.kill()
            child.join()


class HealthWatch:
    """Asks ``health`` over Flight and ``/healthz`` over HTTP in a loop, keeping the worst
    latency of each (and any failure), until stopped."""

    def __init__(self, served) -> None:
        self.served = served
        self.worst = {"flight health": 0.0, "http /healthz": 0.0}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def _ask(self, name: str, call: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        try:
            call()
        except Exception as exc:  # recorded, asserted on below
            self.failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        self.worst[name] = max(self.worst[name], time.perf_counter() - t0)

    def _run(self) -> None:
        client = flight.FlightClient(self.served.location)
        options = flight.FlightCallOptions(timeout=10)

        def flight_health() -> None:
            [result] = client.do_action(flight.Action("health", b""), options)
            assert json.loads(result.body.to_pybytes())["status"] == "SERVING"

        with httpx.Client(timeout=10) as http:
            while not self._stop.wait(0.02):
                self._ask("flight health", flight_health)
                self._ask("http /healthz", lambda: http.get(f"{self.served.http_url}/healthz").raise_for_status())
        client.close()

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _code(exc: flight.FlightError) -> str:
    if isinstance(exc, flight.FlightTimedOutError):
        return "TIMEOUT"
    info = json.loads(bytes(exc.extra_info).decode()) if exc.extra_info else {}
    return info.get("code", type(exc).__name__)


def _options(token: str | None) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(timeout=PER_REQUEST_S, headers=headers)


# ---- the requests: (verb, label, expected answers with the token, send(client, options)) -----------
def _action(name: str, body: bytes):
    return lambda client, options: list(client.do_action(flight.Action(name, body), options))


def _put(command: ticket_pb2.PutCommand, table: pa.Table):
    def send(client, options):
        writer, _ = client.do_put(
            flight.FlightDescriptor.for_command(command.SerializeToString()), table.schema, options
        )
        try:
            writer.write_table(table)
            writer.done_writing()
        finally:
            writer.close()

    return send


def _roi_rows(geometry: str) -> pa.Table:
    row = {name: [None] for name in ROI_ROW_SCHEMA.names}
    row.update(array_id=["img"], geometry=[geometry], plane=[[]])
    return pa.table(row, schema=ROI_ROW_SCHEMA)


def _raw_put(command: bytes):
    def send(client, options):
        writer, _ = client.do_put(flight.FlightDescriptor.for_command(command), ROI_ID_SCHEMA, options)
        writer.close()

    return send


def _info(command: bytes):
    return lambda client, options: client.get_flight_info(flight.FlightDescriptor.for_command(command), options)


def _get(ticket: bytes):
    return lambda client, options: client.do_get(flight.Ticket(ticket), options).read_all()


def _requests():
    """Every body-taking verb with every hostile body it can be sent."""
    for name in JSON_ACTIONS:
        for label, body in JSON_BODIES.items():
            yield name, label, _json_answer(name, label), _action(name, body)
    for label, text in TEXTS.items():
        request = descriptor_pb2.TensorDescriptor(
            array_id="cache://img/@fields/hostile", shape=[4, 4], dtype="<u2", metadata_json=text
        )
        yield (
            "add_tensor metadata_json",
            label,
            _json_answer("add_tensor", label),
            _action("add_tensor", request.SerializeToString()),
        )
    for name, answer in PROTOBUF_ACTIONS.items():
        for label, body in JSON_BODIES.items():
            yield name, label, {answer}, _action(name, body)
    for label, text in TEXTS.items():
        yield (
            "add_source url",
            label,
            {"INVALID_ARGUMENT"},
            _action("add_source", descriptor_pb2.AddSourceRequest(url=text).SerializeToString()),
        )
        yield (
            "DoPut roi_put array_id",
            label,
            {"INVALID_ARGUMENT"},
            _put(ticket_pb2.PutCommand(roi_put=ticket_pb2.RoiPut(array_id=text)), _roi_rows("{}")),
        )
        yield (
            "DoPut roi_put geometry",
            label,
            {"INVALID_ARGUMENT"},
            _put(ticket_pb2.PutCommand(roi_put=ticket_pb2.RoiPut(array_id="img")), _roi_rows(text)),
        )
        yield (
            "GetFlightInfo array_id",
            label,
            {"NOT_FOUND"},
            _info(
                descriptor_pb2.FlightRequest(
                    tensor_read=descriptor_pb2.TensorReadOption(array_id=text)
                ).SerializeToString()
            ),
        )
        yield (
            "DoGet catalog_query",
            label,
            {"INVALID_ARGUMENT"},
            _get(ticket_pb2.TensorTicket(catalog_query=descriptor_pb2.CatalogQuery(sql=text)).SerializeToString()),
        )
        yield (
            "DoGet roi_read",
            label,
            {"OK"},
            _get(
                ticket_pb2.TensorTicket(  # no annotations under that id
                    roi_read=ticket_pb2.RoiRead(array_id=text)
                ).SerializeToString()
            ),
        )
    for label, body in JSON_BODIES.items():
        yield "DoPut command", label, {"INVALID_ARGUMENT"}, _raw_put(body)
        yield (
            "DoPut roi_delete",
            label,
            {"OK"},
            _raw_put(
                ticket_pb2.PutCommand(  # a set that holds nothing
                    roi_delete=ticket_pb2.RoiDelete(array_id="img", set_name=body.decode("utf-8", "replace"))
                ).SerializeToString()
            ),
        )
        yield (
            "DoPut chunk_ticket",
            label,
            {"INVALID_ARGUMENT"},
            _raw_put(
                ticket_pb2.PutCommand(
                    chunk_ticket=ticket_pb2.TensorTicket(chunk_id=body).SerializeToString()
                ).SerializeToString()
            ),
        )
        yield "GetFlightInfo command", label, {"INVALID_ARGUMENT"}, _info(body)
        yield "DoGet ticket", label, {"INVALID_ARGUMENT"}, _get(body)
        yield (
            "DoGet chunk_id",
            label,
            {"INVALID_ARGUMENT"},
            _get(ticket_pb2.TensorTicket(chunk_id=body).SerializeToString()),
        )


def test_every_body_taking_action_is_fed_here():
    """A new action that takes a body joins the lists above (or this test says so)."""
    bodyless = {"health", "server_stats", "cache_stats", "share_list", "share_rotate"}
    assert {a.name for a in ACTIONS} - bodyless == set(JSON_ACTIONS) | set(PROTOBUF_ACTIONS) | {"add_tensor"}


def test_hostile_bodies_are_answered_promptly_and_cleanly_while_health_keeps_answering(served):
    client = flight.FlightClient(served.location)
    answered = 0
    with HealthWatch(served) as health:
        for verb, label, with_token, send in _requests():
            for token in (None, "not-the-token", TOKEN):
                t0 = time.perf_counter()
                try:
                    send(client, _options(token))
                    code = "OK"
                except flight.FlightError as exc:
                    code = _code(exc)
                seconds = time.perf_counter() - t0
                who = "the token" if token == TOKEN else repr(token)
                assert seconds < PER_REQUEST_S and code not in ("INTERNAL", "TIMEOUT"), (
                    f"{verb} with {label!r} and {who}: {code} after {seconds:.1f} s"
                )
                expected = with_token if token == TOKEN else {"UNAUTHENTICATED"}
                assert code in expected, f"{verb} with {label!r} and {who}: {code}, expected one of {expected}"
                answered += 1
    client.close()
    assert answered == 3 * len(list(_requests()))
    assert not health.failures, health.failures[:5]
    assert max(health.worst.values()) < HEALTH_BOUND_S, health.worst
    pixels = TensorFlightClient(served.location, token=TOKEN).get_array("img")
    np.testing.assert_array_equal(pixels, IMAGE)  # still serving correct pixels
