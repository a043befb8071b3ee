"""TensorFlightServer: the biopb tensor protocol over Arrow Flight (wire-protocol.md §15 P0+P2).

A translation only: each handler turns the Flight call into a ``Caller`` and protobuf into a
call on the ``ServingRuntime`` (``tensor_server/service``), and the answer back into Flight
messages; every error leaves through ``flight_error`` (``flight/errors.py``). No rule lives
here: auth, the upload gate, limits and the action list are the runtime's, so they hold on
every door. Handlers run concurrently on gRPC's thread pool and hold no per-call state.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.catalog.sql_tables import sources_schema
from tensor_server.core.wire import CHUNK_SCHEMA, chunk_batch
from tensor_server.errors import InvalidArgument, TensorNotFound, Unimplemented
from tensor_server.flight.auth import TokenMiddlewareFactory, presented_token
from tensor_server.flight.errors import flight_error, schema_error
from tensor_server.flight.wire import described_flight_info, request_region
from tensor_server.service import Caller, ServingRuntime
from tensor_server.service.bodies import decode_message
from tensor_server.service.metrics import current as current_request
from tensor_server.service.metrics import timing
from tensor_server.service.tls import require_safe_transport

__all__ = ["TensorFlightServer"]

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_SOURCES_PATH = ["sources"]


#: How stale a handler's "has the client gone?" answer may be. Flight's ``context.is_cancelled``
#: costs 80-88 us a call here (pyarrow 26: 1,000 calls from DoGet or DoAction), and the engine
#: asks before every unit it reads: a tensor_stats over 256 blocks spent 21 of its 30 ms asking
#: (7 ms with this), and a scale-4 DoGet of 1024² zarr chunks asked 32 times (2.6 ms). Asking
#: at most every 20 ms costs 0.4 % of a long call and nothing of a short one, and a gone
#: client's work stops within 20 ms.
_CANCEL_POLL_S = 0.02


class _ClientGone:
    """``context.is_cancelled`` asked at most every ``_CANCEL_POLL_S``, the first time one
    interval after the call began (most calls are over by then and never pay the ask); once
    True, always True."""

    __slots__ = ("_ask", "_next", "_gone")

    def __init__(self, ask: Callable[[], bool]) -> None:
        self._ask = ask
        self._next = time.monotonic() + _CANCEL_POLL_S
        self._gone = False

    def __call__(self) -> bool:
        if not self._gone:
            now = time.monotonic()
            if now >= self._next:
                self._gone = bool(self._ask())
                self._next = now + _CANCEL_POLL_S
        return self._gone


def _translated(call: str, translate: Callable[[BaseException, str], Exception] = flight_error) -> Callable[[F], F]:
    """The handler of Flight verb ``call``: one request (its id, count, latency and log
    line: ``service/metrics.py``), and every error leaves as ``translate`` makes it (the
    Flight error of its class), naming the request."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: TensorFlightServer, *args: Any, **kwargs: Any) -> Any:
            rq = self.runtime.metrics.begin("flight", call)
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:  # the one boundary: everything is translated
                rq.failed(exc)
                raise translate(exc, rq.id) from None
            finally:
                self.runtime.metrics.end(rq)

        return wrapper  # type: ignore[return-value]

    return deco


def _streamed(results: Iterator[bytes], request_id: str) -> Iterator[flight.Result]:
    """An action's results as they are made; an error mid-stream is translated too."""
    try:
        for body in results:
            yield flight.Result(body)
    except Exception as exc:  # the one boundary
        raise flight_error(exc, request_id) from None


class TensorFlightServer(flight.FlightServerBase):
    """Serve ``runtime`` at ``grpc://host:port`` (port 0 picks a free port: see ``.port``)."""

    def __init__(self, runtime: ServingRuntime, host: str = "127.0.0.1", port: int = 8815) -> None:
        require_safe_transport(host, runtime.settings, runtime.tls)
        self.runtime = runtime
        self.host = host
        tls = runtime.tls  # the server's certificate (service/tls.py), or None: plaintext
        self.scheme = "grpc+tls" if tls is not None else "grpc"
        certificates = [flight.CertKeyPair(cert=tls.cert_pem, key=tls.key_pem)] if tls is not None else None
        super().__init__(
            f"{self.scheme}://{host}:{port}",
            middleware={"auth": TokenMiddlewareFactory()},
            tls_certificates=certificates,
        )
        runtime.flight_listening(host, self.port)

    def shutdown(self) -> None:
        """End the watch streams first: each lasts until its client goes, and the base
        shutdown waits for every call to finish."""
        self.runtime.watches.close()
        super().shutdown()

    @property
    def location(self) -> str:
        return f"{self.scheme}://{self.host if self.host != '0.0.0.0' else '127.0.0.1'}:{self.port}"

    @staticmethod
    def _caller(context: flight.ServerCallContext) -> Caller:
        peer = context.peer()
        peer = peer.decode() if isinstance(peer, bytes) else str(peer)
        rq = current_request()
        if rq is not None:
            rq.peer = peer  # the request log's
        return Caller(token=presented_token(context), peer=peer, door="flight")

    # ---- GetFlightInfo / ListFlights / GetSchema ------------------------------------------------
    @_translated("GetFlightInfo")
    def get_flight_info(self, context, descriptor):  # pyarrow signature
        caller = self._caller(context)
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            self.runtime.authenticate(caller)
            return self._sources_info(descriptor)
        self.runtime.refuse_stranger(caller)  # the caller before the body, on every body-taking verb
        kept = self.runtime.kept_plan(caller, descriptor.command)  # the same request, rules run again
        if kept is not None:
            return kept
        request = decode_message(descriptor_pb2.FlightRequest, descriptor.command, "GetFlightInfo")
        if request.WhichOneof("request") != "tensor_read":
            raise InvalidArgument("GetFlightInfo: the FlightRequest carries no tensor_read")
        option = request.tensor_read
        described = self.runtime.describe(
            caller,
            option.array_id,
            region=request_region(option),
            scale=list(option.scale_hint),
            method=option.reduction_method,
            fields=option.fields.paths,
        )
        info = described_flight_info(described, self.runtime.policy, option.SerializeToString())
        self.runtime.keep_plan(descriptor.command, described, info)
        return info

    def _sources_info(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        path = [p.decode("utf-8", "replace") if isinstance(p, bytes) else p for p in descriptor.path]
        if path != _SOURCES_PATH:
            raise TensorNotFound(
                f"unknown flight path {path[:4]!r}; the catalog is at {_SOURCES_PATH}", slug="unknown_flight_path"
            )
        ticket = ticket_pb2.TensorTicket(catalog_query=descriptor_pb2.CatalogQuery(sql="SELECT * FROM sources"))
        endpoint = flight.FlightEndpoint(ticket.SerializeToString(), [])
        return flight.FlightInfo(sources_schema(), descriptor, [endpoint], -1, -1)

    @_translated("ListFlights")
    def list_flights(self, context, criteria):
        """The public catalog: one flight per queryable table (its schema and a ticket that
        reads it), so a stock Flight client can browse without a biopb proto. It takes no
        criteria: there is nothing to filter."""
        self.runtime.authenticate(self._caller(context))
        if criteria:
            raise InvalidArgument(
                f"ListFlights takes no criteria (got {len(criteria)} bytes): it lists the one "
                f"table, {_SOURCES_PATH}; send empty criteria"
            )
        return iter([self._sources_info(flight.FlightDescriptor.for_path(*_SOURCES_PATH))])

    @_translated("GetSchema", schema_error)
    def get_schema(self, context, descriptor):
        """The catalog table's schema by its path; a tensor read's command is well formed but
        not answered here (its schema is its plan's chunk schema, GetFlightInfo)."""
        self.runtime.authenticate(self._caller(context))
        if descriptor.descriptor_type != flight.DescriptorType.PATH:
            request = decode_message(descriptor_pb2.FlightRequest, descriptor.command, "GetSchema")
            if request.WhichOneof("request") != "tensor_read":
                raise InvalidArgument(
                    "GetSchema: the command is no FlightRequest with a tensor_read; GetSchema "
                    f"answers the catalog table's path {_SOURCES_PATH}"
                )
            raise Unimplemented(
                "GetSchema answers the catalog table's path ['sources']; a tensor's schema is "
                "the chunk schema of its plan (GetFlightInfo)"
            )
        return flight.SchemaResult(self._sources_info(descriptor).schema)

    # ---- DoGet ----------------------------------------------------------------------------------
    @_translated("DoGet")
    def do_get(self, context, ticket):
        caller = self._caller(context)
        self.runtime.refuse_stranger(caller)
        tt = decode_message(ticket_pb2.TensorTicket, ticket.ticket, "DoGet")
        kind = tt.WhichOneof("payload")
        if kind == "catalog_query":
            gone = _ClientGone(context.is_cancelled)
            return flight.RecordBatchStream(self.runtime.query(tt.catalog_query.sql, caller, gone))
        if kind == "chunk_id":
            _, data = self.runtime.chunk(tt.chunk_id, caller, _ClientGone(context.is_cancelled))
            with timing("encode"):
                batch = chunk_batch(data)  # wraps the (possibly mapped) bytes; Flight serialises them
                table = pa.Table.from_batches([batch], schema=CHUNK_SCHEMA)
            current_request().nbytes = data.nbytes
            return flight.RecordBatchStream(table)
        if kind == "roi_read":
            return flight.RecordBatchStream(self.runtime.catalog_verbs.roi_read(tt.roi_read, caller))
        raise InvalidArgument(f"DoGet: unsupported ticket kind {kind!r}")

    # ---- DoPut ----------------------------------------------------------------------------------
    @_translated("DoPut")
    def do_put(self, context, descriptor, reader, writer):
        """The ``PutCommand`` arm the SDK puts in the descriptor: ROI annotation writes and
        pixel uploads (``chunk_ticket``). Rows are handed over batch by batch: the runtime
        checks the target first and stops reading past its budget."""
        caller = self._caller(context)
        self.runtime.refuse_stranger(caller)
        cmd = decode_message(ticket_pb2.PutCommand, descriptor.command, "DoPut")
        arm = cmd.WhichOneof("command")
        batches = (chunk.data for chunk in reader)
        if arm in ("roi_put", "roi_delete"):
            reply = self.runtime.catalog_verbs.roi_write(cmd, batches, caller, _ClientGone(context.is_cancelled))
            writer.write(pa.py_buffer(reply))
            return
        if arm == "chunk_ticket":
            self.runtime.put_chunk(cmd.chunk_ticket, batches, caller, _ClientGone(context.is_cancelled))
            return
        raise Unimplemented(f"DoPut {arm or 'without a command'} is not supported by this server")

    # ---- actions --------------------------------------------------------------------------------
    @_translated("ListActions")
    def list_actions(self, context):
        return self.runtime.list_actions(self._caller(context))

    @_translated("DoAction")
    def do_action(self, context, action):
        from tensor_server.service.actions import find_action

        results = self.runtime.do_action(
            action.type, action.body.to_pybytes(), self._caller(context), _ClientGone(context.is_cancelled)
        )
        if find_action(self.runtime, action.type).streams:
            return _streamed(iter(results), current_request().id)
        return iter([flight.Result(body) for body in results])
