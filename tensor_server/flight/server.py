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
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.catalog.catalog import Catalog, sources_schema
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.core.engine import ReadEngine
from tensor_server.core.plan import plan_read
from tensor_server.core.pyramid import PyramidPolicy
from tensor_server.errors import InvalidArgument
from tensor_server.flight.actions import ACTION_DESCRIPTIONS, CatalogActions
from tensor_server.flight import stats
from tensor_server.flight.auth import TokenMiddlewareFactory, check_token
from tensor_server.flight.wire import (
    CHUNK_SCHEMA,
    check_read_request,
    chunk_batch,
    describe_descriptor,
    flight_error,
    plan_flight_info,
    read_mask,
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
    #: answer blocks the metadata says hold one value in closed form (core/uniform.py)
    special_chunks: bool = True
    write_dir: str | None = None
    #: output bytes the precacher may queue after each client read (0 = off; needs the cache)
    precache_bytes: int = 64 << 20
    #: chunk computations (cache misses) at once; more wait, then get UNAVAILABLE (0 = no bound)
    max_computes: int = 0
    admission_timeout: float = 30.0
    #: serve the Flight write verbs (add_tensor, set_upload_status, DoPut); needs write_dir
    writable: bool = False
    upload_ttl: float = 3600.0
    scratch_ttl: float = 86400.0
    read_workers: int | None = None  # scaled reads' read-ahead (stream_reduce workers); None = cores
    #: a ``service.tls.ServerTls``: serve ``grpc+tls://`` with its certificate (None = plaintext)
    tls: Any = None


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

    def __init__(self, catalog: Catalog, config: ServerConfig | None = None, cache_manager: Any | None = None,
                 upload_manager: Any | None = None) -> None:
        self.config = config or ServerConfig()
        if not is_loopback_host(self.config.host) and not self.config.token:
            # A non-loopback bind without a token would expose every file under the roots
            # to the network. Refuse rather than guess (documented in the README).
            raise ValueError(
                f"refusing to bind {self.config.host}: a non-loopback address needs --token "
                "(or bind 127.0.0.1)"
            )
        self.catalog = catalog
        self.actions = CatalogActions(catalog)
        self.cache_manager = cache_manager
        #: the one read path: every chunk this server sends comes from here
        self.engine = ReadEngine(
            cache_manager,
            workers=self.config.read_workers,
            source_scaled_reads=self.config.source_scaled_reads,
            max_computes=self.config.max_computes or None,
            admission_timeout=self.config.admission_timeout,
            special_chunks=self.config.special_chunks,
            on_changed=catalog.reopen_changed,
        )
        #: warms what a viewer asks next (needs the cache to keep what it warms)
        self.precacher = None
        if cache_manager is not None and self.config.precache_bytes > 0:
            from tensor_server.cache.precache import Precacher

            self.precacher = Precacher(self.engine, policy=self.config.pyramid, budget_bytes=self.config.precache_bytes)
        self.started_at = time.time()
        #: handler call counts (DoGet, GetFlightInfo, actions by name): cheap and useful
        #: for stats and for tests that prove a fast path bypassed DoGet
        self.calls: Counter[str] = Counter()
        #: chunk reads (DoGet and chunk_locate) by client address: shows how a cluster's
        #: workers spread their reads (the ``server_stats`` action)
        self.chunk_reads_by_peer: Counter[str] = Counter()
        from tensor_server.flight.uploads import UploadGlue

        #: uploads (flight/uploads.py); its manager is None without a write_dir. Built before
        #: the listener starts, so no call can arrive before it exists.
        self.uploads = UploadGlue(self, upload_manager)
        tls = self.config.tls
        self.scheme = "grpc+tls" if tls is not None else "grpc"
        certificates = [flight.CertKeyPair(cert=tls.cert_pem, key=tls.key_pem)] if tls is not None else None
        location = f"{self.scheme}://{self.config.host}:{self.config.port}"
        try:
            super().__init__(location, middleware={"auth": TokenMiddlewareFactory()}, tls_certificates=certificates)
        except BaseException:
            self.uploads.close()
            raise

    def shutdown(self) -> None:
        super().shutdown()
        self.uploads.close()
        if self.precacher is not None:
            self.precacher.close()

    # ---- helpers ----------------------------------------------------------------------------
    def _auth(self, context: flight.ServerCallContext) -> None:
        check_token(context, self.config.token)

    @property
    def location(self) -> str:
        return f"{self.scheme}://{self.config.host if self.config.host != '0.0.0.0' else '127.0.0.1'}:{self.port}"

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
        answered = self.uploads.tensor_info(option)  # uploaded tensors: write plans, status, gate
        if answered is not None:
            return answered
        tensor, echo = self.catalog.find_tensor(option.array_id)
        return self.describe_tensor(tensor, echo, option)

    def describe_tensor(self, tensor, echo: str, option, upload_status=None) -> flight.FlightInfo:  # noqa: ANN001
        """The FlightInfo answering ``option`` for ``tensor`` (plan and/or describe)."""
        fields = read_mask(option)
        region = request_region(option, tensor.ndim)
        if self._reopened_if_stale(tensor, region):  # plan against the bytes on disk now
            tensor, echo = self.catalog.find_tensor(option.array_id)
            region = request_region(option, tensor.ndim)
        scale = list(option.scale_hint) or None
        check_read_request(region, scale, tensor.shape)
        wants_endpoints = "endpoints" in fields
        plan = None
        if wants_endpoints or region is not None or (scale and any(s != 1 for s in scale)):
            plan = plan_read(tensor, region, scale, option.reduction_method)
            if wants_endpoints and not plan.chunks:
                raise InvalidArgument(f"{option.array_id}: the requested region is empty")
        metadata_json = None
        record = self.catalog.get_record(tensor.array_id.split("/", 1)[0])
        if "metadata_json" in fields and record.source is not None:
            metadata_json = record.source.metadata_json()
        resident = record.is_resident() if "is_resident" in fields else None
        desc = describe_descriptor(tensor, echo, fields, plan, region is not None, metadata_json, self.config.pyramid,
                                   resident)
        if upload_status is not None:
            desc.upload_status.CopyFrom(upload_status)
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
                table = self.catalog.query(tt.catalog_query.sql, cancelled=context.is_cancelled)
                return flight.RecordBatchStream(table)
            if kind == "chunk_id":
                return self._chunk_stream(tt.chunk_id, context)
            if kind == "roi_read":
                return self.actions.roi_read(tt.roi_read)
            raise InvalidArgument(f"unsupported ticket kind {kind!r}")
        except flight.FlightError:
            raise
        except Exception as exc:
            raise flight_error(exc) from None

    def _tensor_for_chunk(self, array_id: str):  # noqa: ANN202 - TensorAdapter
        """The tensor a chunk id names: exactly a tensor id (a bare source id only names the
        default tensor in requests, never in chunk ids)."""
        tensor, _ = self.catalog.find_tensor(array_id)
        if tensor.array_id != array_id:
            from tensor_server.errors import InvalidChunkId

            raise InvalidChunkId(f"chunk id names {array_id[:120]!r}, which is not a tensor id")
        self.uploads.check_readable(tensor)  # an uploaded tensor reads once READY
        return tensor

    def _chunk_data(self, raw: bytes, context=None):  # noqa: ANN001, ANN202
        """(chunk id, read-only pixels) through the engine; work stops if the client goes."""
        tensor = self._tensor_for_chunk(ChunkId.decode(raw).array_id)
        if context is not None:
            self.chunk_reads_by_peer[str(context.peer())] += 1
        cancelled = context.is_cancelled if context is not None else None
        if self.precacher is None:
            return self.engine.chunk(raw, tensor, cancelled=cancelled)
        with self.precacher.client_read():
            cid, data = self.engine.chunk(raw, tensor, cancelled=cancelled)
        self.precacher.after_read(tensor, cid)
        return cid, data

    def _reopened_if_stale(self, tensor, region: Bounds | None) -> bool:  # noqa: ANN001
        """Plan time: reopen the source when the bytes under the region changed since it was
        opened (True), so the plan mints ids of the new content version."""
        try:
            bounds = Bounds.full(tensor.shape) if region is None else region.clamp(tensor.shape).validate(tensor.shape)
        except InvalidArgument:
            return False  # plan_read reports the bad region
        reason = tensor.stale_reason(bounds)
        if reason is None:
            return False
        self.catalog.reopen_changed(tensor, reason)
        return True

    def _chunk_stream(self, raw: bytes, context=None) -> flight.RecordBatchStream:  # noqa: ANN001
        _, data = self._chunk_data(raw, context)
        batch = chunk_batch(data)  # wraps the (possibly mapped) bytes; Flight serialises them
        return flight.RecordBatchStream(pa.Table.from_batches([batch], schema=CHUNK_SCHEMA))

    # ---- DoPut ------------------------------------------------------------------------------------
    def do_put(self, context, descriptor, reader, writer):  # noqa: ANN001
        """Dispatch on the ``PutCommand`` arm the SDK puts in the descriptor: ROI annotation
        writes (flight/actions.py) and pixel uploads (``chunk_ticket``, flight/uploads.py)."""
        self.calls["DoPut"] += 1
        self._auth(context)
        cmd = ticket_pb2.PutCommand()
        try:
            cmd.ParseFromString(descriptor.command or b"")
        except Exception:
            raise flight_error(InvalidArgument("DoPut descriptor is not a PutCommand")) from None
        arm = cmd.WhichOneof("command")
        if arm in ("roi_put", "roi_delete"):
            return self.actions.roi_put(cmd, reader, writer)
        if arm == "chunk_ticket":
            return self.uploads.do_put(descriptor, reader)
        raise flight_error(InvalidArgument(f"DoPut {arm or 'without a command'} is not supported by this server"))

    # ---- actions ---------------------------------------------------------------------------------
    def list_actions(self, context):  # noqa: ANN001
        self._auth(context)  # like every call but the health action
        actions = [("health", "server status and protocol version (JSON)"), stats.ACTION,
                   ("server_stats", "call counts and chunk reads by client address (JSON)")] + list(ACTION_DESCRIPTIONS)
        if self.uploads.writable:
            actions += [("add_tensor", "add a PENDING tensor to a source (uploads)"),
                        ("set_upload_status", "move an upload to READY or DISCARDED")]
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
        answered = self.uploads.do_action(kind, action.body.to_pybytes())
        if answered is not None:
            return iter(answered)
        if kind == "chunk_locate" and self.cache_manager is not None:
            return iter([flight.Result(json.dumps(self._locate(context, action.body.to_pybytes())).encode())])
        if kind == "server_stats":
            body = {"calls": dict(self.calls), "chunk_reads_by_peer": dict(self.chunk_reads_by_peer)}
            return iter([flight.Result(json.dumps(body).encode())])
        if kind == "tensor_stats":
            body = self._guarded(stats.tensor_stats_action, self, action.body.to_pybytes())
            return iter([flight.Result(json.dumps(body).encode())])
        if kind == "cache_stats":
            if self.cache_manager is None:
                return iter([])  # no result means "no cache" to the SDK
            body = self.cache_manager.cache_stats()
            if self.precacher is not None:
                body["precache"] = dict(self.precacher.stats)
            return iter([flight.Result(json.dumps(body).encode())])
        if self.actions.handles(kind):
            return self.actions.do_action(kind, action.body.to_pybytes())
        raise flight.FlightServerError(f"Unknown action: {kind}")

    @staticmethod
    def _guarded(handler, *args):  # noqa: ANN001, ANN205
        """An action handler's result, its errors mapped to Flight errors (§12)."""
        try:
            return handler(*args)
        except flight.FlightError:
            raise
        except Exception as exc:
            raise flight_error(exc) from None

    def _locate(self, context, body: bytes) -> dict[str, Any]:  # noqa: ANN001
        """wire-protocol §7: the chunk's batch in a segment file the client can map. The
        chunk goes through the same checks as DoGet (a stale id is refused), is resolved
        into the cache when missing, and is only offered to loopback peers: a path is
        useless, and revealing, to a client on another machine."""
        if not _peer_is_loopback(context.peer()):
            return {"available": False}
        try:
            tt = ticket_pb2.TensorTicket()
            try:
                tt.ParseFromString(body)
            except Exception:
                raise InvalidArgument("chunk_locate body is not a TensorTicket") from None
            if tt.WhichOneof("payload") != "chunk_id":
                return {"available": False}
            own = self.uploads.locate(tt)  # a cache:// member chunk: its own sealed segment
            if own is not None:
                return own
            cid, _ = self._chunk_data(tt.chunk_id, context)
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
            "writable": self.uploads.writable,
            "full_scan_in_progress": cat.scan_in_progress,
            "last_full_scan_finished_at": cat.last_scan_finished_at,
            "scan_error": cat.scan_error,
            "ticket_stubs": False,
            "registration_pending": 0,  # sources are opened during the scan, never left pending
            "annotations_persisted": cat.rois.path is not None,
            "catalog_generation": cat.generation,
            **(self.config.tls.health() if self.config.tls is not None else {"tls": False}),
        }
