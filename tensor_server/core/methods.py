"""Reduction-method vocabulary of the read path.

The wire passes any string through (wire-protocol §6.2). We accept the reference server's
names and aliases plus this project's extensions, and map each to one of the six canonical
kernel methods, so a chunk id always carries the *effective* method and a client cache can
never confuse two spellings of the same reduction, or two different reductions.
"""

from __future__ import annotations

from tensor_server_kernels.reference import METHODS

from tensor_server.errors import InvalidArgument

__all__ = [
    "CANONICAL_METHODS",
    "PRECOMPUTE",
    "normalize_method",
    "effective_method",
    "default_method",
]

#: The six reductions the kernels implement. The list is the kernels' own (their oracle
#: validates against it and they cannot import the server); every server module reads it here.
CANONICAL_METHODS: tuple[str, ...] = METHODS

#: Serve a level the file stores (a native pyramid level), not a computed one.
PRECOMPUTE = "precompute"

_ALIASES = {
    "nearest": "nearest",
    "stride": "nearest",
    "decimate": "nearest",
    "area": "area",
    "mean": "area",
    "linear": "area",  # deprecated spelling on the wire; it always meant block mean
    "min": "min",
    "max": "max",
    "mode": "mode",
    "median": "median",
    "precompute": PRECOMPUTE,
    "precomputed": PRECOMPUTE,
}

# Methods that invent values absent from the block. A label image's values are identities,
# not intensities: the mean of labels 3 and 5 is label 4, a different object. Such requests
# on a label tensor are served ``mode`` instead: mode returns the block's majority label,
# which is what a smooth intensity reduction means for labels, and unlike ``nearest`` it does
# not make thin objects flicker in and out between zoom levels. (median's lower median is a
# present value, but the middle of sorted ids is no better a choice than any other id.)
_LABEL_UNSAFE = {"area": "mode", "median": "mode"}


def normalize_method(name: str | None, *, scaled: bool = True) -> str:
    """Canonical name for a wire method string (trimmed, case-folded, aliases resolved).

    An empty or missing method on a scaled read means ``area``, as on the reference server.
    Unknown names raise InvalidArgument (the server maps it to INVALID_ARGUMENT).
    """
    key = (name or "").strip().lower()
    if not key:
        return "area" if scaled else "nearest"
    try:
        return _ALIASES[key]
    except KeyError:
        known = ", ".join(sorted(_ALIASES))
        raise InvalidArgument(f"unknown reduction method {name!r}; known: {known}") from None


def default_method(is_labels: bool) -> str:
    """The method a tensor's computed pyramid levels are advertised with."""
    return "mode" if is_labels else "area"


def effective_method(name: str | None, *, is_labels: bool) -> str:
    """The canonical method actually served to a tensor, label rules applied."""
    if is_labels and not (name or "").strip():
        return "mode"
    method = normalize_method(name)
    if is_labels:
        method = _LABEL_UNSAFE.get(method, method)
    return method
