"""The action registry: every action any door serves, in one list.

An ``Action`` is a name, a description (what ``list_actions`` and ``docs/service.md``
say), a handler ``(runtime, caller, body, cancelled) -> iterable of result bodies``, and its
rules: whether it is open without the token (only ``health``); whether it is a read of one
tensor its handler authorizes itself (``per_tensor``: the server token or that tensor's
grant, ``service/access.py``; a caller with no credential the server knows is refused
before the body is parsed) rather than the control surface (checked before the handler
runs); whether it writes (refused, and not listed, on a ``--read-only`` server); whether it
streams (results are sent as they are made, so a long one is cancellable and shows
progress); and when it is available at all. Flight's ``list_actions`` / ``do_action`` are
this list; so is any later door's.

Adding an action is one entry here, a handler, and a test (``docs/service.md`` shows one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, Unimplemented
from tensor_server.service import share_verbs, upload_verbs
from tensor_server.service.bodies import decode_message

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["Action", "ACTIONS", "find_action", "available_actions", "actions_table"]

Handler = Callable[["ServingRuntime", "Caller", bytes, Callable[[], bool]], Iterable[bytes]]


def _always(runtime: ServingRuntime) -> bool:
    return True


def _writable(runtime: ServingRuntime) -> bool:
    return runtime.writable


def _cached(runtime: ServingRuntime) -> bool:
    return runtime.cache is not None


@dataclass(frozen=True)
class Action:
    name: str
    description: str
    handler: Handler
    writes: bool = False
    streams: bool = False
    open: bool = False
    per_tensor: bool = False
    #: changes the server itself: beyond the control surface, a sign-in bound by folder rules
    #: needs write on the whole catalog (``Access.administer``)
    admin: bool = False
    available: Callable[[ServingRuntime], bool] = _always


def _json(value: object) -> Iterable[bytes]:
    return [json.dumps(value).encode()]


# ---- handlers (one line each where the verb lives elsewhere) -----------------------------------
def _health(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterable[bytes]:
    return _json(rt.health())


def _server_stats(rt, caller, body, cancelled):  # Handler
    return _json(rt.server_stats())


def _cache_stats(rt, caller, body, cancelled):
    stats = rt.cache_stats()
    return [] if stats is None else _json(stats)  # no result means "no cache" to the SDK


def _chunk_locate(rt, caller, body, cancelled):
    from biopb.tensor import ticket_pb2

    ticket = decode_message(ticket_pb2.TensorTicket, body, "chunk_locate")
    if ticket.WhichOneof("payload") != "chunk_id":
        return _json({"available": False})
    return _json(rt.locate(ticket.chunk_id, caller))


def _tensor_stats(rt, caller, body, cancelled):
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.stats import tensor_stats

    usage = 'tensor_stats takes {"array_id": "...", "slice": {"start": [...], "stop": [...]}} (slice optional)'
    request = decode_json(body, "tensor_stats body") if body else {}
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(usage)
    tensor, _ = rt.tensor(request["array_id"], caller)
    region, bounds = request.get("slice"), None
    if region is not None:
        if not isinstance(region, dict) or not all(isinstance(region.get(k), list) for k in ("start", "stop")):
            raise InvalidArgument(usage)
        if not all(type(v) is int for v in region["start"] + region["stop"]):
            raise InvalidArgument("tensor_stats: slice start and stop must be lists of integers")
        bounds = Bounds(tuple(region["start"]), tuple(region["stop"])).clamp(tensor.shape)
    return _json(tensor_stats(tensor, bounds, rt.engine, cancelled=cancelled))


def _watch(rt, caller, body, cancelled):
    from tensor_server.service.watch import watch_request

    array_id, since = watch_request(body)
    records = rt.watches.stream(caller, array_id, since, cancelled)
    return (json.dumps(r).encode() for r in records if r is not None)


def _add_source(rt, caller, body, cancelled):
    return rt.catalog_verbs.add_source(body, cancelled)


def _resolve(rt, caller, body, cancelled):
    return rt.catalog_verbs.resolve(body, caller)  # its row lists only what the caller may read


def _export(rt, caller, body, cancelled):
    from tensor_server.service.export_verb import export_action

    return export_action(rt, caller, body, cancelled)


def _warm(rt, caller, body, cancelled):
    from tensor_server.service.warm_verb import warm_action

    return warm_action(rt, caller, body, cancelled)


def _catalog_children(rt, caller, body, cancelled):
    return rt.catalog_verbs.catalog_children(body, caller)  # lists only what the caller may read


def _roi_prune(rt, caller, body, cancelled):
    return rt.catalog_verbs.roi_prune(body, caller)


def _rois_geojson(rt, caller, body, cancelled):
    usage = 'rois_geojson takes {"array_id": "...", "set_name": "..."} (set_name optional)'
    request = decode_json(body, "rois_geojson body") if body else {}
    if not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(usage)
    set_name = request.get("set_name", "")
    if not isinstance(set_name, str):
        raise InvalidArgument(usage)
    return [rt.catalog_verbs.rois_geojson(request["array_id"], set_name, caller)]


def _put_rois_geojson(rt, caller, body, cancelled):
    """The body is a JSON header line, then the GeoJSON: the header names the tensor, so the
    caller is checked against it before a byte of the GeoJSON is parsed."""
    usage = 'put_rois_geojson takes a header line {"array_id": "...", "set_name": "..."}, a newline, then the GeoJSON'
    header, newline, geojson = bytes(body).partition(b"\n")
    request = decode_json(header, "put_rois_geojson header line")
    if not newline or not isinstance(request, dict) or not isinstance(request.get("array_id"), str):
        raise InvalidArgument(usage)
    target = rt.catalog_verbs.geojson_import(request["array_id"], caller, request.get("set_name", ""))
    return _json(target.store(geojson))


def _verb(method: str) -> Handler:
    """A handler calling ``runtime.catalog_verbs.<method>(body)``."""

    def handler(rt, caller, body, cancelled):
        return getattr(rt.catalog_verbs, method)(body)

    handler.__name__ = method
    return handler


ACTIONS: tuple[Action, ...] = (
    Action("health", "server status and protocol version (JSON)", _health, open=True),
    Action("server_stats", "call counts and chunk reads by client address (JSON)", _server_stats),
    Action(
        "tensor_stats",
        "min/max/sum/mean/count_nonzero of a tensor or region (JSON body: array_id, slice)",
        _tensor_stats,
        per_tensor=True,
    ),
    Action(
        "watch",
        "follow a growing tensor: streams {array_id, shape, sequence} records as it grows (JSON body: "
        "array_id, since); ends when the client goes",
        _watch,
        streams=True,
        per_tensor=True,
    ),
    Action("resolve", "open an unreadable source again now; streams its catalog row", _resolve, streams=True),
    Action(
        "add_source",
        "register a path on the server's disk, or an image's https/http/s3 URL, for this server's lifetime "
        "(streams progress)",
        _add_source,
        writes=True,
        streams=True,
        admin=True,
    ),
    Action(
        "remove_source",
        "deregister a path added with add_source (its dnd:// branch) or an added URL",
        _verb("remove_source"),
        writes=True,
        admin=True,
    ),
    Action(
        "catalog_children",
        "one level of the catalog tree: the folders and sources under a folder (JSON)",
        _catalog_children,
    ),
    Action(
        "roi_prune",
        "report (or with apply, delete) annotations whose source has been unseen for N days",
        _roi_prune,
        admin=True,
    ),
    Action(
        "rois_geojson",
        "a tensor's annotations as a GeoJSON FeatureCollection in QuPath's convention (JSON body: array_id, set_name)",
        _rois_geojson,
        per_tensor=True,
    ),
    Action(
        "put_rois_geojson",
        "import a GeoJSON FeatureCollection (QuPath's included) as annotations, all or nothing (body: a JSON "
        "header line with array_id and set_name, then the GeoJSON)",
        _put_rois_geojson,
        writes=True,
        per_tensor=True,
    ),
    Action(
        "share",
        "a link that reads one tensor until it expires (JSON body: array_id, expires_seconds, scope read or "
        "read+annotate; answers id, capability, url)",
        share_verbs.share,
    ),
    Action(
        "share_list",
        "the share links the caller made (the server token: all), with their state",
        share_verbs.share_list,
    ),
    Action(
        "share_revoke",
        "revoke a share link (JSON body: id): refused from the next request on",
        share_verbs.share_revoke,
    ),
    Action(
        "share_rotate",
        "a new share secret: every share link made before is refused",
        share_verbs.share_rotate,
        admin=True,
    ),
    Action(
        "add_tensor",
        "add a PENDING tensor to a source (uploads)",
        upload_verbs.add_tensor,
        writes=True,
        available=_writable,
    ),
    Action(
        "set_upload_status",
        "move an upload to READY or DISCARDED",
        upload_verbs.set_upload_status,
        writes=True,
        available=_writable,
    ),
    Action(
        "chunk_locate",
        "segment file and offset of a cached chunk (loopback only)",
        _chunk_locate,
        per_tensor=True,
        available=_cached,
    ),
    Action("cache_stats", "chunk cache statistics (JSON)", _cache_stats),
    Action(
        "warm",
        "fill the chunk cache with a plan's chunks, sending no pixels (JSON body: chunk_ids, or "
        "array_id, region, scale, method, grid: read or tiles); streams progress records",
        _warm,
        streams=True,
        per_tensor=True,
        available=_cached,
    ),
    Action(
        "export",
        "write a tensor as a pyramidal, sharded OME-Zarr under the write dir (JSON body: array_id, "
        "dest, options); streams progress records",
        _export,
        writes=True,
        streams=True,
        available=_writable,
    ),
)
_BY_NAME = {a.name: a for a in ACTIONS}


def find_action(runtime: ServingRuntime, name: str) -> Action:
    """The action ``name``, or the refusal a client can act on: a write verb on a server
    that takes none says how to turn writes on; an unknown name says "Unknown action"."""
    action = _BY_NAME.get(name)
    if action is None or (not action.available(runtime) and not action.writes):
        raise Unimplemented(
            f"Unknown action: {name[:100]}; this server's actions: {[a.name for a in available_actions(runtime)]}"
        )
    if action.writes:
        runtime.refuse_if_read_only(name)
    if not action.available(runtime):
        upload_verbs.require_writable(runtime)  # raises ReadOnly naming the flag
    return action


def available_actions(runtime: ServingRuntime) -> list[Action]:
    """The actions this server serves (what ``list_actions`` lists)."""
    return [a for a in ACTIONS if a.available(runtime) and not (a.writes and runtime.settings.read_only)]


def actions_table() -> str:
    """The Markdown table of every action (``docs/service.md`` holds it; a test compares)."""
    rows = ["| action | what it does | writes | streams | who may call it |", "|---|---|---|---|---|"]
    for a in ACTIONS:
        who = (
            "anyone"
            if a.open
            else "the control surface, or a share link of the tensor with read+annotate"
            if a.per_tensor and a.writes
            else "the tensor's reader (server token, its grant or a share link)"
            if a.per_tensor
            else "the control surface (server token); a sign-in under folder rules: write on the whole catalog"
            if a.admin
            else "the control surface (server token)"
        )
        rows.append(
            f"| `{a.name}` | {a.description} | {'yes' if a.writes else ''} | {'yes' if a.streams else ''} | {who} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(actions_table())
