"""TensorFlightServer: the biopb tensor protocol over Arrow Flight (wire-protocol.md §15 P0+P2).

Handlers run concurrently on gRPC's thread pool; they share one Catalog (adapters opened
once) and hold no per-call state. Every handler maps package errors to the Flight error
classes and JSON ``extra_info`` codes the SDK interprets (§12); nothing a client sends can
take the process down.
"""
from __future__ import annotations

import ipaddress
from collections import Counter
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.catalog.catalog import Catalog, sources_schema
from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.plan import plan_read
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import InvalidArgument
from tensor_server.flight.auth import TokenMiddlewareFactory, check_token
from tensor_server.flight.wire import (
    CHUNK_SCHEMA,
    chunk_batch,
    describe_descriptor,
    flight_error,
    plan_flight_info,
    request_region,
)

__all__ = ["ServerConfig", "TensorFlightServer", "is_loopback_host"]

log = logging.getLogger(__name__)
PROTOCOL = 3


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8815
    token: str | None = None
    pyramid: PyramidPolicy = field(default_factory=PyramidPolicy)
    rescan_seconds: float = 0.0
    cache_dir: str | None = None
    cache_max_bytes: int = 4 << 30
    source_scaled_reads: bool = True
    write_dir: str | None = None
    read_workers: int | None = None  # scaled reads' read-ahead (stream_reduce workers); None = cores


def _peer_is_loopback(peer: str | bytes) -> bool:
    """gRPC peer strings: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``."""
    peer = peer.decode() if isinstance(peer, bytes) else str(peer)
    if peer.startswith("unix:"):
        return True
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]") if kind in ("ipv4", "ipv6") else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


class TensorFlightServer(flight.FlightServerBase):
    """Serve ``catalog`` at ``grpc://host:port`` (port 0 picks a free port: see ``.port``)."""

    def __init__(self, catalog: Catalog, config: ServerConfig | None = None, cache_manager: Any | None = None) -> None:
        self.config = config or ServerConfig()
        if not is_loopback_host(self.config.host) and not self.config.token:
            # A non-loopback bind without a token would expose every file under the roots
            # to the network. Refuse rather than guess (documented in the README).
            raise ValueError(
                f"refusing to bind {self.config.host}: a non-loopback address needs --token "
                "(or bind 127.0.0.1)"
            )
        self.catalog = catalog
        self.cache_manager = cache_manager
        self.started_at = time.time()
        #: handler call counts (DoGet, GetFlightInfo, actions by name): cheap and useful
        #: for stats and for tests that prove a fast path bypassed DoGet
        self.calls: Counter[str] = Counter()
        location = f"grpc://{self.config.host}:{self.config.port}"
        super().__init__(location, middleware={"auth": TokenMiddlewareFactory()})

    # ---- helpers ----------------------------------------------------------------------------
    def _auth(self, context: flight.ServerCallContext) -> None:
        check_token(context, self.config.token)

    @property
    def location(self) -> str:
        return f"grpc://{self.config.host if self.config.host != '0.0.0.0' else '127.0.0.1'}:{self.port}"

    # ---- GetFlightInfo -------------------------------------------------------------------------
    def get_flight_info(self, context, descriptor):  # noqa: ANN001 - pyarrow signature
        self.calls["GetFlightInfo"] += 1
        self._auth(context)
        try:
            if descriptor.descriptor_type == flight.DescriptorType.PATH:
                return self._catalog_info(descriptor)
            return self._tensor_info(descriptor.command)
        except flight.FlightError:
            raise
        except Exception as exc:
            raise flight_error(exc) from None

    def _catalog_info(self, descriptor) -> flight.FlightInfo:  # noqa: ANN001
        path = [p.decode() if isinstance(p, bytes) else p for p in descriptor.path]
        if path != ["sources"]:
            raise InvalidArgument(f"unknown flight path {path}")
        ticket = ticket_pb2.TensorTicket(catalog_query=descriptor_pb2.CatalogQuery(sql="SELECT * FROM sources"))
        endpoint = flight.FlightEndpoint(ticket.SerializeToString(), [])
        return flight.FlightInfo(sources_schema(), descriptor, [endpoint], -1, -1)

    def _tensor_info(self, command: bytes) -> flight.FlightInfo:
        request = descriptor_pb2.FlightRequest()
        try:
            request.ParseFromString(command)
        except Exception:
            raise InvalidArgument("GetFlightInfo command is not a FlightRequest") from None
        if request.WhichOneof("request") != "tensor_read":
            raise InvalidArgument("FlightRequest carries no tensor_read")
        option = request.tensor_read
        tensor, echo = self.catalog.find_tensor(option.array_id)
        fields = set(option.fields.paths)
        region = request_region(option, tensor.ndim)
        scale = list(option.scale_hint) or None
        wants_endpoints = "endpoints" in fields
        plan = None
        if wants_endpoints or region is not None or (scale and any(s != 1 for s in scale)):
            plan = plan_read(tensor, region, scale, option.reduction_method)
            if wants_endpoints and not plan.chunks:
                raise InvalidArgument(f"{option.array_id}: the requested region is empty")
        metadata_json = None
        if "metadata_json" in fields:
            source_id = tensor.array_id.split("/", 1)[0]
            src = self.catalog.get_record(source_id).source
            metadata_json = src.metadata_json() if src is not None else None
        desc = describe_descriptor(tensor, echo, fields, plan, region is not None, metadata_json, self.config.pyramid)
        return plan_flight_info(desc, plan if wants_endpoints else None, option.SerializeToString())

    # ---- DoGet ------------------------------------------------------------------------------------
    def do_get(self, context, ticket):  # noqa: ANN001
        self.calls["DoGet"] += 1
        self._auth(context)
        try:
            tt = ticket_pb2.TensorTicket()
            try:
                tt.ParseFromString(ticket.ticket)
            except Exception:
                raise InvalidArgument("ticket is not a TensorTicket") from None
            kind = tt.WhichOneof("payload")
            if kind == "catalog_query":
                table = self.catalog.query(tt.catalog_query.sql)
                return flight.RecordBatchStream(table)
            if kind == "chunk_id":
                return self._chunk_stream(tt.chunk_id)
            raise InvalidArgument(f"unsupported ticket kind {kind!r}")
        except flight.FlightError:
            raise
        except Exception as exc:
            raise flight_error(exc) from None

    def _chunk_data(self, raw: bytes):
        """(chunk id, read-only pixels): validated first, then from the cache (a hit is the
        stored chunk, no decode; a miss is computed and stored) or computed."""
        cid = ChunkId.decode(raw)
        tensor, _ = self.catalog.find_tensor(cid.array_id)
        if tensor.array_id != cid.array_id:
            from tensor_server.errors import InvalidChunkId

            raise InvalidChunkId(f"chunk id names {cid.array_id!r}, which is not a tensor id")
        cid = tensor.check_chunk_id(cid)
        cache = self.cache_manager
        if cache is None:
            return cid, tensor.compute_chunk_data(cid)
        return cid, cache.get_or_compute(cid.encode(), lambda: tensor.compute_chunk_data(cid, cache))

    def _chunk_stream(self, raw: bytes) -> flight.RecordBatchStream:
        _, data = self._chunk_data(raw)
        batch = chunk_batch(data)  # wraps the (possibly mapped) bytes; Flight serialises them
        return flight.RecordBatchStream(pa.Table.from_batches([batch], schema=CHUNK_SCHEMA))

    # ---- actions ---------------------------------------------------------------------------------
    def list_actions(self, context):  # noqa: ANN001
        actions = [("health", "server status and protocol version (JSON)")]
        if self.cache_manager is not None:
            actions += [("chunk_locate", "segment file and offset of a cached chunk (loopback only)"),
                        ("cache_stats", "chunk cache statistics (JSON)")]
        return actions

    def do_action(self, context, action):  # noqa: ANN001
        kind = action.type
        self.calls[f"action:{kind}"] += 1
        if kind == "health":
            return iter([flight.Result(json.dumps(self.health()).encode())])
        self._auth(context)
        if kind == "chunk_locate" and self.cache_manager is not None:
            return iter([flight.Result(json.dumps(self._locate(context, action.body.to_pybytes())).encode())])
        if kind == "cache_stats":
            if self.cache_manager is None:
                return iter([])  # no result means "no cache" to the SDK
            return iter([flight.Result(json.dumps(self.cache_manager.cache_stats()).encode())])
        raise flight.FlightServerError(f"Unknown action: {kind}")

    def _locate(self, context, body: bytes) -> dict[str, Any]:  # noqa: ANN001
        """wire-protocol §7: the chunk's batch in a segment file the client can map. The
        chunk goes through the same checks as DoGet (a stale id is refused), is resolved
        into the cache when missing, and is only offered to loopback peers: a path is
        useless, and revealing, to a client on another machine."""
        if not _peer_is_loopback(context.peer()):
            return {"available": False}
        try:
            tt = ticket_pb2.TensorTicket()
            tt.ParseFromString(body)
            if tt.WhichOneof("payload") != "chunk_id":
                return {"available": False}
            cid, _ = self._chunk_data(tt.chunk_id)
        except flight.FlightError:
            raise
        except Exception as exc:
            raise flight_error(exc) from None
        loc = self.cache_manager.locate(cid.encode())
        if loc is None:  # e.g. larger than the whole cache budget, or evicted just now
            return {"available": False}
        return {"available": True, "segment_path": loc.segment_path, "byte_offset": loc.byte_offset,
                "byte_length": loc.byte_length, "generation_id": loc.generation_id}

    def health(self) -> dict[str, Any]:
        cat = self.catalog
        return {
            "protocol": PROTOCOL,
            "status": "SERVING" if cat.first_scan_done.is_set() else "STARTING",
            "source_count": len(cat),
            "uptime_seconds": int(time.time() - self.started_at),
            "metadata_db_enabled": True,
            "writable": False,
            "full_scan_in_progress": cat.scan_in_progress,
            "last_full_scan_finished_at": cat.last_scan_finished_at,
            "ticket_stubs": False,
        }
