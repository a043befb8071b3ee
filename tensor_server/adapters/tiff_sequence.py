"""TIFF sequences: a folder of plane files whose names carry the indices, one tensor per pattern.

``c0z2t0.tif``, ``Channel_1.tif``, ``img_channel000_position000_time000000000_z000.tif``: the
numbers in a file name are the plane's position on the c/z/t/p/... axes. The planes are read
by ``TiffPlaneGridAdapter`` (adapters/_tiff_planes.py, shared with Micro-Manager and NDTiff).

How a folder becomes tensors
  Every TIFF in the folder (not recursive; hidden files skipped) is split into text and digit
  runs. Files whose text runs are identical share a *pattern* (``c{}z{}t{}``); a number that
  varies inside a pattern is an axis, a number that does not is part of the name. The label is
  read from the word before the number (``c``/``ch``/``channel`` -> c, ``z``/``slice`` -> z,
  ``t``/``time``/``frame`` -> t, ``p``/``pos``/``position``/``s``/``site`` -> p, anything else
  a free letter q, m, n, ...; the word is kept in the metadata). One pattern is one tensor:
  files of different patterns (readlif's 1024^2 ``c0z0t0.tif`` planes next to 128^2
  ``xz_c0_t0.tif`` planes) are different tensors, because a pattern is what a user names a
  series by, and shapes differ between patterns, not inside one. Inside a pattern, every
  file's header is read at open (only the first and last above 256 files; a plane that
  differs is then reported when read) and the pattern is split by (shape, dtype) if they
  differ, the field names gaining a ``_HxW`` suffix.
  Field names are the pattern with the varying numbers dropped (``czt``, ``xz_c_t``,
  ``Channel``); the pattern with most files is the default tensor.

Sparse grids
  An axis runs from the smallest to the largest number seen (``z0`` and ``z2`` make z of 3).
  Planes that are absent from the folder read as zeros, so ``c0z0t0, c0z2t0, c0z2t2, c1z0t0``
  serve as a 2x3x3 grid with 14 zero planes. When numbers are far apart (more than twice the
  count of distinct values plus 16, e.g. timestamps), the axis is ordinal instead (the k-th
  distinct value is index k) and the values are listed in the metadata.

Multi-page files
  A file whose first tifffile series has leading axes (an ImageJ z-stack per time point) adds
  those axes after the file-name axes; its planes are its series' pages.

Read granularity (design §3): see adapters/_tiff_planes.py.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._tiff_planes import (
    TIFF_SUFFIXES,
    TIFFFILE_AXES,
    TiffPlaneGridAdapter,
    _FileHeader,
    axis_label_for,
    is_tiff_name,
    plane_file_header,
    unique_label,
)
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER
from tensor_server.errors import UnreadableSource

__all__ = ["TiffSequenceAdapter", "TiffSequenceSource", "PlanePattern", "group_plane_names", "sniff_tiff_sequence"]

#: Folders larger than this are not fully listed by ``sniff`` (it must stay cheap).
_SNIFF_LIST_LIMIT = 4096

_DIGITS = re.compile(r"(\d+)")
_TRAILING_WORD = re.compile(r"([A-Za-z]+)[^A-Za-z0-9]*$")


def _tiff_stem(name: str) -> str:
    low = name.lower()
    for suffix in (".ome.tiff", ".ome.tif") + TIFF_SUFFIXES:
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return name


class TiffSequenceAdapter(TiffPlaneGridAdapter):
    """One pattern of a TIFF sequence folder (module docstring: axes, sparse grids, blocks)."""


# ---- file-name patterns -----------------------------------------------------------------------
@dataclass
class PlanePattern:
    """Files of a folder that share their text runs; numbers in ``values`` per file."""

    texts: tuple[str, ...]
    names: list[str] = field(default_factory=list)
    values: list[tuple[int, ...]] = field(default_factory=list)

    def varying(self) -> list[int]:
        """Positions of the numbers that differ between files (the axes)."""
        if not self.values:
            return []
        first = self.values[0]
        return [j for j in range(len(first)) if any(v[j] != first[j] for v in self.values)]

    def keyword(self, j: int) -> str | None:
        """The word before number ``j`` (``img_channel`` -> ``channel``)."""
        m = _TRAILING_WORD.search(self.texts[j])
        return m.group(1).lower() if m else None

    def field_name(self) -> str:
        """The pattern with its varying numbers dropped: ``c{}z{}t{}`` -> ``czt``."""
        vary = set(self.varying())
        first = self.values[0] if self.values else ()
        parts = []
        for j, text in enumerate(self.texts):
            parts.append(text)
            if j < len(first) and j not in vary:
                parts.append(str(first[j]))
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "".join(parts))
        name = re.sub(r"([_.-])[_.-]+", r"\1", name).strip("_.- ")
        return name or "image"

    def display(self, labels: Mapping[int, str]) -> str:
        vary = set(self.varying())
        first = self.values[0] if self.values else ()
        out = []
        for j, text in enumerate(self.texts):
            out.append(text)
            if j < len(first):
                out.append("{" + labels.get(j, "?") + "}" if j in vary else str(first[j]))
        return "".join(out)


def group_plane_names(names: Iterable[str]) -> list[PlanePattern]:
    """TIFF names grouped by pattern (text runs), names in natural order inside a group."""
    groups: dict[tuple[str, ...], PlanePattern] = {}
    for name in names:
        parts = _DIGITS.split(_tiff_stem(name))
        texts = tuple(parts[0::2])
        values = tuple(int(v) for v in parts[1::2])
        g = groups.setdefault(texts, PlanePattern(texts))
        g.names.append(name)
        g.values.append(values)
    for g in groups.values():
        order = sorted(range(len(g.names)), key=lambda i: (g.values[i], g.names[i]))
        g.names = [g.names[i] for i in order]
        g.values = [g.values[i] for i in order]
    return list(groups.values())


def _list_tiff_names(folder: Path, limit: int | None = None) -> list[str]:
    names = []
    with os.scandir(folder) as it:
        for i, entry in enumerate(it):
            if limit is not None and i >= limit:
                break
            if is_tiff_name(entry.name) and entry.is_file():
                names.append(entry.name)
    return names


def _looks_like_sequence(patterns: Sequence[PlanePattern]) -> bool:
    """At least two TIFF files that differ only in their numbers. A folder holding a lone
    ``scan_001.tif`` (or a few unrelated TIFFs, like ../testdata/ome-tiff) is not claimed:
    opening it as a sequence would surprise a user who meant the files; such files still
    open on their own, and the folder opens with ``format="tiff-sequence"``."""
    return any(len(g.names) >= 2 for g in patterns)


def sniff_tiff_sequence(path: Path, head: bytes) -> bool:
    if not path.is_dir():
        return False
    return _looks_like_sequence(group_plane_names(_list_tiff_names(path, _SNIFF_LIST_LIMIT)))


# ---- building tensors ---------------------------------------------------------------------------
def build_sequence_tensor(folder: Path, pattern: PlanePattern, header: _FileHeader) -> TiffSequenceAdapter:
    """A tensor over one pattern: file-name axes, then the file's own leading axes, then the plane."""
    vary = pattern.varying()
    used: set[str] = set()
    labels: dict[int, str] = {}
    axes_meta: dict[str, Any] = {}
    index_of: list[dict[int, int]] = []
    shape: list[int] = []
    for j in vary:
        kw = pattern.keyword(j)
        label = unique_label(axis_label_for(kw), used)
        labels[j] = label
        vals = sorted({v[j] for v in pattern.values})
        lo, hi = vals[0], vals[-1]
        meta: dict[str, Any] = {"keyword": kw}
        if hi - lo + 1 > 2 * len(vals) + 16:  # far apart: ordinal axis
            index_of.append({v: i for i, v in enumerate(vals)})
            shape.append(len(vals))
            meta["values"] = vals
        else:
            index_of.append({v: v - lo for v in vals})
            shape.append(hi - lo + 1)
            meta["first"] = lo
        axes_meta[label] = meta
    lead_shape = header.shape[: len(header.shape) - header.plane_ndim]
    lead_labels = [unique_label(TIFFFILE_AXES.get(a), used) for a in header.axes[: len(lead_shape)]]
    plane_shape = header.shape[len(lead_shape) :]
    plane_labels = [TIFFFILE_AXES[a] for a in header.page_axes]
    grid_shape = tuple(shape) + tuple(lead_shape)
    file_index = np.full(grid_shape, -1, dtype=np.int64)
    plane_index = np.zeros(grid_shape, dtype=np.int64)
    lead_planes = np.arange(math.prod(lead_shape), dtype=np.int64).reshape(lead_shape)
    files = [str(folder / n) for n in pattern.names]
    duplicates = []
    for f, values in enumerate(pattern.values):
        key = tuple(index_of[i][values[j]] for i, j in enumerate(vary))
        if file_index[key].size and (file_index[key] >= 0).any():
            duplicates.append(pattern.names[f])
            continue
        file_index[key] = f
        plane_index[key] = lead_planes
    # one tile per plane: the plane axes have a tile count of 1
    file_index = file_index.reshape(grid_shape + (1,) * header.plane_ndim)
    plane_index = plane_index.reshape(grid_shape + (1,) * header.plane_ndim)
    nplanes = len(pattern.names) - len(duplicates)
    present = int((file_index >= 0).sum())
    metadata = {
        "pattern": pattern.display(labels),
        "files": nplanes,
        "missing_planes": int(file_index.size - present),
        "axes": axes_meta,
        **({"duplicate_files_ignored": duplicates} if duplicates else {}),
    }
    ndim = len(grid_shape) + header.plane_ndim
    scale: list[float | None] = [None] * ndim
    unit: list[str | None] = [None] * ndim
    if header.pixel_size:
        for i, label in enumerate(plane_labels, start=len(grid_shape)):
            if label in ("y", "x"):
                scale[i], unit[i] = header.pixel_size, MICROMETER
    read_block = None if header.read_block is None else (1,) * len(grid_shape) + header.read_block
    return TiffSequenceAdapter(
        files=files,
        file_index=file_index,
        plane_index=plane_index,
        grid_labels=[labels[j] for j in vary] + lead_labels,
        plane_labels=plane_labels,
        plane_shape=plane_shape,
        stored_dtype=header.dtype,
        file_shape=header.shape,
        read_block=read_block,
        physical_scale=scale if header.pixel_size else None,
        physical_unit=unit if header.pixel_size else None,
        content_version=file_content_version(*files),
        metadata=metadata,
    )


#: Patterns with at most this many files have every header read at open; larger ones only
#: the first and last (a plane that differs is then reported when read).
_CHECK_ALL_HEADERS = 256


def _split_by_shape(folder: Path, pattern: PlanePattern) -> list[tuple[PlanePattern, _FileHeader]]:
    """One (pattern, header) per (shape, dtype) found in the pattern (see _CHECK_ALL_HEADERS)."""
    first = plane_file_header(folder / pattern.names[0])
    last = first if len(pattern.names) == 1 else plane_file_header(folder / pattern.names[-1])
    same = (first.shape, first.dtype) == (last.shape, last.dtype)
    if same and len(pattern.names) > _CHECK_ALL_HEADERS:
        return [(pattern, first)]
    headers = (
        [first]
        + [plane_file_header(folder / n) for n in pattern.names[1:-1]]
        + ([last] if len(pattern.names) > 1 else [])
    )
    if all((h.shape, h.dtype) == (first.shape, first.dtype) for h in headers):
        return [(pattern, first)]
    parts: dict[tuple, tuple[PlanePattern, _FileHeader]] = {}
    for name, values, h in zip(pattern.names, pattern.values, headers):
        sub, _ = parts.setdefault((h.shape, h.dtype.str), (PlanePattern(pattern.texts), h))
        sub.names.append(name)
        sub.values.append(values)
    return list(parts.values())


class TiffSequenceSource(SourceAdapter):
    """A folder of TIFF planes: one tensor per file-name pattern (module docstring)."""

    format_name = "tiff-sequence"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        if not path.is_dir():
            raise UnreadableSource(path, "a TIFF sequence is a folder of TIFF files")
        patterns = group_plane_names(_list_tiff_names(path))
        if not patterns:
            raise UnreadableSource(path, "the folder holds no TIFF files")
        built: list[tuple[str, int, int, TensorAdapter]] = []
        for pattern in patterns:
            parts = _split_by_shape(path, pattern)
            for sub, header in parts:
                name = sub.field_name()
                if len(parts) > 1:  # same pattern, different plane shapes: name the shape
                    plane = dict(zip(header.page_axes, header.shape[-header.plane_ndim :]))
                    name += f"_{plane['Y']}x{plane['X']}"
                tensor = build_sequence_tensor(path, sub, header)
                built.append((name, len(sub.names), math.prod(header.shape), tensor))
        built.sort(key=lambda b: (-b[1], -b[2], b[0]))
        tensors: dict[str, TensorAdapter] = {}
        for name, _, _, tensor in built:
            unique, i = name, 2
            while unique in tensors:
                unique, i = f"{name}_{i}", i + 1
            tensors[unique] = normalize_axes(tensor)
        super().__init__(
            path,
            tensors,
            metadata={"patterns": {n: t.metadata.get("pattern") for n, t in tensors.items()}},
        )


register_format(
    FormatEntry(
        name="tiff-sequence",
        opener=TiffSequenceSource,
        sniff=sniff_tiff_sequence,
        priority=50,
        folders=True,
        files=False,
        claims=TIFF_SUFFIXES,  # a .czi or .map beside the planes is a source of its own
        description="folder of TIFF planes named by index (c0z2t0.tif, Channel_1.tif, ...)",
    )
)
