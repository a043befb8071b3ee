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
import os
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
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
                metadata={"upstream": upstream.location, "upstream_array_id": descriptor.array_id},
            )
        )

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
        """The upstream's own document when it sent one (it describes the data)."""
        return self._metadata_json or super().metadata_json(field)


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
            desc = upstream.call(f"describe {t['array_id']}", client.get_descriptor, t["array_id"])
            field = t["array_id"].partition("/")[2] or "data"
            tensors[field] = RemoteTensorAdapter(upstream, desc)
        if tensors:
            out.append(
                UpstreamSource(upstream, prefix + row["source_id"], row["source_id"], tensors, row.get("metadata_json"))
            )
    return out
