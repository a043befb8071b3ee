"""Zarr arrays with an ``encoding`` attribute block (Luxar scene stores) served decoded.

The zarr walker hands every array whose attributes carry ``encoding`` to :func:`open_encoded`.
The tensor it returns is a pure reader: ``read_region(bounds)`` reads only the stored codes
under ``bounds`` (for a row LUT, only the rows) and decodes those with
:mod:`tensor_server.adapters._encoded`; scaled reads, crops, the cache and the fast path come
from the shared read path. Its read block is the store chunk (of the codes; a row LUT's
chunk widened by the row), so streaming never decodes a chunk twice.

* ``broadcasted``: the stored row is read once at open and served through
  ``np.broadcast_to``; nothing of size ``n_elements`` exists until a caller asks for pixels.
* ``array_ref``: the target (a path from the store root) is opened recursively as its own
  encoded tensor and the reference reads through it. Targets are cached by ``hash`` per
  store, so N references to one array share one tensor and one verification. The hash is
  xxh64 over the bytes of the values the writer was given (Luxar hashes before encoding),
  so it is checked against the decoded target wherever decoding is exact (direct, LUT and
  broadcast targets, cast to ``original_dtype``); for a quantized target the writer's input
  no longer exists, and the reference is served with ``hash_checked: false`` in its
  metadata rather than refused.

A block the spec refuses raises :class:`EncodedArrayError` (an UnreadableSource naming the
store, the array and the field); the walker lists the array under the source's ``skipped``
with that reason and serves the rest of the store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._encoded import ArrayEncoding, InvalidEncoding, parse_encoding, xxh64_of
from tensor_server.adapters._luxar_delta import register_luxar_delta
from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

__all__ = ["EncodedZarrAdapter", "EncodedArrayError", "RefTargets", "open_encoded"]

_MAX_REF_DEPTH = 16


class EncodedArrayError(UnreadableSource):
    """An encoded array that cannot be served (its block, its target or its hash)."""

    def __init__(self, store: Path, array: str, field: str, reason: str) -> None:
        self.array = array
        self.field = field
        super().__init__(store, f"encoded zarr array {array!r}: encoding.{field}: {reason}")


class EncodedZarrAdapter(TensorAdapter):
    """One encoded zarr array (or a reference resolved to one), served as decoded values."""

    decimates = True

    def __init__(
        self,
        encoding: ArrayEncoding,
        codes: Any,
        *,
        store_path: Path,
        zarr_path: str,
        content_version: bytes,
        source: EncodedZarrAdapter | None = None,
        extra_metadata: dict[str, Any] | None = None,
    ) -> None:
        self.encoding = encoding
        self.store_path = store_path
        self.zarr_path = zarr_path
        self._codes = codes  # the zarr array of codes (None for a reference)
        self._source = source  # the resolved target of a reference
        self._row: np.ndarray | None = None
        if source is not None:
            shape, chunks = source.shape, source.native_chunk_shape
        elif encoding.family == "broadcasted":
            self._row = encoding.decode(self._read_codes((slice(None),) * len(codes.shape))[0])
            value = encoding.params["value"]
            if value is not None and not np.array_equal(np.asarray(value, self._row.dtype), self._row.reshape(-1)):
                raise EncodedArrayError(
                    store_path,
                    zarr_path,
                    "value",
                    f"{value} differs from the stored row {self._row.reshape(-1).tolist()}",
                )
            shape, chunks = encoding.shape, None  # crops for free: no chunk to decode
        else:
            shape = encoding.shape
            chunks = tuple(int(c) for c in codes.chunks)
            if encoding.row_lut:
                chunks = (*chunks, shape[-1])
        metadata = {
            "zarr_path": zarr_path,
            "encoding": encoding.name,
            "stored_dtype": encoding.stored_dtype.str,
            **(extra_metadata or {}),
        }
        super().__init__(
            TensorInfo(
                shape,
                source.dtype if source is not None else encoding.dtype,
                native_chunk_shape=chunks,
                content_version=content_version,
                metadata=metadata,
            )
        )

    def read_region(self, bounds: Bounds) -> np.ndarray:
        if self._source is not None:
            return self._source.read_region(bounds)
        return self._read(bounds.to_slices())

    def get_decimated_data(self, bounds: Bounds, step: Sequence[int]) -> np.ndarray:
        """Nearest as a strided read: the picked codes alone are decoded, and decoding,
        not the chunk read, is most of an encoded read's cost."""
        if self._source is not None:
            return self._source.get_decimated_data(bounds, step)
        return self._read(tuple(slice(a, b, int(s)) for a, b, s in zip(bounds.start, bounds.stop, step)))

    def _read(self, slices: tuple[slice, ...]) -> np.ndarray:
        """Decoded values under (possibly strided) ``slices``: only those codes are read."""
        if self._row is not None:
            row = self._row[slices[1:]] if len(slices) > 1 else self._row
            return np.broadcast_to(row, (len(range(*slices[0].indices(self.shape[0]))), *row.shape))
        if self.encoding.row_lut:
            return self._decode(self._read_codes(slices[:1]), slices[1])
        per_column = self.encoding.family.endswith("_perchannel") and len(slices) > 1
        return self._decode(self._read_codes(slices), slices[-1] if per_column else slice(None))

    def _read_codes(self, slices: tuple[slice, ...]) -> np.ndarray:
        try:
            return np.asarray(self._codes[slices])
        except Exception as exc:  # a corrupt chunk or an unknown codec surfaces here
            raise UnreadableSource(
                self.store_path, f"encoded zarr array {self.zarr_path!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def _decode(self, codes: np.ndarray, columns: slice) -> np.ndarray:
        try:
            return self.encoding.decode(codes, columns)
        except InvalidEncoding as exc:
            raise EncodedArrayError(self.store_path, self.zarr_path, exc.field, exc.reason) from None


class RefTargets:
    """Reference targets of one store, opened and verified once per (hash, target):
    ``"hash@target" -> (target tensor, hash_checked)``."""

    def __init__(self) -> None:
        self.by_key: dict[str, tuple[EncodedZarrAdapter, bool]] = {}


def open_encoded(
    node_rel: str,
    *,
    store_path: Path,
    open_codes: Callable[[str], tuple[Any, dict[str, Any], bytes]],
    targets: RefTargets,
    depth: int = 0,
) -> EncodedZarrAdapter:
    """The decoded tensor of the encoded array at ``node_rel``.

    ``open_codes(rel)`` opens one store array: (zarr array, its attributes, its content
    version); it raises UnreadableSource for a missing or unopenable array. ``targets``
    shares reference targets across one store's arrays (the walker keeps one per store).
    """
    register_luxar_delta()  # Luxar's code filter, before any of its arrays opens
    array, attributes, version = open_codes(node_rel)
    try:
        enc = parse_encoding(attributes.get("encoding"), array.dtype, array.shape)
    except InvalidEncoding as exc:
        raise EncodedArrayError(store_path, node_rel, exc.field, exc.reason) from None
    if enc.family != "array_ref":
        if any(n < 1 for n in (enc.shape or ())):
            raise EncodedArrayError(store_path, node_rel, "name", f"decoded shape {enc.shape} has no values")
        return EncodedZarrAdapter(enc, array, store_path=store_path, zarr_path=node_rel, content_version=version)

    target_rel = enc.params["target"]
    if depth >= _MAX_REF_DEPTH:
        raise EncodedArrayError(store_path, node_rel, "target", f"references nest deeper than {_MAX_REF_DEPTH}")
    key = f"{enc.params['hash']}@{target_rel}"
    if key not in targets.by_key:
        try:
            target = open_encoded(
                target_rel, store_path=store_path, open_codes=open_codes, targets=targets, depth=depth + 1
            )
        except EncodedArrayError as exc:
            raise EncodedArrayError(
                store_path, node_rel, "target", f"target {target_rel!r} cannot be served: {exc.reason}"
            ) from None
        except UnreadableSource as exc:
            raise EncodedArrayError(
                store_path, node_rel, "target", f"target {target_rel!r} cannot be opened: {exc.reason}"
            ) from None
        targets.by_key[key] = (target, _verify_hash(target, enc, store_path, node_rel))
    target, hash_checked = targets.by_key[key]
    oshape = enc.params["original_shape"]
    if oshape is not None and tuple(oshape) != target.shape:
        raise EncodedArrayError(
            store_path,
            node_rel,
            "original_shape",
            f"{list(oshape)} but target {target_rel!r} decodes to {list(target.shape)}",
        )
    combined = hashlib.blake2b(version + target.content_version, digest_size=16).digest()
    return EncodedZarrAdapter(
        enc,
        None,
        store_path=store_path,
        zarr_path=node_rel,
        content_version=combined,
        source=target,
        extra_metadata={"target": target_rel, "target_encoding": target.encoding.name, "hash_checked": hash_checked},
    )


def _verify_hash(target: EncodedZarrAdapter, enc: ArrayEncoding, store_path: Path, node_rel: str) -> bool:
    """Check ``hash`` against the decoded target when its decoding is exact (see module doc);
    True when checked and equal, False when the target is quantized (nothing to check)."""
    digest = enc.params["hash"]
    stored = target
    while stored._source is not None:  # a reference to a reference: the array holding codes
        stored = stored._source
    exact = stored.encoding.family in ("direct", "lut", "broadcasted")
    if digest is None or not exact:
        return False
    values = target.get_data().astype(enc.dtype, copy=False)
    got = xxh64_of(values)
    if got != digest:
        raise EncodedArrayError(
            store_path, node_rel, "hash", f"{digest} does not match target {enc.params['target']!r} ({got})"
        )
    return True
