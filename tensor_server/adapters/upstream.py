"""Tensors of another biopb tensor server (an "upstream"), read with the biopb SDK.

A server in front of another lists the upstream's tensors under its own ids and serves them
through its own cache and read engine; this module is the reader half. ``RemoteTensorAdapter``
is a pure reader like any other: ``read_region`` is one planned read of the upstream (whole
upstream chunks, fetched in parallel by the SDK), and it declares ``reduces``: a scaled
extent is asked of the upstream, which computes it next to the data and sends the reduced
pixels only (the engine asks this after its own cache, before streaming full resolution).

The transfer grid is the upstream's, so one proxy chunk is one upstream chunk. The content
version is derived from the upstream's (and its address), so a changed upstream gives new
chunk ids here; a read that finds the upstream's version moved since the listing refuses
(stale) instead of caching new pixels under the old version. The SDK's own chunk cache is
off: this server's cache is the one that keeps pixels.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.montage import PLATE_FIELD
from tensor_server.core.positions import POSITIONS_FIELD
from tensor_server.errors import StaleChunkId, UnreadableSource

__all__ = ["Upstream", "RemoteTensorAdapter", "UpstreamSource", "TOKEN_ENV", "open_upstream_sources"]

#: the upstream's bearer token when the URL carries none (a token in a URL shows in ``ps``)
TOKEN_ENV = "TENSOR_SERVER_UPSTREAM_TOKEN"


class Upstream:
    """One upstream server: its public address, one shared SDK client (thread-safe), and the
    errors of talking to it turned into UnreadableSource naming the address. The bearer
    token: ``token``, else the URL's user part, else ``TOKEN_ENV``."""

    def __init__(self, url: str, token: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("grpc", "grpc+tcp", "grpcs", "grpc+tls") or not parts.hostname or not parts.port:
            raise UnreadableSource(url, "an upstream is grpc://host:port[/source_id]")
        self.location = f"{parts.scheme}://{parts.hostname}:{parts.port}"
        self.source_id = parts.path.strip("/") or None
        self._token = token or parts.username or os.environ.get(TOKEN_ENV) or None
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                from biopb.tensor import TensorFlightClient

                self._client = TensorFlightClient(self.location, cache_bytes=0, token=self._token)
            return self._client

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)`` with an upstream failure reported as UnreadableSource."""
        try:
            return fn(*args, **kwargs)
        except UnreadableSource:
            raise
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise UnreadableSource(self.location, f"upstream {what} failed: {type(exc).__name__}: {reason}") from None


#: keys of an upstream tensor's metadata its descriptor publishes beside the source's (a
#: montage's layout: ``TensorAdapter.published_metadata``), kept on the proxied tensor
PUBLISHED = ("montage",)
#: the fields whose describe asks for the metadata (what publishes ``PUBLISHED``): a plate's
#: or a file's positions image; every other tensor is described without it (a 1536-well
#: plate's 13,824 fields would each bring the source's 82 KB document)
MONTAGE_FIELDS = (PLATE_FIELD, POSITIONS_FIELD)


def _published(descriptor: Any) -> dict[str, Any]:
    """The ``PUBLISHED`` keys of the upstream descriptor's ``metadata_json`` (the reference
    wrapper, ``{"type", "dim_label", "metadata"}``); none where it sent no document."""
    try:
        metadata = json.loads(descriptor.metadata_json or "{}").get("metadata")
    except (ValueError, AttributeError):
        return {}
    return {k: metadata[k] for k in PUBLISHED if isinstance(metadata, dict) and k in metadata}


class RemoteTensorAdapter(TensorAdapter):
    """One upstream tensor (see the module docstring)."""

    reduces = True

    def __init__(self, upstream: Upstream, descriptor: Any) -> None:
        self.upstream = upstream
        self.upstream_id = descriptor.array_id
        self.upstream_version = bytes(descriptor.content_version)
        ndim = len(descriptor.shape)
        scale = list(descriptor.physical_scale) if len(descriptor.physical_scale) == ndim else None
        unit = [u or None for u in descriptor.physical_unit] if len(descriptor.physical_unit) == ndim else None
        version = hashlib.blake2b(
            upstream.location.encode() + b"\0" + descriptor.array_id.encode() + b"\0" + self.upstream_version,
            digest_size=16,
        ).digest()
        super().__init__(
            TensorInfo(
                list(descriptor.shape),
                np.dtype(descriptor.dtype),
                dim_labels=list(descriptor.dim_labels),
                native_chunk_shape=list(descriptor.chunk_shape),
                physical_scale=scale,
                physical_unit=unit,
                content_version=version,
                transfer_chunk_shape=list(descriptor.chunk_shape),
                # the descriptor has no label flag; a label tensor's computed levels say ``mode``
                is_labels=any(level.reduction_method == "mode" for level in descriptor.pyramid),
                metadata={
                    "upstream": upstream.location,
                    "upstream_array_id": descriptor.array_id,
                    **_published(descriptor),
                },
            )
        )

    @property
    def published_metadata(self) -> tuple[str, ...]:  # type: ignore[override]
        """What the upstream's descriptor published of its tensor (a plate's ``montage``):
        this server's descriptor publishes it too, so a client maps a click on a proxied
        plate to its well and field as on the upstream."""
        return tuple(k for k in PUBLISHED if k in self.metadata)

    def _fetch(self, bounds: Bounds, scale: Sequence[int] | None, method: str | None) -> np.ndarray:
        client = self.upstream.client
        pb = self.upstream.call(
            f"plan of {self.upstream_id}",
            client.get_tensor,
            self.upstream_id,
            bounds.to_slices(),
            scale,
            method,
            output="pb",
        )
        if bytes(client.descriptor_from_pb(pb).content_version) != self.upstream_version:
            raise StaleChunkId(
                f"{self.array_id}: the upstream {self.upstream.location} changed "
                f"{self.upstream_id} since it was listed; it is re-listed at the next scan"
            )
        lazy = client.tensor_from_pb(pb, cache_bytes=0)
        return np.asarray(self.upstream.call(f"read of {self.upstream_id}", lazy.compute))

    def read_region(self, bounds: Bounds) -> np.ndarray:
        return self._fetch(bounds, None, None)

    def get_reduced_data(self, bounds: Bounds, scale: Sequence[int], method: str) -> np.ndarray | None:
        """The upstream's reduction when its blocks are ours: a server reduces a region on
        the level's grid (blocks from the origin, whole blocks up to the region's end), the
        engine from the region's start with a ragged last block. They coincide when every
        axis starts on a block boundary and ends on one or at the tensor's edge, which every
        planned chunk does; other extents are declined and computed here."""
        for a, b, s, n in zip(bounds.start, bounds.stop, scale, self.shape):
            if a % s or (b % s and b != n):
                return None
        return self._fetch(bounds, list(scale), method)


class UpstreamSource(SourceAdapter):
    """One upstream source's tensors, under this server's id ``source_id``."""

    format_name = "upstream"

    def __init__(
        self,
        upstream: Upstream,
        source_id: str,
        upstream_source_id: str,
        tensors: dict[str, RemoteTensorAdapter],
        metadata_json: str | None,
    ) -> None:
        self.upstream = upstream
        self.upstream_source_id = upstream_source_id
        self._metadata_json = metadata_json
        super().__init__(
            None,
            tensors,
            source_id=source_id,
            metadata={"upstream": upstream.location, "upstream_source_id": upstream_source_id},
        )

    @property
    def url(self) -> str:
        return f"{self.upstream.location}/{self.upstream_source_id}"

    def metadata_json(self, field: str | None = None) -> str:
        """The upstream's own document when it sent one (it describes the data); for a field
        whose tensor publishes keys (a plate's layout), with those keys, as the upstream's
        descriptor of it had them."""
        tensor = None if field is None else self.tensors.get(field)
        if self._metadata_json is None or tensor is None or not tensor.published_metadata:
            return self._metadata_json or super().metadata_json(field)
        document = self._documents.get(field)
        if document is None:
            wrapper = json.loads(self._metadata_json)
            metadata = wrapper["metadata"] = dict(wrapper.get("metadata") or {})
            metadata.update({k: tensor.metadata[k] for k in tensor.published_metadata})
            document = self._documents[field] = json.dumps(wrapper, default=str)
        return document


def open_upstream_sources(upstream: Upstream, prefix: str) -> list[UpstreamSource]:
    """Every resolved source of ``upstream`` (or only ``upstream.source_id``), each tensor
    described once; ids are ``prefix + upstream source id``."""
    client = upstream.client
    sql = "SELECT source_id, tensors, metadata_json FROM sources WHERE is_resolved"
    if upstream.source_id is not None:
        sql += " AND source_id = '" + upstream.source_id.replace("'", "''") + "'"
    rows = upstream.call("catalog listing", client.query, sql).to_pylist()
    if upstream.source_id is not None and not rows:
        raise UnreadableSource(
            f"{upstream.location}/{upstream.source_id}", "the upstream serves no such readable source"
        )
    out = []
    for row in rows:
        tensors = {}
        for t in row["tensors"] or ():
            field = t["array_id"].partition("/")[2] or "data"
            desc = upstream.call(
                f"describe {t['array_id']}",
                client.get_descriptor,
                t["array_id"],
                with_metadata=field in MONTAGE_FIELDS,  # its layout (``PUBLISHED``); a field's: 82 KB of nothing new
            )
            tensors[field] = RemoteTensorAdapter(upstream, desc)
        if tensors:
            out.append(
                UpstreamSource(upstream, prefix + row["source_id"], row["source_id"], tensors, row.get("metadata_json"))
            )
    return out
