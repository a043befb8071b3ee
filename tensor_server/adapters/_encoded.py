"""Encoded arrays (the Luxar encoding spec): validate an ``encoding`` block, decode codes.

Scene compilers such as Luxar store per-element values quantized to uint8/uint16 with
bounds, as LUT indices, broadcast from one row, or as a reference to another array, and
describe that in an ``encoding`` block of the array's attributes. This module owns the two
things a reader needs, with no storage knowledge: :func:`parse_encoding` checks a block
against the stored dtype and shape (every rule the spec states, plus consistency checks the
reference decoders skip) and returns an :class:`ArrayEncoding`, whose
:meth:`ArrayEncoding.decode` turns any *part* of the stored codes into decoded values. The
decoders are elementwise (per-channel ones per last-axis column), so a range read decodes
only the codes under its bounds.

The arithmetic lives in the numba kernels of :mod:`tensor_server_kernels.decode`: each
element in float64 with the reference decoder's (luxar ``ArrayDecoder``) operations in its
order, rounded once into the declared ``original_dtype`` (clamped and rounded when
integral). Linear families are bit-identical to the reference; exp/expm1 families within
1 float32 ULP (libm vs NumPy's exp), see tests/adapters/encoded_zarr_test.py. ``L`` (the
top code) comes from the stored dtype (255 for uint8, 65535 for uint16), never from the
encoding name; a ``bits`` field that disagrees with the stored dtype is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ArrayEncoding", "InvalidEncoding", "KNOWN_ENCODINGS", "parse_encoding", "xxh64_of"]

_DIRECT = ("none", "float16", "float32", "uint8", "uint16", "uint32", "uint64")
_LUT = ("lut_uint8", "lut_uint16")
_BOUNDED = ("bounded_scalar_uint8", "bounded_scalar_uint16")
_RGB = ("rgb_uint8", "rgb_uint16")
_LOG_SCALAR = ("log_scalar_uint8", "log_scalar_uint16")
_GEOLOG_SCALAR = ("geolog_scalar_uint8", "geolog_scalar_uint16")
_PERCHANNEL = {
    f"{kind}_perchannel_u{bits}": kind for kind in ("linear", "log", "signed_log", "geolog") for bits in (8, 16)
}
#: Provenance fields a writer may add to any quantized block; never needed to decode.
_PROVENANCE = ("certificate",)

#: name -> (required fields, optional fields) besides ``name``.
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    **{n: ((), ("original_dtype", *_PROVENANCE)) for n in _DIRECT},
    "broadcasted": (("n_elements",), ("value", "original_dtype")),
    "array_ref": (("target",), ("hash", "original_shape", "original_dtype")),
    **{n: (("lut", "original_dtype"), ("lut_mode", "original_shape")) for n in _LUT},
    **{n: (("min", "max", "bits", "original_dtype"), ()) for n in _BOUNDED},
    **{n: (("original_dtype",), ()) for n in _RGB},
    **{n: (("max_log", "bits", "original_dtype"), ()) for n in _LOG_SCALAR},
    **{n: (("min_log", "max_log", "bits", "original_dtype"), ()) for n in _GEOLOG_SCALAR},
    **{
        n: (("col_lo", "col_hi", "bits", "original_dtype"), (("zero_level",) if kind != "linear" else ()) + _PROVENANCE)
        for n, kind in _PERCHANNEL.items()
    },
}
KNOWN_ENCODINGS = frozenset(_FIELDS)


class InvalidEncoding(ValueError):
    """An ``encoding`` block the spec refuses; ``field`` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"encoding.{field}: {reason}")


@dataclass(frozen=True)
class ArrayEncoding:
    """A validated encoding block of one stored array.

    ``family`` groups names that decode alike (``direct``, ``broadcasted``, ``array_ref``,
    ``lut``, ``bounded``, ``rgb``, ``log``, ``geolog``, ``linear_perchannel``,
    ``log_perchannel``, ``signed_log_perchannel``, ``geolog_perchannel``). ``dtype`` is the
    decoded dtype; ``shape`` the decoded shape (None for ``array_ref``: the target's).
    """

    name: str
    family: str
    stored_dtype: np.dtype
    dtype: np.dtype
    shape: tuple[int, ...] | None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def row_lut(self) -> bool:
        """Row-mode LUT: one stored index per row, the row's values come from the LUT."""
        return self.family == "lut" and self.params["row_mode"]

    def decode(self, codes: np.ndarray, columns: slice = slice(None)) -> np.ndarray:
        """Decoded values of ``codes``, a part of the stored array (any shape for the
        elementwise families; for per-channel ones its last axis is the stored columns
        ``columns``). Row LUTs return ``codes.shape + (row width,)``, sliced by
        ``columns``. Direct and broadcast values pass through cast to ``dtype``."""
        fam = self.family
        if fam in ("direct", "broadcasted"):
            return np.asarray(codes).astype(self.dtype, copy=False)
        from tensor_server_kernels import decode as kernels

        codes = np.ascontiguousarray(codes)
        if fam == "lut":
            return self._decode_lut(kernels, codes, columns)
        # float outputs are written directly (rounded once from float64); integral ones
        # go through a float64 buffer to be clamped and rounded
        direct = self.dtype.kind == "f"
        out = np.empty(codes.shape, dtype=self.dtype if direct else np.float64)
        p = self.params
        if fam.endswith("_perchannel"):
            rows = codes.reshape(-1, codes.shape[-1] if codes.ndim > 1 else 1)
            lo = np.ascontiguousarray(p["col_lo"][columns] if codes.ndim > 1 else p["col_lo"])
            hi = np.ascontiguousarray(p["col_hi"][columns] if codes.ndim > 1 else p["col_hi"])
            kernels.decode_perchannel(
                rows, lo, hi, out.reshape(rows.shape), _PERCHANNEL_KIND[fam], p["levels"], bool(p["zero_level"])
            )
        else:
            a, b = {
                "bounded": ("min", "max"),
                "log": (None, "max_log"),
                "geolog": ("min_log", "max_log"),
                "rgb": (None, None),
            }[fam]
            kernels.decode_scalar(
                codes.reshape(-1),
                out.reshape(-1),
                _SCALAR_KIND[fam],
                p["levels"],
                p[a] if a else 0.0,
                p[b] if b else 0.0,
            )
        return out if direct else self._restore(out)

    def _restore(self, values: np.ndarray) -> np.ndarray:
        """Integral decoded dtypes: clamp to the dtype's range and round to nearest, never
        truncate or wrap (the reference decoder's rule)."""
        info = np.iinfo(self.dtype)
        return np.rint(np.clip(values, info.min, info.max)).astype(self.dtype)

    def _decode_lut(self, kernels: Any, idx: np.ndarray, columns: slice) -> np.ndarray:
        lut = self.params["lut"]
        if self.row_lut:
            lut = np.ascontiguousarray(lut[:, columns])
        out = np.empty(idx.shape + lut.shape[1:], dtype=lut.dtype)
        bad = kernels.lut_gather(idx.reshape(-1), lut, out.reshape((-1,) + lut.shape[1:]))
        if bad >= 0:
            raise InvalidEncoding("lut", f"index {bad} is out of range for a LUT of {lut.shape[0]} entries")
        return out


#: kernel selectors (tensor_server_kernels.decode) per family
_SCALAR_KIND = {"bounded": 0, "rgb": 1, "log": 2, "geolog": 3}
_PERCHANNEL_KIND = {"linear_perchannel": 0, "log_perchannel": 1, "signed_log_perchannel": 2, "geolog_perchannel": 3}


# ---- parsing and validation ------------------------------------------------------------------
def parse_encoding(block: Any, stored_dtype: Any, stored_shape: Sequence[int]) -> ArrayEncoding:
    """Validate an ``encoding`` block against the stored array; raise InvalidEncoding naming
    the field otherwise. Rules: a known ``name``; exactly the spec's fields for it (a stray
    field is refused); finite, paired bounds; ``bits`` matching the stored dtype; per-column
    scales as long as the last axis; a stored dtype the encoding can hold."""
    if not isinstance(block, Mapping):
        raise InvalidEncoding("name", f"the encoding block must be an object, got {type(block).__name__}")
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidEncoding("name", "is required and must be a non-empty string")
    if name not in KNOWN_ENCODINGS:
        raise InvalidEncoding("name", f"unknown encoding {name!r}")
    required, optional = _FIELDS[name]
    for key in block:
        if key != "name" and key not in required and key not in optional:
            raise InvalidEncoding(str(key), f"is not a field of {name!r}")
    for key in required:
        if key not in block:
            raise InvalidEncoding(key, f"is required by {name!r}")
    stored = np.dtype(stored_dtype)
    shape = tuple(int(n) for n in stored_shape)
    out_dtype = _dtype_field(block, "original_dtype") if "original_dtype" in block else None

    if name in _DIRECT:
        if name != "none" and stored != np.dtype(name):
            raise InvalidEncoding("name", f"{name!r} names the stored dtype, but it is {stored}")
        return ArrayEncoding(name, "direct", stored, _servable(stored), shape)
    if name == "broadcasted":
        return _parse_broadcast(block, stored, shape)
    if name == "array_ref":
        return _parse_array_ref(block, stored, shape, out_dtype)
    if name in _LUT:
        return _parse_lut(block, name, stored, shape, out_dtype)

    # quantized: codes are unsigned integers, L from the stored dtype
    if stored not in (np.dtype(np.uint8), np.dtype(np.uint16)):
        raise InvalidEncoding("name", f"{name!r} needs uint8 or uint16 codes, the stored dtype is {stored}")
    levels = int(np.iinfo(stored).max)
    params: dict[str, Any] = {"levels": levels}
    if "bits" in block:
        bits = block["bits"]
        if isinstance(bits, bool) or not isinstance(bits, int) or bits != stored.itemsize * 8:
            raise InvalidEncoding("bits", f"{bits!r} does not match the stored {stored} codes")
    if name in _RGB:
        return ArrayEncoding(name, "rgb", stored, out_dtype, shape, params)
    if name in _BOUNDED:
        lo, hi = _finite(block, "min"), _finite(block, "max")
        if hi < lo:
            raise InvalidEncoding("max", f"{hi!r} is below min {lo!r}")
        return ArrayEncoding(name, "bounded", stored, out_dtype, shape, {**params, "min": lo, "max": hi})
    if name in _LOG_SCALAR:
        max_log = _finite(block, "max_log")
        if max_log <= 0.0:
            raise InvalidEncoding("max_log", f"must be positive, got {max_log!r}")
        return ArrayEncoding(name, "log", stored, out_dtype, shape, {**params, "max_log": max_log})
    if name in _GEOLOG_SCALAR:
        lo, hi = _finite(block, "min_log"), _finite(block, "max_log")
        if hi < lo:
            raise InvalidEncoding("max_log", f"{hi!r} is below min_log {lo!r}")
        return ArrayEncoding(name, "geolog", stored, out_dtype, shape, {**params, "min_log": lo, "max_log": hi})
    return _parse_perchannel(block, name, stored, shape, out_dtype, params)


def _parse_broadcast(block: Mapping[str, Any], stored: np.dtype, shape: tuple[int, ...]) -> ArrayEncoding:
    n = block["n_elements"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidEncoding("n_elements", f"must be a positive integer, got {n!r}")
    if len(shape) not in (1, 2) or shape[0] != 1:
        raise InvalidEncoding("n_elements", f"a broadcast array stores one row, shape (1,) or (1, k); got {shape}")
    if "original_dtype" in block:
        _dtype_field(block, "original_dtype")
    value = block.get("value")
    if value is not None:
        if (
            not isinstance(value, list)
            or len(value) != math.prod(shape[1:])
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        ):
            raise InvalidEncoding("value", f"must list the {math.prod(shape[1:])} finite value(s) of the stored row")
    return ArrayEncoding("broadcasted", "broadcasted", stored, _servable(stored), (n, *shape[1:]), {"value": value})


def _parse_array_ref(
    block: Mapping[str, Any], stored: np.dtype, shape: tuple[int, ...], out_dtype: np.dtype | None
) -> ArrayEncoding:
    target = block["target"]
    if not isinstance(target, str) or not target.strip("/"):
        raise InvalidEncoding("target", f"must be a non-empty path, got {target!r}")
    if any(part in ("..", ".") for part in target.split("/")):
        raise InvalidEncoding("target", f"{target!r} must be a path from the store root")
    digest = block.get("hash")
    if digest is not None:
        if (
            not isinstance(digest, str)
            or not digest.startswith("xxh64:")
            or len(digest) != 22
            or not all(c in "0123456789abcdef" for c in digest[6:])
        ):
            raise InvalidEncoding("hash", f"must be 'xxh64:' and 16 hex digits, got {digest!r}")
    oshape = block.get("original_shape")
    if oshape is not None and (
        not isinstance(oshape, list)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in oshape)
    ):
        raise InvalidEncoding("original_shape", f"must be a list of sizes, got {oshape!r}")
    if shape[:1] != (0,) or (oshape is not None and tuple(shape[1:]) != tuple(oshape[1:])):
        raise InvalidEncoding("original_shape", f"a reference stores an empty (0, ...) array matching it; got {shape}")
    return ArrayEncoding(
        "array_ref",
        "array_ref",
        stored,
        out_dtype or stored,
        None,
        {"target": target.strip("/"), "hash": digest, "original_shape": None if oshape is None else tuple(oshape)},
    )


def _parse_lut(
    block: Mapping[str, Any], name: str, stored: np.dtype, shape: tuple[int, ...], out_dtype: np.dtype
) -> ArrayEncoding:
    # like L for the quantized names, the index width is the stored dtype's, not the name's
    if stored not in (np.dtype(np.uint8), np.dtype(np.uint16)):
        raise InvalidEncoding("name", f"{name!r} needs uint8 or uint16 indices, the stored dtype is {stored}")
    mode = block.get("lut_mode", "scalar" if len(shape) == 1 else None)
    if mode not in ("scalar", "row"):
        raise InvalidEncoding("lut_mode", f"must be 'scalar' or 'row' (absent only for 1-D), got {mode!r}")
    raw = block["lut"]
    if not isinstance(raw, list) or not raw:
        raise InvalidEncoding("lut", "must be a non-empty list")
    try:
        values = np.asarray(raw, dtype=np.float64 if out_dtype.kind == "f" else None)
    except (ValueError, TypeError) as exc:
        raise InvalidEncoding("lut", f"is not a regular list of numbers: {exc}") from None
    if values.dtype.kind not in "biuf" or (values.dtype.kind == "f" and not np.isfinite(values).all()):
        raise InvalidEncoding("lut", "must hold finite numbers")
    if mode == "row" and (values.ndim != 2 or len(shape) != 1):
        raise InvalidEncoding(
            "lut_mode", f"row mode needs 1-D indices and a list of rows; got {shape} and a {values.ndim}-D LUT"
        )
    if mode == "scalar" and values.ndim != 1:
        raise InvalidEncoding("lut", f"scalar mode needs a flat list, got a {values.ndim}-D LUT")
    if values.shape[0] > int(np.iinfo(stored).max) + 1:
        raise InvalidEncoding("lut", f"{values.shape[0]} entries exceed what {stored} indices address")
    lut = values.astype(out_dtype)
    decoded_shape = (*shape, values.shape[1]) if mode == "row" else shape
    oshape = block.get("original_shape")
    if oshape is not None and (not isinstance(oshape, list) or tuple(oshape) != decoded_shape):
        raise InvalidEncoding("original_shape", f"{oshape!r} does not match the decoded shape {decoded_shape}")
    return ArrayEncoding(name, "lut", stored, out_dtype, decoded_shape, {"lut": lut, "row_mode": mode == "row"})


def _parse_perchannel(
    block: Mapping[str, Any],
    name: str,
    stored: np.dtype,
    shape: tuple[int, ...],
    out_dtype: np.dtype,
    params: dict[str, Any],
) -> ArrayEncoding:
    kind = _PERCHANNEL[name]
    columns = shape[-1] if len(shape) >= 2 else 1
    scales = {}
    for key in ("col_lo", "col_hi"):
        raw = block[key]
        if not isinstance(raw, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
            raise InvalidEncoding(key, "must be a list of numbers")
        if len(raw) != columns:
            raise InvalidEncoding(key, f"has {len(raw)} entries for {columns} column(s)")
        arr = np.asarray(raw, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise InvalidEncoding(key, "must be finite")
        scales[key] = arr
    if np.any(scales["col_hi"] < scales["col_lo"]):
        raise InvalidEncoding("col_hi", "is below col_lo for some column")
    zero_level = block.get("zero_level", kind == "geolog")
    if not isinstance(zero_level, bool) or (kind == "geolog" and not zero_level):
        raise InvalidEncoding(
            "zero_level", f"must be {'true' if kind == 'geolog' else 'a boolean'}, got {zero_level!r}"
        )
    return ArrayEncoding(
        name, f"{kind}_perchannel", stored, out_dtype, shape, {**params, **scales, "zero_level": zero_level}
    )


def _finite(block: Mapping[str, Any], key: str) -> float:
    v = block[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidEncoding(key, f"must be a finite number, got {v!r}")
    return float(v)


def _dtype_field(block: Mapping[str, Any], key: str) -> np.dtype:
    raw = block[key]
    try:
        dt = np.dtype(raw) if isinstance(raw, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biuf":
        raise InvalidEncoding(key, f"must name a numeric dtype, got {raw!r}")
    return _servable(dt)


def _servable(dt: np.dtype) -> np.dtype:
    """float16 is served as float32 (exact widening: the read path reduces in >= 32 bit)."""
    return np.dtype(np.float32) if dt == np.float16 else dt


def xxh64_of(values: np.ndarray) -> str:
    """``xxh64:<hex>`` of an array's bytes, the spelling ``array_ref.hash`` uses."""
    import xxhash

    return "xxh64:" + xxhash.xxh64(np.ascontiguousarray(values).tobytes()).hexdigest()
