"""Blosc frames decoded by the C library the ``blosc2`` package ships (libblosc2), through
ctypes, one decompression context per thread.

Why: numcodecs' ``Blosc.decode`` makes a fresh context (and its block buffers) on every call
and decodes with an older bundled library. On this project's 2-core VM (2026-12-03), decoding
512 blosc-zstd frames of 256² uint16 took 112-117 µs a frame on one thread and 64-82 µs with
two; libblosc2 through a per-thread context took 89-94 and 47-49 µs (1024² frames: 1.30 -> 1.12
ms on one thread). python-blosc2's own ``decompress`` holds the GIL (two threads were slower
than one); a ctypes call releases it.

Safety: the context is made from ``blosc2_dparams``, a struct passed by value, so its layout
is checked against the header the same wheel ships (``include/blosc2.h``): any other layout,
a missing library or header, and the caller keeps numcodecs (``decompressor()`` is None). A
frame libblosc2 refuses (a negative return: corrupt, or a codec it lacks) is the caller's to
decode another way; ``decompress_into`` returns False for it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["decompressor"]

#: the ``blosc2_dparams`` fields (type, name) this module's Structure mirrors, in order
_DPARAMS_FIELDS = [
    ("int16_t", "nthreads"),
    ("void*", "schunk"),
    ("blosc2_postfilter_fn", "postfilter"),
    ("blosc2_postfilter_params*", "postparams"),
    ("int32_t", "typesize"),
]


class _DParams(ctypes.Structure):
    _fields_ = [
        ("nthreads", ctypes.c_int16),
        ("schunk", ctypes.c_void_p),
        ("postfilter", ctypes.c_void_p),
        ("postparams", ctypes.c_void_p),
        ("typesize", ctypes.c_int32),
    ]


def _header_fields(header: str) -> list[tuple[str, str]] | None:
    """(type, name) of each field of ``blosc2_dparams`` in ``blosc2.h``'s text."""
    found = re.search(r"typedef struct \{([^{}]*)\}\s*blosc2_dparams;", header)
    if found is None:
        return None
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", found.group(1), flags=re.S)
    fields = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        parts = decl.replace("*", "* ").split()
        fields.append(("".join(parts[:-1]), parts[-1]))
    return fields


def _load() -> Any | None:
    spec = importlib.util.find_spec("blosc2")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        header = (root / "include" / "blosc2.h").read_text(errors="replace")
        if _header_fields(header) != _DPARAMS_FIELDS:
            return None
        lib = ctypes.CDLL(str(root / "lib" / "libblosc2.so"))
    except OSError:
        return None
    lib.blosc2_init.argtypes, lib.blosc2_init.restype = [], None
    lib.blosc2_create_dctx.argtypes, lib.blosc2_create_dctx.restype = [_DParams], ctypes.c_void_p
    lib.blosc2_free_ctx.argtypes, lib.blosc2_free_ctx.restype = [ctypes.c_void_p], None
    lib.blosc2_decompress_ctx.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_int32,
    ]
    lib.blosc2_decompress_ctx.restype = ctypes.c_int
    lib.blosc2_init()
    return lib


class _Context:
    """One thread's decompression context, freed with the thread's locals."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.ptr = lib.blosc2_create_dctx(_DParams(1, None, None, None, 8))  # one internal thread
        if not self.ptr:
            raise MemoryError("libblosc2 could not make a decompression context")

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.blosc2_free_ctx(self.ptr)


_lock = threading.Lock()
_state: dict[str, Any] = {}
#: each thread's one context, whatever it decodes: a context keeps its block buffers (up to a
#: chunk's blocks), so one per array and thread would grow with the arrays a server has read
_local = threading.local()


def _decompress_into(frame: Any, target: np.ndarray) -> bool:
    lib = _state["lib"]
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = _Context(lib)
    src = np.frombuffer(frame, np.uint8)
    return (
        lib.blosc2_decompress_ctx(ctx.ptr, src.ctypes.data, src.size, target.ctypes.data, target.nbytes)
        == target.nbytes
    )


def decompressor() -> Callable[[Any, np.ndarray], bool] | None:
    """``decompress_into(frame, target) -> bool`` (the frame's bytes decoded into the
    C-contiguous ``target``, which they fill exactly; False when libblosc2 refuses the frame),
    or None when libblosc2 cannot be used here."""
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
    return None if _state["lib"] is None else _decompress_into
