"""Single-file TIFF family: plain TIFF, ImageJ, pyramidal/tiled TIFF, SVS, QPTIFF and LSM.

Every tensor here is one tifffile page series (or one pyramid level of it), read by
``_tiff_series.py``. tifffile already knows the flavours (ImageJ hyperstacks, Aperio SVS
levels, PerkinElmer QPI levels, Zeiss LSM with its interleaved thumbnails, reduced-resolution
IFD pyramids); this module finds a file's series and what its metadata says of them: the
tensors and their fields (``build_series_tensors``, its stored levels as ``NativeLevel``
entries), the physical scales, the file-head probes and the check for truncated files.

OME-TIFF (``ome_tiff.py``) builds its tensors with the same ``build_series_tensors`` and
probes, with its own opener and OME-XML metadata.
"""

from __future__ import annotations

import logging
import math
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_server.adapters._tiff_series import TiffHandle, TiffPageSeriesAdapter
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER, SECOND, canonical_unit
from tensor_server.errors import UnreadableSource

if TYPE_CHECKING:  # pragma: no cover
    import tifffile

__all__ = [
    "TiffAdapter",
    "LsmAdapter",
    "TiffSource",
    "build_series_tensors",
    "check_series_extent",
    "is_tiff_head",
    "first_description_tail",
    "series_field_names",
    "series_files",
]

log = logging.getLogger(__name__)

_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


# ---- file heads and series names ---------------------------------------------------------------
def is_tiff_head(head: bytes) -> bool:
    """Classic TIFF (II*\\0, MM\\0*) or BigTIFF (II+\\0, MM\\0+ with 8-byte offsets)."""
    if head[:4] not in _TIFF_MAGIC:
        return False
    if head[2:4] in (b"+\x00", b"\x00+"):
        return len(head) >= 8 and head[4:6] in (b"\x08\x00", b"\x00\x08")
    return True


def first_description_tail(path: Path, head: bytes, tail: int = 64) -> bytes | None:
    """The last ``tail`` bytes of the first IFD's ImageDescription (tag 270), NULs and white
    space stripped, or None. A bounded, pure-Python IFD walk (no tifffile import): one seek
    for the IFD when it lies beyond ``head`` and one for the value. Never raises."""
    try:
        if not is_tiff_head(head) or len(head) < 16:
            return None
        bo = "<" if head[:2] == b"II" else ">"
        big = head[2:4] in (b"+\x00", b"\x00+")
        if big:
            ifd_offset = struct.unpack(bo + "Q", head[8:16])[0]
            count_fmt, count_size, entry_size, off_fmt, off_size = "Q", 8, 20, "Q", 8
        else:
            ifd_offset = struct.unpack(bo + "I", head[4:8])[0]
            count_fmt, count_size, entry_size, off_fmt, off_size = "H", 2, 12, "I", 4
        size = os.path.getsize(path)
        with open(path, "rb") as fh:

            def read(offset: int, n: int) -> bytes:
                if offset < 0 or n < 0 or offset + n > size:
                    raise ValueError("outside the file")
                if offset + n <= len(head):
                    return head[offset : offset + n]
                fh.seek(offset)
                return fh.read(n)

            n_entries = struct.unpack(bo + count_fmt, read(ifd_offset, count_size))[0]
            if not 0 < n_entries <= 4096:
                return None
            entries = read(ifd_offset + count_size, n_entries * entry_size)
            for k in range(n_entries):
                e = entries[k * entry_size : (k + 1) * entry_size]
                tag, typ = struct.unpack(bo + "HH", e[:4])
                if tag != 270:
                    continue
                count = struct.unpack(bo + off_fmt, e[4 : 4 + off_size])[0]
                value = e[4 + off_size :]
                if typ not in (1, 2, 7) or count == 0:
                    return None
                if count <= off_size:
                    data = value[:count]
                else:
                    start = struct.unpack(bo + off_fmt, value)[0]
                    n = min(count, tail + 16)
                    data = read(start + count - n, n)
                return data.rstrip(b"\x00 \t\r\n")[-tail:]
        return None
    except Exception:
        return None


_SAFE_FIELD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def series_field_names(names: Sequence[str | None]) -> list[str]:
    """Field names for a file's series: their own names when every one is non-empty, unique
    and URL/path safe (SVS Baseline/Thumbnail/Label/Macro, OME Image names), else
    ``series_0``, ``series_1``, ... for all (predictable beats a mix)."""
    cleaned = [(n or "").strip() for n in names]
    if cleaned and all(_SAFE_FIELD.match(n) for n in cleaned) and len(set(cleaned)) == len(cleaned):
        return cleaned
    return [f"series_{i}" for i in range(len(names))]


def series_files(tf: tifffile.TiffFile) -> list[str]:
    """Every file holding pages of ``tf``'s series (several for a multi-file OME-TIFF)."""
    files = {os.path.realpath(tf.filehandle.path)}
    for s in tf.series:
        if not s.is_multifile:
            continue
        for page in s:
            if page is not None:
                files.add(os.path.realpath(page.parent.filehandle.path))
    return sorted(files)


# ---- the tensors: page series of the plain flavours and of LSM ----------------------------------
class TiffAdapter(TiffPageSeriesAdapter):
    """A plain, ImageJ, tiled/pyramidal, SVS or QPTIFF series.

    Why a TIFF block is the whole page: as for every page-mode series (see the base class),
    tifffile decodes a page whole to return any window of it, so the page is what this reader
    cannot read below. A stripped multi-page stack reads one page (one plane) per block; a
    tiled plane reads all its tiles at once, decoded in parallel; a whole-slide baseline above
    ``page_mode_max_bytes`` falls back to one tile per block.
    """


class LsmAdapter(TiffPageSeriesAdapter):
    """A Zeiss LSM series (tifffile's LSM reader: the CZ_LSMINFO dimensions, every other IFD,
    thumbnails as their own series).

    Why an LSM block is the whole page: an LSM page holds one Z/T plane with every channel
    (planar samples), stored as strips that tifffile reads and decodes in one pass; page mode
    returns that plane whole, so one page is the block, as for every page-mode series.
    """


# ---- physical scale ---------------------------------------------------------------------------
#: µm per ResolutionUnit (tifffile's codes: 2 INCH, 3 CENTIMETER, 4 MILLIMETER, 5 MICROMETER);
#: 1 (NONE) has no length, so no physical size
_UM_PER_RESOLUTION_UNIT = {2: 25400.0, 3: 1e4, 4: 1e3, 5: 1.0}
#: what image programs write when they know no pixel size: 72 dots per inch (and the
#: Windows display default, 96), whatever unit they spell it in
_DISPLAY_DPI = (72.0, 96.0)
#: ImageJ units a display resolution is spelled in -> µm per unit
_IMAGEJ_DISPLAY_UNITS = {"inch": 25400.0, "cm": 1e4}


def _tag_pixel_size(xres: float, yres: float, um_per_unit: float) -> tuple[float, float] | None:
    """Pixel size (y, x) in µm of a resolution of ``xres``, ``yres`` pixels per unit
    (``um_per_unit`` µm long), or None when the tag is only a default: a resolution of 1
    (the placeholder) or a display resolution (72 dpi, 25400/72 = 352.78 µm pixels: an image
    opened beside a micrograph would shrink it to a dot)."""
    if not xres or not yres or xres <= 0 or yres <= 0 or (xres == 1 and yres == 1):
        return None
    dpi = (xres * 25400.0 / um_per_unit, yres * 25400.0 / um_per_unit)
    if any(all(math.isclose(d, display, rel_tol=1e-3) for d in dpi) for display in _DISPLAY_DPI):
        return None
    return um_per_unit / yres, um_per_unit / xres


def _resolution_um(page: Any) -> tuple[float, float] | None:
    """Pixel size (y, x) in µm from XResolution/YResolution with a length unit (inch, cm,
    mm, µm), unless the tag is only a default (``_tag_pixel_size``)."""
    try:
        unit = int(page.resolutionunit)
        xres, yres = page.resolution
    except Exception:
        return None
    um_per_unit = _UM_PER_RESOLUTION_UNIT.get(unit)
    return None if um_per_unit is None else _tag_pixel_size(float(xres), float(yres), um_per_unit)


def tiff_physical(tf: tifffile.TiffFile, index: int, series: Any) -> dict[str, tuple[float, str]]:
    """Per tifffile axis code: (size, unit) from the cheap sources: ImageJ spacing/resolution,
    LSM voxel sizes and SVS MPP (both describe the main image, series 0, not thumbnails or
    slide labels), resolution tags of the series' own pages unless only a default (``_tag_pixel_size``)."""
    out: dict[str, tuple[float, str]] = {}
    page = series.keyframe
    try:
        if tf.is_lsm:
            if index != 0:
                return out
            info = tf.lsm_metadata or {}
            for code, key in (("X", "VoxelSizeX"), ("Y", "VoxelSizeY"), ("Z", "VoxelSizeZ")):
                v = float(info.get(key, 0) or 0)
                if v > 0:
                    out[code] = (v * 1e6, MICROMETER)
            t = float(info.get("TimeIntervall", 0) or 0)
            if t > 0:
                out["T"] = (t, SECOND)
            return out
        if tf.is_imagej:
            ij = tf.imagej_metadata or {}
            unit = canonical_unit(ij.get("unit"))
            xres, yres = page.resolution
            # ImageJ carries a 72-dpi default over as a calibration in inches (or cm)
            default = (
                unit in _IMAGEJ_DISPLAY_UNITS
                and _tag_pixel_size(float(xres), float(yres), _IMAGEJ_DISPLAY_UNITS[unit]) is None
            )
            if unit and not default and xres and yres and xres > 0 and yres > 0:
                out["X"], out["Y"] = (1.0 / xres, unit), (1.0 / yres, unit)
            if unit and float(ij.get("spacing", 0) or 0) > 0:
                out["Z"] = (float(ij["spacing"]), unit)
            if float(ij.get("finterval", 0) or 0) > 0:
                out["T"] = (float(ij["finterval"]), SECOND)
            return out
        if tf.is_svs and index == 0:
            from tifffile.tifffile import svs_description_metadata

            mpp = float(svs_description_metadata(tf.pages.first.description).get("MPP", 0) or 0)
            if mpp > 0:
                out["X"] = out["Y"] = (mpp, MICROMETER)
                return out
        res = _resolution_um(page)
        if res is not None:
            out["Y"], out["X"] = (res[0], MICROMETER), (res[1], MICROMETER)
    except Exception as exc:  # metadata is optional; never fail an open over it
        log.debug("physical scale of %s not read: %s", tf.filehandle.path, exc)
    return out


def physical_lists(axes: str, sizes: Mapping[str, tuple[float, str]]) -> tuple[tuple | None, tuple | None]:
    """(physical_scale, physical_unit) per axis in ``axes`` order, None where unknown (and
    None overall when nothing is known)."""
    if not any(a in sizes for a in axes):
        return None, None
    return (
        tuple(sizes[a][0] if a in sizes else None for a in axes),
        tuple(sizes[a][1] if a in sizes else None for a in axes),
    )


# ---- building a source ------------------------------------------------------------------------
def build_series_tensors(
    handle: TiffHandle,
    adapter_cls: type[TiffPageSeriesAdapter],
    *,
    names: Sequence[str | None] | None = None,
    physical: Callable[[Any, int, Any], Mapping[str, tuple[float, str]]] | None = None,
    tensor_metadata: Callable[[Any, int, Any], Mapping[str, Any]] | None = None,
) -> tuple[dict[str, TensorAdapter], list[dict[str, Any]]]:
    """One normalized tensor per series of ``handle`` (with its stored levels), and a plain
    summary of every series for the source metadata. ``physical(tf, index, series)`` gives
    per-axis-code sizes; ``tensor_metadata`` extra per-tensor metadata."""
    content_version = handle.content_version()
    with handle.use() as opened:
        tf, all_series = opened.tf, opened.series
        if not all_series:
            raise UnreadableSource(handle.path, "no image series in the file")
        summaries = []
        per_series = []
        for i, s in enumerate(all_series):
            sizes = (physical or tiff_physical)(tf, i, s)
            extra = dict(tensor_metadata(tf, i, s)) if tensor_metadata else {}
            per_series.append((s.axes, len(s.levels), sizes, extra))
            summaries.append(
                {
                    "name": s.name or "",
                    "kind": s.kind,
                    "axes": s.axes,
                    "shape": list(s.shape),
                    "dtype": str(s.dtype),
                    "levels": [list(lv.shape) for lv in s.levels],
                }
            )
        fields = series_field_names(names if names is not None else [s.name for s in all_series])
    tensors: dict[str, TensorAdapter] = {}
    for i, (field, (axes, n_levels, sizes, extra)) in enumerate(zip(fields, per_series)):
        scale, unit = physical_lists(axes, sizes)
        meta = {"series": i, "axes": axes, **extra}
        tensor = adapter_cls(
            handle,
            i,
            0,
            physical_scale=scale,
            physical_unit=unit,
            content_version=content_version,
            metadata=meta,
        )
        tensor.attach_levels(
            n_levels,
            partial(
                _level_tensor,
                adapter_cls,
                handle,
                i,
                unit=unit,
                content_version=content_version,
                metadata=meta,
            ),
        )
        tensors[field] = normalize_axes(tensor)
    for summary, field in zip(summaries, fields):
        summary["field"] = field
    return tensors, summaries


def _level_tensor(
    adapter_cls: type[TiffPageSeriesAdapter],
    handle: TiffHandle,
    series_index: int,
    level: int,
    *,
    unit: Sequence[str | None] | None,
    content_version: bytes,
    metadata: Mapping[str, Any],
) -> TiffPageSeriesAdapter:
    return adapter_cls(
        handle,
        series_index,
        level,
        physical_unit=unit,
        content_version=content_version,
        metadata={**metadata, "level": level},
    )


def check_series_extent(path: Path, tf: tifffile.TiffFile) -> None:
    """Raise UnreadableSource when a series' first or last page points past the end of its
    file (a truncated download): cheaper and clearer than failing on the first read."""
    for i, s in enumerate(tf.series):
        if s.dataoffset is not None:  # contiguous series: one extent for all its pages
            fh = s.keyframe.parent.filehandle
            end = s.dataoffset + s.nbytes
            if end > fh.size:
                raise UnreadableSource(
                    path, f"truncated: series {i} needs {end} bytes of {fh.name}, the file has {fh.size}"
                )
            continue
        pages = [p for p in (s[0], s[-1]) if p is not None] if len(s) else []
        for page in pages:
            fh = page.parent.filehandle
            try:
                ends = [o + c for o, c in zip(page.dataoffsets, page.databytecounts) if o and c]
            except Exception:
                continue
            if ends and max(ends) > fh.size:
                raise UnreadableSource(
                    path,
                    f"truncated: series {i} page {page.index} of {fh.name} needs {max(ends)} bytes, "
                    f"the file has {fh.size}",
                )


class TiffSource(SourceAdapter):
    """A single TIFF file: one tensor per tifffile series (SVS: Baseline, Thumbnail, Label,
    Macro; QPTIFF: Baseline and its associated images; LSM: data and thumbnails), each with its
    stored pyramid levels. ``type`` names the flavour (tiff, imagej, svs, qptiff, lsm)."""

    format_name = "tiff"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        handle = TiffHandle(path, files=[path])
        try:
            with handle.use() as opened:
                tf = opened.tf
                check_series_extent(path, tf)
                flavour = _flavour(tf)
                flags = sorted(tf.flags)
                byteorder = tf.byteorder
            adapter_cls = LsmAdapter if flavour == "lsm" else TiffAdapter
            tensors, summaries = build_series_tensors(handle, adapter_cls)
        except BaseException:
            handle.close()
            raise
        self.handle = handle
        super().__init__(
            path,
            tensors,
            metadata={"flavour": flavour, "tifffile_flags": flags, "byteorder": byteorder, "series": summaries},
            source_type=flavour,
        )

    def close(self) -> None:
        super().close()
        self.handle.close()


def _flavour(tf: tifffile.TiffFile) -> str:
    for name in ("lsm", "svs", "qpi", "imagej", "ome"):
        if getattr(tf, f"is_{name}", False):
            return {"qpi": "qptiff", "ome": "ome-tiff"}.get(name, name)
    return "tiff"


def _sniff_tiff(path: Path, head: bytes) -> bool:
    return is_tiff_head(head)


register_format(
    FormatEntry(
        name="tiff",
        opener=TiffSource,
        sniff=_sniff_tiff,
        extensions=(".tif", ".tiff", ".btf", ".tf8", ".tf2", ".lsm", ".svs", ".qptiff"),
        priority=70,
        description="TIFF family via tifffile: plain, ImageJ, tiled/pyramidal, SVS, QPTIFF, LSM",
    )
)
