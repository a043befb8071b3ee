"""What an export is asked to do: parsed, validated ``ExportOptions``.

The same options come from the CLI's flags and from a service action's JSON body
(``ExportOptions.from_mapping``), so both doors refuse the same input with the same words.
Every refusal is an ``InvalidArgument`` naming the option and what it accepts.

The limits an export's geometry must keep (checked where the geometry is known, in
export/layout.py, against the tensor; docs/export.md states them):

* ``MIN_CHUNK_EDGE``: asked chunks (and so shards, whole chunks) are at least 64 pixels in Y
  and in X, or the whole axis when it is shorter. Every inner chunk is one codec call and one
  index entry, every v2 chunk one file: 1×1 chunks made a file per pixel (4.2 M for a 2048²
  plane) and a unit's encode loop run for hours. 64 is the smallest edge NGFF writers use in
  practice (ngff-zarr's volumes ``-c 64``, neuroglancer's 64³; their defaults are 128-256 for
  volumes and 256-1024 for planes, bioformats2raw's tiles 1024²); z, c and t chunks may be 1.
* ``MAX_UNIT_BYTES``: a read unit (one shard at every level: what is held in memory at once,
  export/layout.py) holds at most 64 MiB with its levels. An 8192² uint16 shard made units of
  168 MiB (+173 MB resident; up to three units are in flight); default shards shrink to fit, asked
  shards or a pyramid so deep that its coarsest block is larger are refused. (A unit is never
  less than one of the reader's blocks, e.g. a TIFF page decoded whole: that is the source's
  own floor, not the options'.)
* ``MAX_FILES``: an export writes at most 100,000 chunk or shard files, counted from the
  layout before anything is written (levels and label images summed): directories of more
  entries are slow to list, copy and back up, and object stores charge per file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tensor_server.errors import InvalidArgument

__all__ = ["ExportOptions", "CODECS", "NGFF_VERSIONS", "MODES", "ZarrFormat", "parse_shape"]

#: codec name -> what it writes (v3 codec / v2 compressor; see export/store.py)
CODECS = ("zstd", "blosc-zstd", "none")
#: the zarr formats an export writes
ZarrFormat = Literal[2, 3]
#: NGFF version -> zarr format
NGFF_VERSIONS: dict[str, ZarrFormat] = {"0.5": 3, "0.4": 2}
#: what to do with an existing destination or an interrupted export
MODES = ("create", "overwrite", "resume")
#: deepest pyramid an export writes (the pyramid policy's own cap)
MAX_LEVELS = 16
#: bounds on the worker counts a caller may ask for (threads, not processes)
MAX_WORKERS = 64
#: the least chunk edge asked in Y and X (the whole axis when shorter; module docstring)
MIN_CHUNK_EDGE = 64
#: the most a read unit may hold, its levels included (module docstring)
MAX_UNIT_BYTES = 64 << 20
#: the most chunk or shard files one export writes, every level and label image summed
MAX_FILES = 100_000


@dataclass(frozen=True)
class ExportOptions:
    """``levels``: "auto" (the tensor's advertised computed pyramid) or N levels halving Y
    and X. ``method``: the reduction (None: the tensor's default, ``area`` or ``mode`` for
    labels). ``chunks``/``shards``: per output (NGFF-ordered) axis, None for defaults
    (export/layout.py). ``read_ahead``/``write_ahead``: units in flight on each side (they
    set the memory bound, docs/export.md); ``workers``: writer threads."""

    levels: str | int = "auto"
    method: str | None = None
    chunks: tuple[int, ...] | None = None
    shards: tuple[int, ...] | None = None
    codec: str = "blosc-zstd"
    ngff: str = "0.5"
    mode: str = "create"
    array_id: str | None = None
    workers: int = 2
    read_ahead: int = 2
    write_ahead: int = 2

    def __post_init__(self) -> None:
        if self.levels != "auto":
            if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not 1 <= self.levels <= MAX_LEVELS:
                raise InvalidArgument(f"levels must be 'auto' or an integer 1..{MAX_LEVELS}, got {self.levels!r}")
        if self.codec not in CODECS:
            raise InvalidArgument(f"codec {self.codec!r} is not one of {', '.join(CODECS)}")
        if self.ngff not in NGFF_VERSIONS:
            raise InvalidArgument(f"ngff version {self.ngff!r} is not one of {', '.join(NGFF_VERSIONS)}")
        if self.mode not in MODES:
            raise InvalidArgument(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        for name in ("workers", "read_ahead", "write_ahead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
                raise InvalidArgument(f"{name} must be an integer 1..{MAX_WORKERS}, got {value!r}")
        for name in ("chunks", "shards"):
            value = getattr(self, name)
            if value is not None and (
                not value or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value)
            ):
                raise InvalidArgument(f"{name} must be positive integers, one per axis, got {value!r}")
        if self.chunks is not None and self.shards is not None:
            if len(self.chunks) != len(self.shards) or any(s % c for s, c in zip(self.shards, self.chunks)):
                raise InvalidArgument(
                    f"shards {list(self.shards)} must be a whole number of chunks {list(self.chunks)} on every axis"
                )

    @property
    def zarr_format(self) -> ZarrFormat:
        return NGFF_VERSIONS[self.ngff]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (lists for shapes): the form the progress record keeps and compares."""
        d = asdict(self)
        for name in ("chunks", "shards"):
            if d[name] is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_mapping(cls, body: Mapping[str, Any]) -> ExportOptions:
        """Options from a JSON body (an action's): shapes as lists or "1,256,256" strings,
        ``levels`` as "auto", an int or its string; unknown keys are refused."""
        if not isinstance(body, Mapping):
            raise InvalidArgument(f"export options must be a JSON object of option: value, got {type(body).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(body) - known)
        flags = [k for k in unknown if k in MODES]  # the CLI's --resume / --overwrite, as JSON keys
        if flags:
            raise InvalidArgument(
                f'export option {flags[0]!r} is spelled "mode": "{flags[0]}" (mode is one of {", ".join(MODES)})'
            )
        if unknown:
            raise InvalidArgument(f"unknown export option(s) {unknown[:8]}; known: {sorted(known)}")
        kw = dict(body)
        if isinstance(kw.get("levels"), str) and kw["levels"] != "auto":
            kw["levels"] = _int_option("levels", kw["levels"])
        for name in ("chunks", "shards"):
            if isinstance(kw.get(name), str):
                kw[name] = parse_shape(kw[name], name)
            elif isinstance(kw.get(name), list):
                kw[name] = tuple(kw[name])
        return cls(**kw)


def parse_shape(text: str, name: str = "shape") -> tuple[int, ...]:
    """ "1,256,256" (or "1x256x256") -> (1, 256, 256)."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    if not parts or len(parts) > 32:
        raise InvalidArgument(f"{name} {text[:80]!r} is not a comma-separated list of positive integers")
    return tuple(_int_option(name, p) for p in parts)


def _int_option(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidArgument(f"{name}: {text[:40]!r} is not an integer") from None
