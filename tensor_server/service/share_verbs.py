"""The share-link actions: ``share``, ``share_list``, ``share_revoke``, ``share_rotate``
(JSON bodies and answers). The links are ``service/shares.py``'s, who may make and read
them ``service/access.py``'s; these translate a request into those calls."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tensor_server.core.json_body import decode_json
from tensor_server.errors import InvalidArgument, PermissionDenied, TensorNotFound
from tensor_server.service.shares import DEFAULT_EXPIRES_SECONDS, SHARE_PATH_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["share", "share_list", "share_revoke", "share_rotate", "link_url"]


def _request(body: bytes, verb: str, usage: str) -> dict[str, Any]:
    request = decode_json(body, f"{verb} body") if body else {}
    if not isinstance(request, dict):
        raise InvalidArgument(usage)
    return request


def _json(value: object) -> Iterable[bytes]:
    return [json.dumps(value).encode()]


def link_url(runtime: ServingRuntime, capability: str, array_id: str) -> str:
    """The OME-Zarr URL of a link (napari, neuroglancer, zarr-python open it as is); only its
    path while no HTTP door listens."""
    path = f"{SHARE_PATH_PREFIX}{capability}/zarr/{quote(array_id.strip('/'), safe='/')}/"
    return f"{runtime.http_base or ''}{path}"


def share(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterable[bytes]:
    """A new link to one tensor: ``{"id", "capability", "url", "array_id", "scope", "expires_at"}``."""
    usage = 'share takes {"array_id": "...", "expires_seconds": 604800, "scope": "read" | "read+annotate"}'
    request = _request(body, "share", usage)
    array_id = request.get("array_id")
    if not isinstance(array_id, str) or not array_id:
        raise InvalidArgument(usage)
    try:
        tensor, _ = rt.catalog.find_tensor(array_id)
    except TensorNotFound:
        rt.refuse_unknown(caller)
        raise
    rt.access.may_share(caller, tensor)
    link, capability = rt.shares.mint(
        tensor.array_id,
        request.get("scope", "read"),
        request.get("expires_seconds", DEFAULT_EXPIRES_SECONDS),
        rt.access.creator(caller),
    )
    return _json(
        {
            "id": link.id,
            "capability": capability,
            "url": link_url(rt, capability, tensor.array_id),
            "array_id": link.array_id,
            "scope": link.scope,
            "expires_at": link.expires_at,
        }
    )


def share_list(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterable[bytes]:
    """The links the caller made (the server token: every link), with their state."""
    creator = None if rt.access.full(caller) else rt.access.creator(caller)
    return _json({"links": [link.public() for link in rt.shares.links(creator)]})


def share_revoke(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterable[bytes]:
    """Revoke one link (its maker's, or the server token's right): refused from the next request on."""
    usage = 'share_revoke takes {"id": "..."} (share_list lists the ids)'
    share_id = _request(body, "share_revoke", usage).get("id")
    if not isinstance(share_id, str) or not share_id:
        raise InvalidArgument(usage)
    link = rt.shares.get(share_id)
    if link is not None and not rt.access.full(caller) and link.creator != rt.access.creator(caller):
        raise PermissionDenied(f"permission denied: share link {share_id} is revoked by its maker or the server token")
    return _json(rt.shares.revoke(share_id).public())


def share_rotate(rt: ServingRuntime, caller: Caller, body: bytes, cancelled: Callable[[], bool]) -> Iterable[bytes]:
    """A new share secret: every link made before is refused from now on (the control surface)."""
    return _json({"forgotten": rt.shares.rotate()})
