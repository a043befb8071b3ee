"""The serving runtime: the one object every door calls, and the one place the rules live.

A door (Flight, HTTP, a later IIIF or export door) translates its transport into calls on a
``ServingRuntime`` and the runtime's answers and errors back; it decides nothing. Here, once:

* **who may ask** — ``authenticate(caller)``: the server token when one is set (``health``
  is the only verb open without it);
* **lookup** — ``tensor(array_id, caller)``: the id grammar (``core.identity.ArrayId``), the
  catalog, and the read gate: an uploaded tensor's pixels are served once it is READY, never
  while PENDING or DISCARDED, on every door;
* **every verb** — describe/plan, chunk (id decoded once, gate, engine, precache, admission),
  locate, stats, catalog SQL, the actions (``service/actions.py``), the upload and ROI
  writes (``service/upload_verbs.py``, ``service/catalog_verbs.py``);
* **errors** — the classes of ``tensor_server/errors.py``; each door maps a class to its status.

It owns the read engine, the precacher and the upload manager it builds; the catalog and the
chunk cache are handed in (the command line opens them, choosing files another server does
not hold) and closed by whoever opened them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tensor_server.adapters.zarr import decoder_name as zarr_decoder_name
from tensor_server.catalog.tree import SourcePlaces
from tensor_server.config import Settings
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import UNSCALED, ChunkId
from tensor_server.core.engine import Cancelled, ReadEngine
from tensor_server.core.identity import ArrayId
from tensor_server.core.level_grid import GridLevel, level_extent, read_level_region, region_cells
from tensor_server.errors import (
    InvalidArgument,
    InvalidChunkId,
    ReadOnly,
    TensorNotFound,
    TensorServerError,
)
from tensor_server.service import metrics
from tensor_server.service._describe import READ_MASK_PATHS, Described, described, keep_plan, kept_plan
from tensor_server.service._kept import KeptAnswers
from tensor_server.service.access import Access
from tensor_server.service.caller import Caller

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.catalog.catalog import Catalog
    from tensor_server.catalog.record import ServedTensor
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.uploads import Upload, UploadManager

__all__ = ["ServingRuntime", "Described", "READ_MASK_PATHS", "PROTOCOL"]

Resolved = TypeVar("Resolved")

log = logging.getLogger(__name__)

#: the biopb tensor protocol version this server speaks (health ``protocol``)
PROTOCOL = 3
#: distinct client addresses ``server_stats`` counts reads for; later ones share one row,
#: so a client cycling source ports cannot grow the server
MAX_PEERS_COUNTED = 256
#: bind addresses that listen on every interface: a client dials the name it used instead
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def _oidc_verifier(settings: Settings) -> Any:  # OidcVerifier | None
    """The sign-in tokens' verifier of ``[auth]``, when it names an issuer."""
    if not settings.oidc_issuer:
        return None
    from tensor_server.service.oidc import OidcVerifier, parse_rules

    return OidcVerifier(
        settings.oidc_issuer,
        settings.oidc_audience or "",
        jwks_file=settings.oidc_jwks_file,
        jwks_url=settings.oidc_jwks_url,
        leeway=settings.oidc_leeway,
        groups_claim=settings.oidc_groups_claim,
        rules=parse_rules(settings.oidc_rules),
    )


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """``[first, end)`` of each run of consecutive values among ``indices`` (sorted, once each)."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1]:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


class ServingRuntime:
    """Catalog + engine + cache + precache + uploads + the rules (module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        settings: Settings | None = None,
        *,
        cache: Any | None = None,
        uploads: UploadManager | None = None,
        tls: Any | None = None,
        access_tokens: Sequence[str] = (),
    ) -> None:
        """``tls``: the server's certificate (``service/tls.py`` ``ServerTls``), which every door
        serves and ``health`` describes; ``access_tokens``: credentials beside the server token
        that hold full access (the HTTP door's access token, printed in its URLs)."""
        self.settings = settings or Settings()
        s = self.settings
        self.catalog = catalog
        self.cache = cache
        self.policy = s.pyramid_policy()
        #: the one read path: every pixel any door sends comes from here
        self.engine = ReadEngine(
            cache,
            workers=s.read_workers or None,
            source_scaled_reads=s.source_scaled_reads,
            max_computes=s.admission_bound(),
            admission_timeout=s.admission_timeout,
            special_chunks=s.special_chunks,
            on_changed=catalog.reopen_changed,
        )
        #: instruments, request timing, decode rates (service/metrics.py); the engine tells it its paths
        self.metrics = metrics.Metrics(self, enabled=s.metrics_port is not None)
        self.engine.on_read = self.metrics.on_read
        #: the plans warm viewers repeat (``service/_kept.py``)
        self.kept = KeptAnswers()
        self.precacher = None
        if cache is not None and s.precache_bytes > 0:
            from tensor_server.cache.precache import Precacher

            self.precacher = Precacher(self.engine, policy=self.policy, budget_bytes=s.precache_bytes)
        self._owns_uploads = uploads is None and bool(s.write_dir)
        if uploads is None and s.write_dir:
            from tensor_server.uploads import UploadManager

            uploads = UploadManager(catalog, s.write_dir, upload_ttl=s.upload_ttl, scratch_ttl=s.scratch_ttl)
            uploads.start_sweeps()
        self.uploads = uploads
        from tensor_server.service.shares import ShareStore

        #: share links (``service/shares.py``): their secret and list, in the server home
        self.shares = ShareStore(s.shares_dir)
        self._places = SourcePlaces(catalog.roots)
        self.access = Access(
            s,
            uploads,
            access_tokens,
            shares=self.shares,
            label_ids=self._label_ids,
            oidc=_oidc_verifier(s),
            place_of=self._place_of,
        )
        self.tls = tls
        #: where the Flight door listens, (bind host, port), once it does (``flight_listening``)
        self.flight_bind: tuple[str, int] | None = None
        #: the HTTP door's base URL, once it listens (``http_listening``): share links name it
        self.http_base: str | None = None
        #: the wire write verbs are served (an in-process producer may use ``uploads`` anyway)
        self.writable = bool(s.writable and uploads is not None and not s.read_only)
        self.started_at = time.time()
        self._peers: OrderedDict[str, int] = OrderedDict()
        self._peers_lock = threading.Lock()
        from tensor_server.service.catalog_verbs import CatalogVerbs
        from tensor_server.service.viewer_verbs import ViewerVerbs

        self.catalog_verbs = CatalogVerbs(self)
        from tensor_server.service.watch import Watches

        #: the watch rule: growing tensors followed by their watchers, on every door
        self.watches = Watches(self)
        #: the viewer doors' verbs (IIIF, DeepZoom, the catalog page's images)
        self.viewer = ViewerVerbs(self)
        #: called when a write verb moved the catalog, before its answer is sent: the primary of
        #: ``serve --workers`` writes its workers' manifest then (``service/worker_catalog.py``),
        #: so what a client was told is READY or added answers on every process at once
        self.catalog_written: Callable[[], None] | None = None

    def close(self) -> None:
        """Stop what the runtime started (sweeps, precache, watches); the catalog and cache stay open."""
        self.watches.close()
        if self._owns_uploads and self.uploads is not None:
            self.uploads.close()
        if self.precacher is not None:
            self.precacher.close()

    def flight_listening(self, host: str, port: int) -> None:
        """The Flight door says where it listens (its port resolved when it asked for 0), so
        another door can tell a client the location to dial (``flight_location``)."""
        self.flight_bind = (host, port)

    def http_listening(self, scheme: str, host: str, port: int) -> None:
        """The HTTP door says where it listens, so a share link can be a URL to open: on every
        address, the machine's fully qualified name (a colleague's machine cannot dial
        127.0.0.1; the name is in the TLS certificate's names)."""
        if host in _WILDCARD_HOSTS:
            import socket

            host = socket.getfqdn()
        host = f"[{host.strip('[]')}]" if ":" in host else host
        self.http_base = f"{scheme}://{host}:{port}"

    def flight_location(self, client_host: str) -> str | None:
        """The location a client that reached this server by the name ``client_host`` passes
        to ``TensorFlightClient``: ``grpcs://`` when the server speaks TLS (the SDK's spelling),
        the port the Flight door listens on, and its bind host, or ``client_host`` when the door
        listens on every address. None while no Flight door listens."""
        if self.flight_bind is None:
            return None
        bind, port = self.flight_bind
        host = client_host if bind in _WILDCARD_HOSTS else bind
        host = f"[{host.strip('[]')}]" if ":" in host else host
        return f"{'grpcs' if self.tls is not None else 'grpc'}://{host}:{port}"

    # ---- who may ask (service/access.py) --------------------------------------------------------
    def authenticate(self, caller: Caller) -> None:
        """The control surface: the server token when one is configured."""
        self.access.control(caller)

    def refuse_stranger(self, caller: Caller) -> None:
        """Before a verb on one tensor (whose rule a grant may satisfy) parses its request: on
        a server with a token, a caller presenting no credential this server knows (neither
        full access nor any upload's grant) can read or write nothing, so it hears the control
        surface's refusal before a byte of its body is parsed. What it may do is still decided
        per tensor after the parse (``tensor()``, ``access.write``); this only moves a certain
        refusal ahead of the work."""
        if self.access.token is None or self.access.full(caller):
            return
        if caller.token is None or not self.access.recognizes(caller.token):
            self.access.control(caller)

    def refuse_if_read_only(self, verb: str) -> None:
        """Every verb that writes (uploads, added sources, annotations) on a read-only server."""
        if self.settings.read_only:
            raise ReadOnly(
                f"{verb}: this server was started with --read-only and changes nothing (uploads, "
                "added sources, annotations); start it without --read-only to allow writes"
            )

    # ---- lookup ---------------------------------------------------------------------------------
    @metrics.part("lookup")
    def tensor(self, array_id: str, caller: Caller, *, pixels: bool = True) -> tuple[TensorAdapter, str]:
        """(tensor, the id to echo) for ``array_id``, with every read rule applied: the
        caller may read it (the server token, or the tensor's grant), and ``pixels`` (reads,
        stats, chunk sends) refuses an upload that is not READY. A caller with no credential
        learns nothing of which ids exist: an unknown id is UNAUTHENTICATED to them."""
        try:
            tensor, echo = self.catalog.find_tensor(array_id)
        except TensorNotFound:
            self.refuse_unknown(caller)
            raise
        self.authorize(caller, tensor, pixels=pixels)
        return tensor, echo

    @metrics.part("lookup")
    def tensor_at(
        self,
        caller: Caller,
        resolve: Callable[[Callable[[str], TensorAdapter]], Resolved],
        chosen: Callable[[Resolved], TensorAdapter],
    ) -> Resolved:
        """What a door's path names, when only the door's grammar knows where the array id ends
        (the OME-Zarr view: ``http/paths.py``): ``resolve(find)`` picks it, trying candidate ids
        with ``find`` (a candidate that is not there is passed over, not refused), then the read
        rules of ``tensor()`` apply to the one ``chosen`` — and a path that names nothing is
        refused as an unknown id is, so strangers cannot probe ids through paths either."""
        try:
            found = resolve(self._current_tensor)
        except TensorNotFound:
            self.refuse_unknown(caller)
            raise
        self.authorize(caller, chosen(found))
        return found

    def _current_tensor(self, array_id: str) -> TensorAdapter:
        """The tensor ``array_id`` names, at its current extent (``refreshed``): a door that
        builds its own view of the shape (the OME-Zarr metadata) answers a growing tensor's."""
        tensor = self.catalog.find_tensor(array_id)[0]
        return self.catalog.find_tensor(array_id)[0] if self.refreshed(tensor) else tensor

    def authorize(self, caller: Caller, tensor: TensorAdapter, *, pixels: bool = True) -> None:
        """The read rules for a tensor a door found itself (``tensor()`` applies them too)."""
        self.access.read(caller, tensor)
        if pixels:
            self.check_readable(tensor)

    def refuse_unknown(self, caller: Caller) -> None:
        """Before a NOT_FOUND: a caller without the server token hears the control surface's
        refusal instead (a user bound by folder rules, what it hears of a tensor outside its
        folders), so ids cannot be probed by strangers (``Access.unknown``)."""
        self.access.unknown(caller)

    def _place_of(self, array_id: str) -> tuple[str, ...]:
        """Where the source of ``array_id`` sits in the catalog's folders (folder rules match it)."""
        source_id = ArrayId.parse(array_id).source_id
        rec = self.catalog.known_record(source_id)
        return (source_id,) if rec is None else self._places.of(source_id, rec.url)

    def image_labels(self, caller: Caller, tensor: TensorAdapter) -> dict[str, TensorAdapter]:
        """The label images of ``tensor`` (``core.ngff.labels_among`` over every tensor its
        source serves, uploaded label sets included) that ``caller`` may read: what the
        OME-Zarr view lists under ``labels/`` and an export writes. A label image the caller
        may not read is left out (a read of it would be refused), so a listing names none."""
        readable = {}
        for name, label in self._labels(tensor).items():
            try:
                self.authorize(caller, label)
            except TensorServerError:
                continue
            readable[name] = label
        return readable

    def _labels(self, tensor: TensorAdapter) -> dict[str, TensorAdapter]:
        """Every label image of ``tensor`` (``core.ngff.labels_among`` over what its source
        serves, uploaded label sets included), whoever asks."""
        from tensor_server.core.ngff import labels_among

        try:
            rec = self.catalog.get_record(ArrayId.parse(tensor.array_id).source_id)
        except TensorNotFound:
            return {}
        if rec.source is None:
            return {}
        served = {t.field: t.tensor for t in self.catalog.served(rec) if t.field is not None and t.tensor is not None}
        return dict(labels_among(served, tensor).labels)

    def _label_ids(self, array_id: str) -> frozenset[str]:
        """The ids of the label images of the tensor ``array_id`` (what its share link reads
        beside it: ``Access.read``)."""
        try:
            tensor, _ = self.catalog.find_tensor(array_id)
        except TensorNotFound:
            return frozenset()
        return frozenset(label.array_id for label in self._labels(tensor).values())

    def check_readable(self, tensor: TensorAdapter) -> None:
        """The read gate: an uploaded tensor reads once READY (``UploadNotReadable``)."""
        if self.uploads is None:
            return
        up = self.uploads.upload_of(tensor)
        if up is not None:
            self.uploads.check_readable(up)

    def fields(self, source_id: str, caller: Caller) -> dict[str, ServedTensor]:
        """The one answer to "which tensors does this source serve to this caller", by field:
        what the catalog lists for it (``Catalog.served``: its own tensors, then its READY
        uploads), less the tensors the read rule refuses this caller (a grant held by another).
        The catalog page and JSON, the OME-Zarr ``labels/`` listing and export take their
        tensors from here; SQL rows are the same list under the caller's row view (built for a
        class of callers at once, without opening restored rows: ``Access.row_view`` hides
        exactly what ``Access.read`` refuses a caller the control surface admitted). The source
        is opened (a restored row's adapter) to name its fields; an unreadable one serves none."""
        self.access.folder_read(caller, source_id)  # a source outside a ruled sign-in's folders: as unknown
        try:
            rec = self.catalog.get_record(source_id)
        except TensorNotFound:
            self.refuse_unknown(caller)
            raise
        if rec.source is None:  # opens a restored row, whose own tensors then carry their fields
            return {}
        full = self.access.full(caller)
        return {
            t.field: t
            for t in self.catalog.served(rec)
            if t.field is not None and t.tensor is not None and (full or self.access.may_read(caller, t.tensor))
        }

    def upload(self, array_id: str) -> Upload | None:
        return None if self.uploads is None else self.uploads.get(array_id)

    # ---- describe and plan ----------------------------------------------------------------------
    @metrics.verb("describe")
    def describe(
        self,
        caller: Caller,
        array_id: str,
        *,
        region: Bounds | None = None,
        scale: Sequence[int] | None = None,
        method: str = "",
        fields: Iterable[str] = (),
    ) -> Described:
        """A describe (no endpoints asked) or a read plan (``service/_describe.py``)."""
        return described(self, caller, array_id, region, scale, method, fields)

    def kept_plan(self, caller: Caller, request: bytes) -> Any | None:
        """A door's answer kept for the plan request ``request`` (its bytes), when the rules of
        ``describe`` let it stand for ``caller`` now; None: describe it (``_describe.py``)."""
        return kept_plan(self, caller, request)

    def keep_plan(self, request: bytes, plan: Described, answer: Any) -> None:
        """Keep ``answer``, a door's rendering of ``plan``, for the plan request ``request``."""
        keep_plan(self, request, plan, answer)

    def refreshed(self, tensor: TensorAdapter) -> bool:
        """A growing tensor's extent brought up to date (``TensorAdapter.refresh_extent``:
        growth in place); True when its files changed in another way and the source was
        reopened, so the caller looks the tensor up again."""
        reason = tensor.refresh_extent()
        if reason is None:
            return False
        self.catalog.reopen_changed(tensor, reason)
        return True

    # ---- chunks ---------------------------------------------------------------------------------
    def chunk_tensor(self, cid: ChunkId, caller: Caller) -> TensorAdapter:
        """The tensor a chunk id names: exactly a tensor id (a bare source id names the default
        tensor in requests, never in chunk ids), gate applied."""
        tensor, _ = self.tensor(cid.array_id, caller)
        if tensor.array_id != cid.array_id:
            raise InvalidChunkId(f"chunk id names {cid.array_id[:120]!r}, which is not a tensor id")
        return tensor

    @metrics.verb("chunk", cancelled_arg=2, remainder="cache")
    def chunk(
        self, chunk_id: bytes | ChunkId, caller: Caller, cancelled: Cancelled | None = None
    ) -> tuple[ChunkId, np.ndarray]:
        """(validated id, read-only pixels) of a planned chunk through the engine; work stops
        when ``cancelled()`` turns true (the client went)."""
        cid = chunk_id if isinstance(chunk_id, ChunkId) else ChunkId.decode(chunk_id)
        return self._read_chunk(self.chunk_tensor(cid, caller), cid, caller, cancelled)

    @metrics.verb("chunk", cancelled_arg=3, remainder="cache")
    def chunk_of(
        self, tensor: TensorAdapter, cid: ChunkId, caller: Caller, cancelled: Cancelled | None = None
    ) -> np.ndarray:
        """The pixels of chunk ``cid`` of ``tensor``, which comes from ``tensor()`` (that
        request's one read-rule check; ``read`` and ``level_region`` take a gated tensor
        alike): a door that resolved a tensor reads its chunks without a second look-up each.
        ``cid`` must be one of ``tensor``'s."""
        if cid.array_id != tensor.array_id:
            raise InvalidChunkId(f"chunk id names {cid.array_id[:120]!r}, not {tensor.array_id[:120]!r}")
        return self._read_chunk(tensor, cid, caller, cancelled)[1]

    def _read_chunk(
        self, tensor: TensorAdapter, cid: ChunkId, caller: Caller, cancelled: Cancelled | None
    ) -> tuple[ChunkId, np.ndarray]:
        self.count_peer(caller)
        if self.precacher is None:
            return self.engine.chunk(cid, tensor, cancelled=cancelled)
        with self.precacher.client_read():
            cid, data = self.engine.chunk(cid, tensor, cancelled=cancelled)
        self.precacher.after_read(tensor, cid)
        return cid, data

    def level_region(
        self,
        tensor: TensorAdapter,
        level: GridLevel,
        region: Bounds,
        caller: Caller,
        cancelled: Cancelled | None = None,
    ) -> np.ndarray:
        """Pixels of ``region`` of a served level (level coordinates), for a door that shows
        tiles (IIIF, DeepZoom). ``tensor`` comes from ``tensor()``, which gated it.

        Warm (every chunk under the region cached): assembled from the chunks, each a
        ``chunk`` read (a warm tile is cache hits and a crop). Cold, on a computed level, the
        region is computed from its own extent when that is cheaper than through its chunks
        (``_computed_apart``): a tile that is exactly its tile-grid chunk, whose pixels the
        precacher then stores when idle; or a tile whose chunks reach well beyond it (a file
        whose blocks are larger than a tile, a tile of a coarse level whose one chunk is the
        whole image), whose chunks the precacher computes at idle priority for the tiles
        that follow. The result is the same pixels either way (``level_extent``). Otherwise,
        and without a precacher (or a cache), the chunks are computed here.
        """
        cells = region_cells(tensor, level, region)
        cids = [cid for _, cid in cells]
        extent = level_extent(tensor, level, region)
        exact = extent is not None and len(cids) == 1 and cids[0].bounds == extent
        precacher = self.precacher
        if extent is None or precacher is None or not self._computed_apart(extent, cids, exact):
            return read_level_region(
                tensor, level, region, lambda cid: self.chunk_of(tensor, cid, caller, cancelled), cancelled, cells
            )
        for cid in cids:  # the bytes under it are the ones the tensor was opened on
            self.engine.refuse_changed(tensor, cid)
        with precacher.client_read(), self.engine.admitted():  # the precacher starts nothing meanwhile
            data = self.read(
                tensor, extent, level.scale, None if level.method == UNSCALED else level.method, caller, cancelled
            )
        if exact:  # the tile is its chunk: stored when idle, off this request's path
            precacher.keep(tensor, cids[0], data)
        else:
            precacher.warm(tensor, cids)
        return data

    def level_channels(
        self,
        tensor: TensorAdapter,
        level: GridLevel,
        region: Bounds,
        axis: int,
        indices: Sequence[int],
        caller: Caller,
        cancelled: Cancelled | None = None,
    ) -> np.ndarray:
        """``level_region`` of ``region`` at the positions ``indices`` of ``axis`` only, in
        that order, stacked along ``axis`` (whatever ``region`` spans there): a render spec's
        visible channels, in one call. Warm (every chunk cached, or nothing to compute apart),
        each channel's chunks are listed once and copied straight into the answer: 16 warm
        ``level_region`` calls of 77 µs and a stack were 1.4 ms of a 16-channel 256² tile
        (timeit, loaded 2-core machine, 2026-12-05). Otherwise each run of neighbouring channels
        is one ``level_region`` (a cold tile computed from its own extent, several channels at once)."""
        shape = list(region.shape)
        shape[axis] = len(indices)
        out = np.empty(shape, tensor.dtype)

        def at(k: int) -> tuple[slice, ...]:  # position k along axis
            return (slice(None),) * axis + (slice(k, k + 1),)

        regions = [region.with_axis(axis, i, i + 1) for i in indices]
        cells = [region_cells(tensor, level, r) for r in regions]
        keys = [cid.encode() for one in cells for _, cid in one]
        warm = level_extent(tensor, level, region) is None or self.precacher is None or self.cache is None
        if warm or self.cache is not None and self.cache.contains_all(keys):
            for k, (r, one) in enumerate(zip(regions, cells)):
                read_level_region(
                    tensor,
                    level,
                    r,
                    lambda cid: self.chunk_of(tensor, cid, caller, cancelled),
                    cancelled,
                    one,
                    out[at(k)],
                )
            return out
        for first, end in _runs(indices):
            run = self.level_region(tensor, level, region.with_axis(axis, first, end), caller, cancelled)
            for k, i in enumerate(indices):
                if first <= i < end:
                    out[at(k)] = run[at(i - first)]
        return out

    def _computed_apart(self, extent: Bounds, cids: list[ChunkId], exact: bool) -> bool:
        """Compute the region by itself, not through its chunks: some chunk is not cached, the
        precacher can store them, and either the region is exactly its one chunk (a tile-grid
        tile: its pixels are stored when idle, so the tile does not wait for the cache write,
        0.25-0.6 ms of a 1 ms cold tile) or the chunks cover at least twice the extent (the
        precacher computes them later; below that, computing the chunks costs about the same)."""
        if self.precacher is None or self.cache is None or self.cache.contains_all([c.encode() for c in cids]):
            return False
        return exact or 2 * int(np.prod(extent.shape)) <= sum(int(np.prod(c.bounds.shape)) for c in cids)

    @metrics.verb("read", cancelled_arg=5)
    def read(
        self,
        tensor: TensorAdapter,
        bounds: Bounds | None,
        scale: Sequence[int] | None,
        method: str | None,
        caller: Caller,
        cancelled: Cancelled | None = None,
    ) -> np.ndarray:
        """Pixels of a region at a scale (a door that serves regions rather than planned
        chunks: tiles, exports). ``tensor`` comes from ``tensor()``, which gated it."""
        self.count_peer(caller)
        return self.engine.read(tensor, bounds, scale, method, cancelled=cancelled)

    @metrics.verb("locate")
    def locate(self, chunk_id: bytes, caller: Caller) -> dict[str, Any]:
        """wire-protocol §7: the chunk's batch in a segment file the client can map, for
        loopback peers only (``service/_locate.py``)."""
        from tensor_server.service._locate import chunk_location

        return chunk_location(self, chunk_id, caller)

    def count_peer(self, caller: Caller) -> None:
        """One read by ``caller``, counted per client address (``server_stats``)."""
        with self._peers_lock:
            key = caller.peer or caller.door
            if key not in self._peers and len(self._peers) >= MAX_PEERS_COUNTED:
                key = "other"
            self._peers[key] = self._peers.get(key, 0) + 1

    # ---- catalog SQL ----------------------------------------------------------------------------
    @metrics.verb("query", cancelled_arg=2)
    def query(self, sql: str, caller: Caller, cancelled: Cancelled | None = None):  # pa.Table
        """The control surface; the tables hold only the rows of tensors the caller may read
        (``Access.row_view``: a granted upload's rows are its grant holder's)."""
        self.authenticate(caller)
        return self.catalog.query(sql, cancelled=cancelled, view=self.access.row_view(caller))

    # ---- uploads: one chunk -----------------------------------------------------------------------
    @metrics.verb("put_chunk")
    def put_chunk(
        self, chunk_ticket: bytes, pieces: Iterator[Any], caller: Caller, cancelled: Cancelled | None = None
    ) -> None:
        """Store one planned chunk of a PENDING upload (``chunk_ticket``: a write plan's
        TensorTicket). The ticket is checked before a byte is read; ``pieces`` (Arrow record
        batches with a ``data`` column) are then taken one at a time within the chunk's own
        size plus slack."""
        from biopb.tensor import ticket_pb2

        from tensor_server.service.bodies import decode_message
        from tensor_server.service.upload_verbs import require_writable

        manager = require_writable(self)
        ticket = decode_message(ticket_pb2.TensorTicket, chunk_ticket, "DoPut chunk_ticket")
        if ticket.WhichOneof("payload") != "chunk_id":
            raise InvalidArgument("DoPut: chunk_ticket carries no chunk id (use a ticket of the write plan)")
        cid = ChunkId.decode(ticket.chunk_id)
        up = manager.get(cid.array_id)
        if up is not None:  # before a refusal names its state or its grid
            self.access.write(caller, up)
        try:
            plan = manager.plan_chunk_write(cid)
        except TensorNotFound:
            self.refuse_unknown(caller)
            raise
        self.access.write(caller, plan.upload)  # the upload the plan found (the name may have been reused since)
        manager.write_chunk_stream(plan, pieces, cancelled=cancelled)
        self.metrics.uploaded(int(np.prod(plan.bounds.shape)) * plan.upload.tensor.dtype.itemsize)

    # ---- actions --------------------------------------------------------------------------------
    @metrics.verb("action", action_arg=0)
    def do_action(self, name: str, body: bytes, caller: Caller, cancelled: Cancelled | None = None) -> Iterator[bytes]:
        """Run the action ``name`` (``service/actions.py``): its results, in order. The caller
        is checked before the handler parses ``body``: the control surface's token, or, for
        a per-tensor read, a credential that could read some tensor (the handler then
        applies that tensor's rule)."""
        from tensor_server.service.actions import find_action

        action = find_action(self, name)
        if action.per_tensor:
            self.refuse_stranger(caller)
        elif action.admin:
            self.access.administer(caller)
        elif not action.open:
            self.authenticate(caller)
        generation = self.catalog.generation
        results = action.handler(self, caller, body, cancelled or (lambda: False))
        if not action.writes or self.catalog_written is None:
            return iter(results)
        return self._told_after_written(results, generation)

    def _told_after_written(self, results: Iterable[bytes], generation: int) -> Iterator[bytes]:
        """``results``, each sent only after ``catalog_written`` ran if the catalog moved since
        ``generation`` (a handler may do its work lazily, between its results)."""
        for result in results:
            if self.catalog.generation != generation and self.catalog_written is not None:
                self.catalog_written()
                generation = self.catalog.generation
            yield result

    def list_actions(self, caller: Caller) -> list[tuple[str, str]]:
        from tensor_server.service.actions import available_actions

        self.authenticate(caller)
        return [(a.name, a.description) for a in available_actions(self)]

    # ---- status ---------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """SERVING from the moment the doors listen, as the reference does: sources are served
        as discovery finds them (or as the last run's catalog restores them); ``discovery``
        says what the scan is doing and ``first_scan_done`` when it has been everywhere."""
        cat = self.catalog
        return {
            "protocol": PROTOCOL,
            "status": "SERVING",
            "source_count": len(cat),
            "uptime_seconds": int(time.time() - self.started_at),
            "metadata_db_enabled": True,
            "writable": self.writable,
            "first_scan_done": cat.first_scan_done.is_set(),
            "discovery": cat.discovery_progress(),
            "full_scan_in_progress": cat.scan_in_progress or not cat.first_scan_done.is_set(),
            "last_full_scan_finished_at": cat.last_scan_finished_at,
            "scan_error": cat.scan_error,
            "ticket_stubs": False,
            "registration_pending": 0,  # sources are opened during the scan, never left pending
            "annotations_persisted": cat.rois.path is not None,
            "catalog_generation": cat.generation,
            **(self.tls.health() if self.tls is not None else {"tls": False}),
        }

    def server_stats(self) -> dict[str, Any]:
        with self._peers_lock:
            peers = dict(self._peers)
        return {
            "calls": {door: dict(calls) for door, calls in self.metrics.calls().items()},
            "refusals": {door: dict(kinds) for door, kinds in self.metrics.refusals().items()},
            "chunk_reads_by_peer": peers,
            "server_timing": self.metrics.breakdown(),
            "zarr_decoder": zarr_decoder_name(),
        }

    def cache_stats(self) -> dict[str, Any] | None:
        if self.cache is None:
            return None
        body = self.cache.cache_stats()
        if self.precacher is not None:
            body["precache"] = dict(self.precacher.stats)
        return body
