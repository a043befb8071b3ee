"""The read engine: the one place that turns a chunk id, or (bounds, scale, method), into pixels.

Invariant: for a tensor ``t``, validated ``bounds``, ``scale`` and canonical ``method``::

    engine.read(t, bounds, scale, method) == downsample_block(t.get_data(bounds), scale, method)

bit for bit, whichever path serves it, and ``engine.chunk(id)`` equals ``read`` of the id's
extent, scale and method (stored levels: the level's pixels). Everything that serves pixels —
the Flight server, the conformance suite, the benchmarks — goes through here.

Paths, in the order they are tried for a scaled read:

0. closed form, on an adapter that declares ``reports_uniform_blocks`` (``core/uniform.py``):
   an extent its metadata says holds one value ``v`` is ``v`` reduced in closed form, without
   reading; in a streamed reduction each unit is asked the same before it is fetched, so a
   mixed extent reads only its non-uniform units. Unscaled reads of a uniform region are
   ``np.full``; chunks come back as read-only broadcast arrays (one element of memory) that
   the store keeps as a value. ``special_chunks=False`` turns this path off (benchmarks);
1. cache-sourced units: every full-resolution chunk under the extent is in the store
   (``chunk_store.cache_sourced_units``); asked first because cached chunks need no decode,
   and a decimated read may decode (a zarr chunk is decoded whole to stride it);
2. ``nearest`` on an adapter that declares ``decimates``: ``get_decimated_data`` (a strided
   read, or a format's own reduced read such as CZI's zoom), which may decline with None;
3. a backend that declares ``reduces`` (another server in front of which this one sits):
   ``get_reduced_data`` computes the extent next to the data, so only reduced pixels travel;
   it may decline with None. Asked after the store, which needs no transfer at all;
4. streamed reduction: units floored at ``read_block_shape`` (for an adapter that
   ``reads_into``: its blocks stacked into 4 MiB units, ``_stacked_blocks``) and rounded to
   whole reduction blocks (``stream_reduce``), each read and reduced by the caller and a
   bounded pool (into a buffer the thread reuses when the adapter ``reads_into``).

Adapters are pure readers (``read_region`` and declared capabilities) and never see the
store. The store is reached only through the ``ChunkStore`` Protocol, keyed by chunk ids of
the served tensor (the tensor the client planned against, in its served axis order), so an
axis-permuting view can never collide with the tensor it wraps.

Validation happens once, at the entry points: ``read`` checks bounds, scale and method;
``chunk`` decodes the id and checks it names this tensor's current content, fits its shape
and is no larger than a plan mints (``core.request``). The inner paths trust their
arguments.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import numpy as np
from tensor_server_kernels.reference import output_shape

from tensor_server.core.arrays import owned_array
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import PRECOMPUTE, SERVING_EPOCH, UNSCALED, ChunkId
from tensor_server.core.chunk_store import ChunkStore, cache_sourced_units
from tensor_server.core.methods import CANONICAL_METHODS, normalize_method
from tensor_server.core.request import check_extent_within_chunk, check_scale
from tensor_server.core.stream_reduce import stream_reduce, streaming_unit
from tensor_server.core.uniform import covering_value, reduced_constant, uniform_array, uniform_value
from tensor_server.errors import InvalidArgument, InvalidBounds, InvalidChunkId, Overloaded, ReadCancelled, StaleChunkId

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter

__all__ = ["ReadEngine", "ReadCancelled", "Overloaded", "check_chunk_id", "default_engine", "READ_PATHS"]

#: what ``on_read`` names the path that served a computed read (the module docstring's
#: numbering; ``direct`` is a level-0 or stored-level read, no reduction)
READ_PATHS = ("closed_form", "cache_sourced", "decimated", "upstream", "streamed", "direct")

#: ``cancelled()`` is polled before each unit is fetched; True stops the read.
Cancelled = Callable[[], bool]


class ReadEngine:
    """Serve pixels of tensors (see the module docstring).

    ``store``: a ChunkStore (the chunk cache) or None. ``on_changed(tensor, reason)``: called
    when a chunk is refused because the tensor's files changed since it was opened. ``workers``: decode-ahead threads of
    a streamed reduction (None = the machine's cores). ``source_scaled_reads``: assemble
    scaled extents from cached full-resolution chunks when all are cached. ``max_computes``:
    chunk computations (cache misses) that run at once; more wait up to
    ``admission_timeout`` seconds, then get ``Overloaded`` (the server's UNAVAILABLE,
    retryable), so a cluster fanning out over a tensor cannot starve other clients. Cache
    hits are never queued. None = unbounded. ``special_chunks``: answer blocks an adapter's
    metadata says hold one value in closed form (path 0 of the module docstring).
    ``on_read(tensor, path, seconds, nbytes)``: told after each computed read which path
    served it (``READ_PATHS``), how long it took and the bytes it made, on the reading
    thread (the serving runtime's metrics and decode rates; a cache hit computes nothing
    and is not told).
    """

    def __init__(
        self,
        store: ChunkStore | None = None,
        *,
        workers: int | None = None,
        source_scaled_reads: bool = True,
        max_computes: int | None = None,
        admission_timeout: float = 30.0,
        special_chunks: bool = True,
        on_changed: Callable[[TensorAdapter, str], None] | None = None,
        on_read: Callable[[TensorAdapter, str, float, int], None] | None = None,
    ) -> None:
        self.store = store
        self.on_read = on_read
        self.special_chunks = special_chunks
        #: told when a tensor's bytes changed under it (the server's catalog reopens the source)
        self.on_changed = on_changed
        self.max_computes = max_computes
        self.admission_timeout = admission_timeout
        self._admission = threading.BoundedSemaphore(max_computes) if max_computes else None
        #: computations that found every slot taken (``waits``), ``waiting`` now, the seconds
        #: they waited and those refused (``Overloaded``): the metrics' admission queue. Kept
        #: on the slow path only: a free slot costs nothing more
        self.admission = {"waits": 0, "waiting": 0, "wait_seconds": 0.0, "refused": 0}
        self._admission_lock = threading.Lock()
        self.workers = workers
        self.source_scaled_reads = source_scaled_reads

    # ---- entry points --------------------------------------------------------------------------
    def read(
        self,
        tensor: TensorAdapter,
        bounds: Bounds | Sequence[slice] | None = None,
        scale: Sequence[int] | None = None,
        method: str | None = None,
        *,
        cancelled: Cancelled | None = None,
    ) -> np.ndarray:
        """Owned pixels of ``bounds`` (default: the whole tensor) reduced by ``scale`` with
        ``method``: shape ceil(extent / scale), the tensor's dtype. Scale 1 is ``get_data``."""
        t0 = time.perf_counter()
        bounds = tensor.check_bounds(bounds)
        scale_t = check_scale(scale, tensor.shape)
        if all(s == 1 for s in scale_t):
            v = self.uniform(tensor, bounds)
            if v is None:
                return self._level0(tensor, bounds)
            return self._noted("closed_form", tensor, t0, np.full(bounds.shape, v, dtype=tensor.dtype))
        canonical = normalize_method(method)
        if canonical not in CANONICAL_METHODS:
            raise InvalidArgument(f"method {method!r} cannot be computed; it names stored levels")
        return self._scaled(tensor, bounds, scale_t, canonical, cancelled)

    def chunk(
        self,
        chunk_id: bytes | ChunkId,
        tensor: TensorAdapter,
        *,
        cancelled: Cancelled | None = None,
    ) -> tuple[ChunkId, np.ndarray]:
        """(validated id, pixels) of a planned chunk: from the store when cached (a hit is
        the stored chunk, no decode), else computed and stored. The array may be read-only
        (a cache entry): copy it before writing. ``tensor`` is the served tensor the id
        names (the caller looks it up by ``ChunkId.decode(raw).array_id``)."""
        cid = self.checked(tensor, chunk_id)
        if self.store is None or not self.settled(tensor, cid):
            return cid, self._admitted(tensor, cid, cancelled)
        return cid, self.store.get_or_compute(cid.encode(), lambda: self._admitted(tensor, cid, cancelled))

    def checked(self, tensor: TensorAdapter, chunk_id: bytes | ChunkId) -> ChunkId:
        """The id, validated as one of ``tensor``'s (``check_chunk_id``) over bytes that did not
        change (``refuse_changed``): what every chunk read checks before it looks anywhere,
        the cache included."""
        cid = check_chunk_id(tensor, chunk_id)
        self.refuse_changed(tensor, cid)
        return cid

    @staticmethod
    def settled(tensor: TensorAdapter, cid: ChunkId) -> bool:
        """The chunk's pixels are final, so it may be cached: not one reaching the live edge
        of a growing tensor (``TensorAdapter.settled``), at level 0, a stored level or a
        computed one (whose id's extent is in level-0 pixels), so an overview never keeps a
        reduction of frames still being written."""
        level = tensor.native_level(cid.scale) if cid.method == PRECOMPUTE else None
        return (level.tensor if level is not None else tensor).settled(cid.bounds)

    def uniform(self, tensor: TensorAdapter, bounds: Bounds) -> np.generic | None:
        """The one value the tensor's metadata says every pixel of ``bounds`` holds, or None
        (also when special chunks are switched off). The one place the engine asks."""
        if not self.special_chunks:
            return None
        return uniform_value(tensor, bounds)

    def refuse_changed(self, tensor: TensorAdapter, cid: ChunkId) -> None:
        """Before serving a chunk, cached or not: when the bytes under it changed since the
        tensor was opened (``stale_reason``), tell ``on_changed`` and refuse the id as stale,
        so a read never mixes old and new chunks and a cached old chunk is never served."""
        level = tensor.native_level(cid.scale) if cid.method == PRECOMPUTE else None
        reason = (level.tensor if level is not None else tensor).stale_reason(cid.bounds)
        if reason is not None:
            if self.on_changed is not None:
                self.on_changed(tensor, reason)
            raise StaleChunkId(f"{tensor.array_id}: {reason}; re-plan")

    # ---- paths ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """One computation slot of the admission bound (see the class docstring), for any
        work that decodes pixels on a client's behalf (a chunk, a unit of tensor_stats), so
        all of it shares one bound."""
        if self._admission is None:
            yield
            return
        if not self._admission.acquire(blocking=False) and not self._waited_for_slot():
            raise Overloaded(
                f"{self.max_computes} chunk computations are running and more are waiting; "
                f"retry (waited {self.admission_timeout:g} s)"
            )
        try:
            yield
        finally:
            self._admission.release()

    def _admitted(self, tensor: TensorAdapter, cid: ChunkId, cancelled: Cancelled | None) -> np.ndarray:
        """``_compute`` within the admission bound."""
        with self.admitted():
            return self._compute(tensor, cid, cancelled)

    def _waited_for_slot(self) -> bool:
        """Wait up to ``admission_timeout`` for a computation slot, counted in ``admission``."""
        stats, t0 = self.admission, time.perf_counter()
        assert self._admission is not None  # asked only when computations are bounded
        with self._admission_lock:
            stats["waits"] += 1
            stats["waiting"] += 1
        got = self._admission.acquire(timeout=self.admission_timeout)
        with self._admission_lock:
            stats["waiting"] -= 1
            stats["wait_seconds"] += time.perf_counter() - t0
            stats["refused"] += not got
        return got

    def _compute(self, tensor: TensorAdapter, cid: ChunkId, cancelled: Cancelled | None) -> np.ndarray:
        """A validated chunk's pixels, computed (never looked up as a whole entry). A uniform
        extent is a read-only broadcast array, which the store keeps as a value."""
        t0 = time.perf_counter()
        stored = tensor.native_level(cid.scale) if cid.method == PRECOMPUTE else None
        assert stored is not None or cid.method != PRECOMPUTE  # validate() refused a scale not stored
        owner = tensor if stored is None else stored.tensor
        value_of = self.uniform_lookup(owner, cid.bounds)  # listed once, for the streamed units too
        v = value_of(cid.bounds) if value_of is not None else None
        if v is not None:
            if cid.method in (UNSCALED, PRECOMPUTE):
                return self._noted("closed_form", tensor, t0, uniform_array(v, cid.bounds.shape, tensor.dtype))
            return self._noted(
                "closed_form",
                tensor,
                t0,
                uniform_array(
                    reduced_constant(v, tensor.dtype, cid.scale, cid.method),
                    output_shape(cid.bounds.shape, cid.scale),
                    tensor.dtype,
                ),
            )
        if cid.method in (UNSCALED, PRECOMPUTE):
            return self._level0(owner, cid.bounds, asked=tensor)
        return self._scaled(tensor, cid.bounds, cid.scale, cid.method, cancelled, value_of=value_of)

    def _level0(self, tensor: TensorAdapter, bounds: Bounds, asked: TensorAdapter | None = None) -> np.ndarray:
        """Owned level-0 pixels of a region that is not uniform as a whole. A region with
        some uniform blocks is assembled block by block (uniform ones filled, the others
        read), so its cost follows the non-uniform blocks; any other is one ``get_data``.
        ``asked``: the tensor the client asked for, which ``on_read`` is told of (default
        ``tensor``): a stored level's tensor, read here, carries no array id of its own, so its
        decode rate and format are its tensor's."""
        t0 = time.perf_counter()
        asked = tensor if asked is None else asked
        ones = (1,) * tensor.ndim
        unit_value = self._closed_form(tensor, bounds, ones, "nearest")
        if unit_value is not None:
            unit = _storage_block_unit(tensor, ones, bounds.shape)
            if any(u < n for u, n in zip(unit, bounds.shape)):
                return self._noted(
                    "direct",
                    asked,
                    t0,
                    stream_reduce(bounds, unit, ones, "nearest", tensor.get_data, tensor.dtype, unit_value=unit_value),
                )
        return self._noted("direct", asked, t0, tensor.get_data(bounds))

    def _scaled(
        self,
        tensor: TensorAdapter,
        bounds: Bounds,
        scale: tuple[int, ...],
        method: str,
        cancelled: Cancelled | None,
        value_of: Callable[[Bounds], np.generic | None] | None | Literal[True] = True,
    ) -> np.ndarray:
        """``value_of``: the extent's ``uniform_lookup`` when the caller already made it
        (None: it found nothing); True: make it here."""
        from tensor_server.core.downsample import downsample_block

        t0 = time.perf_counter()
        if all(s == 1 for s in scale):
            return self._noted("direct", tensor, t0, tensor.get_data(bounds))
        if value_of is True:
            value_of = self.uniform_lookup(tensor, bounds)
        unit_value = _reduced_lookup(value_of, tensor.dtype, scale, method)
        if unit_value is not None:
            v = unit_value(bounds)
            if v is not None:
                return self._noted(
                    "closed_form", tensor, t0, np.full(output_shape(bounds.shape, scale), v, dtype=tensor.dtype)
                )
        fetch: Callable[[Bounds], np.ndarray] = tensor.get_data
        fetch_into = tensor.read_region_into if tensor.reads_into else None
        workers = self.workers
        offer = unit = None
        if self.store is not None and self.source_scaled_reads:
            unit = _stream_unit(tensor, scale, unit_value is not None)
            offer = cache_sourced_units(self.store, tensor, bounds, unit, scale, method)
            if offer is not None:
                fetch, unit, fetch_into = offer.fetch, offer.unit, None
                if offer.serial:
                    workers = 1
        if offer is None and method == "nearest" and tensor.decimates:
            dec = tensor.get_decimated_data(bounds, scale)
            if dec is not None:
                return self._noted(
                    "decimated", tensor, t0, _checked_answer(tensor, "get_decimated_data", dec, bounds, scale)
                )
        if unit is None:
            unit = _stream_unit(tensor, scale, unit_value is not None)
        if offer is None and tensor.reduces:
            reduced = tensor.get_reduced_data(bounds, scale, method)
            if reduced is not None:
                return self._noted(
                    "upstream", tensor, t0, _checked_answer(tensor, "get_reduced_data", reduced, bounds, scale)
                )
        if cancelled is not None:
            fetch = _stop_when(cancelled, fetch)
            fetch_into = None if fetch_into is None else _stop_when(cancelled, fetch_into)
        path = "streamed" if offer is None else "cache_sourced"
        if all(u >= n for u, n in zip(unit, bounds.shape)):
            return self._noted(
                path, tensor, t0, owned_array(downsample_block(fetch(bounds), scale, method), tensor.dtype)
            )
        return self._noted(
            path,
            tensor,
            t0,
            stream_reduce(
                bounds,
                unit,
                scale,
                method,
                fetch,
                tensor.dtype,
                workers=workers,
                unit_value=unit_value,
                fetch_into=fetch_into,
            ),
        )

    def _noted(self, path: str, tensor: TensorAdapter, t0: float, arr: np.ndarray) -> np.ndarray:
        """``arr``, after telling ``on_read`` that ``path`` served it since ``t0``."""
        if self.on_read is not None:
            self.on_read(tensor, path, time.perf_counter() - t0, arr.nbytes)
        return arr

    def _closed_form(
        self, tensor: TensorAdapter, bounds: Bounds, scale: tuple[int, ...], method: str
    ) -> Callable[[Bounds], np.generic | None] | None:
        """``unit -> reduced value`` for the uniform units of ``bounds``, or None when there
        are none to find (``uniform_lookup``)."""
        return _reduced_lookup(self.uniform_lookup(tensor, bounds), tensor.dtype, scale, method)

    def uniform_lookup(self, tensor: TensorAdapter, bounds: Bounds) -> Callable[[Bounds], np.generic | None] | None:
        """``unit -> value`` for units of ``bounds`` that hold one value, or None when there are
        none to find (special chunks off, nothing declared, or no uniform block in the extent:
        a dense extent pays one metadata look-up, not one per unit). The extent's blocks are
        listed once; a unit that is exactly one listed block (the usual case: units are storage
        blocks) is answered by a dict look-up, any other asks the adapter again. Why: asking
        per unit re-listed each unit's blocks through the adapter, which for a mostly uniform
        tensor of a few hundred blocks was a large share of a closed-form answer."""
        if not self.special_chunks or not tensor.reports_uniform_blocks:
            return None
        blocks = tensor.uniform_blocks(bounds)
        if not blocks:
            return None
        exact = {(box.start, box.stop): v for box, v in blocks}

        def value_of(ub: Bounds) -> np.generic | None:
            v = exact.get((ub.start, ub.stop))
            if v is None:
                v = covering_value(blocks, bounds) if ub == bounds else uniform_value(tensor, ub)
            return v

        return value_of


def _reduced_lookup(
    value_of: Callable[[Bounds], np.generic | None] | None, dtype: np.dtype, scale: tuple[int, ...], method: str
) -> Callable[[Bounds], np.generic | None] | None:
    """``unit -> reduced value`` from a ``uniform_lookup`` (None stays None): each unit's value
    reduced in closed form, memoised per value (an extent's uniform units mostly share one)."""
    if value_of is None:
        return None
    memo: dict[bytes, np.generic] = {}

    def unit_value(ub: Bounds) -> np.generic | None:
        v = value_of(ub)
        if v is None:
            return None
        key = np.asarray(v, dtype=dtype).tobytes()  # the value the closed form reduces
        r = memo.get(key)
        if r is None:
            r = memo[key] = reduced_constant(v, dtype, scale, method)
        return r

    return unit_value


#: Smallest storage block worth streaming by when an extent has uniform blocks: below it, the
#: per-unit overhead outweighs reading a few uniform blocks with their neighbours.
MIN_BLOCK_UNIT_BYTES = 64 << 10
#: What a reader that ``reads_into`` is streamed by: its storage blocks stacked along their
#: outermost split axis up to this many bytes (``_stacked_blocks``).
READ_INTO_UNIT_BYTES = 4 << 20
#: Where its blocks cannot be stacked, the smallest storage block it is streamed by (a unit of
#: one block is decoded straight into its buffer; below this the per-unit overhead outweighs
#: that, and the transfer-chunk unit is kept).
MIN_READ_INTO_UNIT_BYTES = 1 << 20


def _checked_answer(
    tensor: TensorAdapter, what: str, arr: np.ndarray, bounds: Bounds, scale: tuple[int, ...]
) -> np.ndarray:
    """A scaled answer the backend computed itself (``what``: a strided read, a reduction
    next to the data), owned, after checking its shape: a wrong shape is an adapter bug and
    must never reach a client as pixels."""
    expected = output_shape(bounds.shape, scale)
    if tuple(arr.shape) != expected:
        raise RuntimeError(f"{type(tensor).__name__}.{what} returned {arr.shape}, expected {expected}")
    return owned_array(arr, tensor.dtype)


def _stream_unit(tensor: TensorAdapter, scale: tuple[int, ...], has_uniform: bool) -> tuple[int, ...]:
    """The unit a streamed reduction of ``tensor`` at ``scale`` reads by (module docstring, 4)."""
    unit = streaming_unit(tensor.chunk_shape, tensor.read_block_shape, scale)
    if has_uniform:
        return _storage_block_unit(tensor, scale, unit)
    if tensor.reads_into:
        stacked = _stacked_blocks(tensor)
        if stacked is not None:
            rounded = streaming_unit(stacked, stacked, scale)
            if rounded == stacked:  # else a scale that cuts blocks: units would decode them twice
                return rounded
        return _storage_block_unit(tensor, scale, unit, MIN_READ_INTO_UNIT_BYTES)
    return unit


def _stacked_blocks(tensor: TensorAdapter) -> tuple[int, ...] | None:
    """Storage blocks stacked along the outermost axis the block splits, to about
    ``READ_INTO_UNIT_BYTES``; None where stacking cannot keep blocks contiguous (a block
    longer than 1 on an axis before that one). Why: C-order blocks stacked on that axis lie
    one after another in the unit, so each decodes straight into it (a transfer-chunk unit
    copies every block into place), and a unit's fixed cost (its kernel call, its turn on a
    thread) is paid once per stack. Measured on 2 cores: docs/performance-history.md's zarr tables."""
    block = tensor.read_block_shape
    if block is None:
        return None
    axis = next((a for a, (b, n) in enumerate(zip(block, tensor.shape)) if b < n), None)
    if axis is None or any(b != 1 for b in block[:axis]):
        return None
    count = max(1, READ_INTO_UNIT_BYTES // max(1, int(np.prod(block)) * tensor.dtype.itemsize))
    stacked = list(block)
    stacked[axis] = min(block[axis] * count, -(-tensor.shape[axis] // block[axis]) * block[axis])
    return tuple(stacked)


def _storage_block_unit(
    tensor: TensorAdapter, scale: tuple[int, ...], unit: tuple[int, ...], min_bytes: int = MIN_BLOCK_UNIT_BYTES
) -> tuple[int, ...]:
    """The storage block (rounded to whole reduction blocks) as the unit instead of the
    transfer chunk: for an extent that has uniform blocks, so that only the non-uniform blocks
    are read (cost in proportion to them); for a reader that ``reads_into``, so that each unit
    is one block decoded straight into its buffer. Kept when the block is smaller than
    ``min_bytes`` or the reader has none."""
    block = tensor.read_block_shape
    if block is None or int(np.prod(block)) * tensor.dtype.itemsize < min_bytes:
        return unit
    return streaming_unit(block, block, scale)


def check_chunk_id(tensor: TensorAdapter, chunk_id: bytes | ChunkId) -> ChunkId:
    """Decode and validate a chunk id of ``tensor``: foreign, stale, out-of-range and
    oversized ids raise instead of reading (a stale id is refused even if its bytes are
    still cached)."""
    cid = chunk_id if isinstance(chunk_id, ChunkId) else ChunkId.decode(chunk_id)
    if cid.array_id != tensor.array_id:
        raise InvalidChunkId(f"chunk id names {_short(cid.array_id)!r}, not {tensor.array_id!r}")
    if cid.content_version != tensor.content_version or cid.epoch != SERVING_EPOCH:
        raise StaleChunkId(f"{tensor.array_id}: the data changed since this chunk was planned; re-plan")
    if len(cid.scale) != tensor.ndim:
        raise InvalidChunkId(f"chunk id has {len(cid.scale)} axes, {tensor.array_id} has {tensor.ndim}")
    if cid.method == PRECOMPUTE:
        level = tensor.native_level(cid.scale)
        if level is None:
            raise InvalidChunkId(f"{tensor.array_id} stores no level at scale {cid.scale}")
        grid_owner, unit_scale = level.tensor, (1,) * tensor.ndim
    else:
        if cid.method != UNSCALED:
            try:
                check_scale(cid.scale, tensor.shape)
            except InvalidArgument as exc:
                raise InvalidChunkId(f"chunk id scale is out of range: {exc}") from None
        grid_owner, unit_scale = tensor, cid.scale
    try:
        cid.bounds.validate(grid_owner.shape)
    except InvalidBounds as exc:
        raise InvalidChunkId(f"chunk id extent does not fit {tensor.array_id}: {exc}") from None
    check_extent_within_chunk(cid.bounds.shape, unit_scale, grid_owner.chunk_shape, tensor.array_id)
    return cid


_Read = TypeVar("_Read", bound=Callable[..., Any])


def _stop_when(cancelled: Cancelled, fetch: _Read) -> _Read:
    """``fetch`` (a Fetch or a FetchInto) that first refuses once ``cancelled()``."""

    def checked(ub: Bounds, *into: np.ndarray) -> np.ndarray | None:
        if cancelled():
            raise ReadCancelled("the client cancelled the read")
        return fetch(ub, *into)

    return cast(_Read, checked)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_DEFAULT: ReadEngine | None = None


def default_engine() -> ReadEngine:
    """The engine without a store, for in-process reads (``TensorAdapter.get_scaled_data``)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ReadEngine()
    return _DEFAULT
