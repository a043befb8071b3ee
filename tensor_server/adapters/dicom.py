"""DICOM through pydicom: single files (single- or multi-frame), whole-slide (VL WSI) levels
composed from their tiles, and a folder of slices of one series as one volume.

Frames, lazily. A file is parsed once up to its pixel data (``dcmread(stop_before_pixels)``
leaves the stream at the Pixel Data tag, whose value offset is kept); a read then opens the
file, seeks there and asks pydicom's decoder for one frame (``Decoder.as_array(fh,
index=i)``), which for native data reads just that frame's bytes and for encapsulated data
(JPEG, JPEG 2000, RLE, ...) just that frame's fragments. Nothing decodes a frame it does not
need. Each read opens its own file object, so concurrent reads share no stream state.
JPEG baseline is decoded by pydicom's Pillow plugin (Pillow must be installed); other
compressed syntaxes need the matching pydicom plugin (pylibjpeg-*, gdcm).

Read granularity. A frame (a WSI tile, one frame of a multi-frame object, one slice file of a
series) is decoded whole to return any of it, so ``read_block_shape`` is one frame. Nearest is
nevertheless served as a strided read (``decimates``): the step on a frame axis (the frames
of a multi-frame file, the slices of a series, the focal planes / optical paths of a WSI
level) selects frames and never decodes the skipped ones, a WSI tile holding no picked pixel
is skipped, and inside a decoded frame Y/X are strided. Like LifAdapter's plane skipping, the
block is a plane and the step skips whole planes.

Values. Rescale Slope/Intercept (top-level, or the Pixel Value Transformation functional
group of enhanced objects, per frame or shared) is the modality transform: when every frame
has slope 1 and intercept 0 the served dtype is the stored one and the values are raw;
otherwise the served dtype is float32 (float64 for Double Float Pixel Data) and the values are
exactly ``(raw.astype(float64) * slope + intercept).astype(float32)``, i.e. pydicom's
``apply_modality_lut`` cast to float32. Colour is served as decoded by pydicom (YBR is
converted to RGB) with a trailing ``s`` axis; MONOCHROME1 and PALETTE COLOR values are served
raw (the display transforms are the client's).

Axes: single frame (y, x[, s]); multi-frame (f, y, x[, s]) where f is ``z`` when the frames
are planes at distinct positions (enhanced per-frame positions, RT dose grid offsets), ``t``
when the file carries frame timing (cine), else ``i`` (an index); a series (z, y, x[, s])
sorted by Image Position (Patient) projected on the slice normal (falling back to Instance
Number); a WSI level ([c,] [z,] y, x[, s]) over Total Pixel Matrix Rows x Columns with
optical paths as c and focal planes as z when there is more than one. Tiles a TILED_SPARSE
level does not store read as 0.

Patient-identifying attributes are never copied into metadata.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._dicom_file import DicomFile
from tensor_server.adapters._strided import StridedReads
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import NativeLevel, SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MILLIMETER, MILLISECOND
from tensor_server.errors import UnreadableSource

__all__ = [
    "DicomAdapter",
    "DicomSeriesAdapter",
    "DicomFileSource",
    "DicomFolderSource",
    "sniff_dicom",
    "sniff_dicom_folder",
]

_FOLDER_SNIFF_FILES = 8


# ---- frame assembly shared by both adapters ---------------------------------------------------
@dataclass
class FrameLayout:
    """Where each stored frame lands in the tensor.

    The tensor is ``lead_shape + plane + (samples,)`` (samples only when > 1). ``grid`` has
    shape ``lead_shape + (tile rows, tile columns)`` and holds an index into ``frames`` (a
    (file, frame number) pair) or -1 for a tile that is not stored. ``rescale`` holds the
    (slope, intercept) of each frame, or is None when every frame is identity.
    """

    lead_labels: tuple[str, ...]
    lead_shape: tuple[int, ...]
    plane: tuple[int, int]
    tile: tuple[int, int]
    samples: int
    grid: np.ndarray
    frames: list[tuple[DicomFile, int]]
    rescale: list[tuple[float, float]] | None = None
    raw_dtype: np.dtype = field(default_factory=lambda: np.dtype(np.uint8))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lead_shape + self.plane + ((self.samples,) if self.samples > 1 else ())

    @property
    def labels(self) -> tuple[str, ...]:
        return self.lead_labels + ("y", "x") + (("s",) if self.samples > 1 else ())

    @property
    def frame_block(self) -> tuple[int, ...]:
        """One frame: 1 on the lead axes, the tile on Y/X (clipped), all samples."""
        tile = tuple(min(t, n) for t, n in zip(self.tile, self.plane))
        return (1,) * len(self.lead_shape) + tile + ((self.samples,) if self.samples > 1 else ())

    @property
    def served_dtype(self) -> np.dtype:
        if self.rescale is None:
            return self.raw_dtype
        return np.dtype(np.float64) if self.raw_dtype == np.float64 else np.dtype(np.float32)


def _picked(start: int, stop: int, step: int, lo: int, hi: int) -> tuple[int, int] | None:
    """First picked index of ``range(start, stop, step)`` inside ``[lo, hi)`` and the count."""
    first = start + (-(-(max(lo, start) - start) // step)) * step
    end = min(stop, hi)
    if first >= end:
        return None
    return first, (end - 1 - first) // step + 1


class FrameAssembledReads(StridedReads):
    """``read_region`` / ``get_decimated_data`` over a FrameLayout (see module docstring)."""

    layout: FrameLayout

    def _init_reads(self, layout: FrameLayout) -> None:
        self.layout = layout
        self.frames_decoded = 0  # for tests asserting that skipped frames are not decoded

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        return self.layout.frame_block

    def _frame(self, index: int) -> np.ndarray:
        lay = self.layout
        dfile, number = lay.frames[index]
        arr = dfile.decode(number)
        self.frames_decoded += 1
        if lay.rescale is not None:
            slope, inter = lay.rescale[index]
            arr = arr.astype(np.float64) * slope + inter
        return arr

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        """Only the frames holding a picked pixel are decoded."""
        lay = self.layout
        nlead = len(lay.lead_shape)
        out_shape = tuple(len(range(a, b, s)) for a, b, s in zip(bounds.start, bounds.stop, step))
        out = np.zeros(out_shape, dtype=lay.served_dtype)
        lead_ranges = [range(a, b, s) for a, b, s in zip(bounds.start[:nlead], bounds.stop[:nlead], step[:nlead])]
        (y0, x0), (y1, x1) = bounds.start[nlead : nlead + 2], bounds.stop[nlead : nlead + 2]
        sy, sx = step[nlead], step[nlead + 1]
        samples = (slice(bounds.start[-1], bounds.stop[-1], step[-1]),) if lay.samples > 1 else ()
        th, tw = lay.tile
        out_leads = itertools.product(*(range(len(r)) for r in lead_ranges))
        for out_lead, lead in zip(out_leads, itertools.product(*lead_ranges)):
            grid = lay.grid[lead]
            for ty in range(y0 // th, (y1 - 1) // th + 1):
                ys = _picked(y0, y1, sy, ty * th, (ty + 1) * th)
                if ys is None:
                    continue
                for tx in range(x0 // tw, (x1 - 1) // tw + 1):
                    xs = _picked(x0, x1, sx, tx * tw, (tx + 1) * tw)
                    if xs is None or grid[ty, tx] < 0:
                        continue
                    pixels = self._frame(int(grid[ty, tx]))
                    (fy, ny), (fx, nx) = ys, xs
                    src = pixels[fy - ty * th :: sy][:ny, fx - tx * tw :: sx][:, :nx]
                    if samples:
                        src = src[(...,) + samples]
                    oy, ox = (fy - y0) // sy, (fx - x0) // sx
                    out[out_lead + (slice(oy, oy + ny), slice(ox, ox + nx))] = src
        return out


class DicomAdapter(FrameAssembledReads, TensorAdapter):
    """One DICOM instance: a single frame, a multi-frame stack, or a WSI level of tiles."""

    decimates = True

    def __init__(
        self,
        path: Path,
        layout: FrameLayout,
        physical_scale: Sequence[float | None],
        physical_unit: Sequence[str | None],
        metadata: dict[str, Any],
        content_paths: Sequence[Path] | None = None,
    ) -> None:
        self.path = path
        self._init_reads(layout)
        super().__init__(_layout_info(layout, physical_scale, physical_unit, metadata, content_paths or [path]))


class DicomSeriesAdapter(FrameAssembledReads, TensorAdapter):
    """Single-frame slices of one series (one file each), stacked along z."""

    decimates = True

    def __init__(
        self,
        folder: Path,
        layout: FrameLayout,
        physical_scale: Sequence[float | None],
        physical_unit: Sequence[str | None],
        metadata: dict[str, Any],
    ) -> None:
        self.path = folder
        self._init_reads(layout)
        paths = [f.path for f, _ in layout.frames]
        super().__init__(_layout_info(layout, physical_scale, physical_unit, metadata, paths))


def _layout_info(
    layout: FrameLayout,
    physical_scale: Sequence[float | None],
    physical_unit: Sequence[str | None],
    metadata: dict[str, Any],
    content_paths: Sequence[Path],
) -> TensorInfo:
    """The served tensor of frames laid out by ``layout``; its content is the files'."""
    return TensorInfo(
        layout.shape,
        layout.served_dtype,
        dim_labels=layout.labels,
        native_chunk_shape=layout.frame_block,
        physical_scale=physical_scale,
        physical_unit=physical_unit,
        content_version=file_content_version(*content_paths),
        metadata=metadata,
    )


# ---- building layouts -------------------------------------------------------------------------
def _seq_item(ds: Any, *keywords: str) -> Any:
    """``ds.K1[0].K2[0]...`` or None."""
    cur = ds
    for kw in keywords:
        seq = cur.get(kw) if cur is not None else None
        if not seq:
            return None
        cur = seq[0]
    return cur


def _frame_groups(ds: Any, index: int, *keywords: str) -> Any:
    """A functional group item for frame ``index``: per-frame first, shared second."""
    per = ds.get("PerFrameFunctionalGroupsSequence")
    if per and index < len(per):
        item = _seq_item(per[index], *keywords)
        if item is not None:
            return item
    return _seq_item(ds, "SharedFunctionalGroupsSequence", *keywords)


def _rescale(ds: Any, nframes: int) -> list[tuple[float, float]]:
    def pair(item: Any) -> tuple[float, float] | None:
        if item is not None and "RescaleSlope" in item and "RescaleIntercept" in item:
            try:
                return float(item.RescaleSlope), float(item.RescaleIntercept)
            except (TypeError, ValueError):
                return None
        return None

    top = pair(ds)
    if top is not None:
        return [top] * nframes
    out = []
    for i in range(nframes):
        out.append(pair(_frame_groups(ds, i, "PixelValueTransformationSequence")) or (1.0, 0.0))
    return out


def _pixel_spacing(ds: Any) -> tuple[float | None, float | None]:
    for item in (ds, _frame_groups(ds, 0, "PixelMeasuresSequence")):
        if item is not None and item.get("PixelSpacing"):
            try:
                row, col = (float(v) for v in item.PixelSpacing[:2])
                return (row or None), (col or None)
            except (TypeError, ValueError):
                pass
    return None, None


def _normal(ds: Any) -> np.ndarray | None:
    iop = ds.get("ImageOrientationPatient")
    if iop is None:
        iop = getattr(_frame_groups(ds, 0, "PlaneOrientationSequence"), "ImageOrientationPatient", None)
    if iop is None or len(iop) != 6:
        return None
    n = np.cross(np.asarray(iop[:3], float), np.asarray(iop[3:], float))
    return n if np.linalg.norm(n) > 0 else None


def _uniform_spacing(positions: Iterable[float]) -> float | None:
    p = np.asarray(sorted(positions), float)
    if len(p) < 2:
        return None
    d = np.diff(p)
    step = float(np.median(d))
    return step if step > 0 else None


def _raw_dtype(first: DicomFile) -> np.dtype:
    """The decoded dtype, learned from the first frame (this also proves the file decodes)."""
    return first.decode(0).dtype


def _plain_meta(ds: Any) -> dict[str, Any]:
    """Non-identifying descriptive attributes."""
    keys = (
        "Modality",
        "SOPClassUID",
        "SeriesInstanceUID",
        "SeriesNumber",
        "SeriesDescription",
        "StudyDescription",
        "Manufacturer",
        "ManufacturerModelName",
        "ImageType",
        "PhotometricInterpretation",
        "BitsAllocated",
        "BitsStored",
        "PixelRepresentation",
        "ContainerIdentifier",
        "DimensionOrganizationType",
        "SliceThickness",
    )
    meta: dict[str, Any] = {}
    for key in keys:
        value = ds.get(key)
        if value is None or value == "":
            continue
        if key == "SOPClassUID":
            meta["SOPClass"] = getattr(value, "name", str(value))
        if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
            value = [str(v) for v in value]
        elif not isinstance(value, (int, float)):
            value = str(value)
        meta[key] = value
    return meta


def _frame_axis(ds: Any, nframes: int) -> tuple[str, float | None, str | None, list[float] | None]:
    """Label, scale and unit of a multi-frame object's frame axis (see module docstring)."""
    offsets = ds.get("GridFrameOffsetVector")
    if offsets is not None and len(offsets) == nframes:
        return "z", _uniform_spacing(float(v) for v in offsets), MILLIMETER, None
    normal = _normal(ds)
    if normal is not None and ds.get("PerFrameFunctionalGroupsSequence"):
        pos = []
        for i in range(nframes):
            item = _frame_groups(ds, i, "PlanePositionSequence")
            ipp = getattr(item, "ImagePositionPatient", None) if item is not None else None
            if ipp is None or len(ipp) != 3:
                break
            pos.append(float(np.dot(normal, np.asarray(ipp, float))))
        if len(pos) == nframes and len(set(np.round(pos, 4))) == nframes:
            return "z", _uniform_spacing(pos), MILLIMETER, pos
    if "FrameTime" in ds or "FrameTimeVector" in ds:
        ft = ds.get("FrameTime")
        return "t", (float(ft) if ft else None), (MILLISECOND if ft else None), None
    return "i", None, None, None


def _single_layout(dfile: DicomFile) -> tuple[FrameLayout, tuple, tuple, dict[str, Any]]:
    ds, n = dfile.ds, dfile.nframes
    rescale = _rescale(ds, n)
    identity = all(s == 1 and i == 0 for s, i in rescale)
    row_sp, col_sp = _pixel_spacing(ds)
    meta = _plain_meta(ds)
    if n > 1:
        label, fscale, funit, positions = _frame_axis(ds, n)
        order = list(range(n))
        if positions is not None:  # present enhanced slices in position order
            order = sorted(range(n), key=lambda i: positions[i])
            meta["frame_order"] = order if order != list(range(n)) else "stored"
        lead_labels, lead_shape = (label,), (n,)
        grid = np.asarray(order, dtype=np.int64).reshape(n, 1, 1)
        scale, unit = (fscale,), (funit if fscale else None,)
    else:
        lead_labels, lead_shape, grid, scale, unit = (), (), np.zeros((1, 1), np.int64), (), ()
    layout = FrameLayout(
        lead_labels,
        lead_shape,
        (dfile.rows, dfile.cols),
        (dfile.rows, dfile.cols),
        dfile.samples,
        grid,
        [(dfile, i) for i in range(n)],
        None if identity else rescale,
        _raw_dtype(dfile),
    )
    scale += (row_sp, col_sp)
    unit += tuple(MILLIMETER if s else None for s in (row_sp, col_sp))
    if dfile.samples > 1:
        scale, unit = scale + (None,), unit + (None,)
    meta.update(_value_meta(rescale, identity, layout, dfile))
    return layout, scale, unit, meta


def _value_meta(
    rescale: list[tuple[float, float]], identity: bool, layout: FrameLayout, dfile: DicomFile
) -> dict[str, Any]:
    meta: dict[str, Any] = {"transfer_syntax": dfile.transfer_syntax.name, "stored_dtype": layout.raw_dtype.str}
    if not identity:
        distinct = sorted(set(rescale))
        meta["rescale"] = (
            {"slope": distinct[0][0], "intercept": distinct[0][1]}
            if len(distinct) == 1
            else {"per_frame": True, "distinct": [list(p) for p in distinct[:16]]}
        )
    return meta


def _wsi_layout(files: list[DicomFile]) -> tuple[FrameLayout, tuple, tuple, dict[str, Any]]:
    """A WSI level from one instance or a concatenation (frames in concatenation order)."""
    files = sorted(files, key=lambda f: int(f.ds.get("ConcatenationFrameOffsetNumber", 0) or 0))
    first = files[0]
    ds = first.ds
    H, W = int(ds.TotalPixelMatrixRows), int(ds.TotalPixelMatrixColumns)
    th, tw = first.rows, first.cols
    nty, ntx = -(-H // th), -(-W // tw)
    frames = [(f, i) for f in files for i in range(f.nframes)]
    organization = str(ds.get("DimensionOrganizationType", "") or "")
    n_paths = int(ds.get("NumberOfOpticalPaths", 1) or 1)
    n_focal = int(ds.get("TotalPixelMatrixFocalPlanes", 1) or 1)
    if organization == "TILED_FULL" or ("PerFrameFunctionalGroupsSequence" not in ds and len(files) == 1):
        per_plane = nty * ntx
        if len(frames) < per_plane * n_paths * n_focal:
            n_paths = n_focal = 1  # header promises more planes than are stored: keep what is there
        grid = np.full((n_paths, n_focal, nty, ntx), -1, np.int64)
        for k in range(min(len(frames), per_plane * n_paths * n_focal)):
            p, rem = divmod(k, per_plane * n_focal)
            z, t = divmod(rem, per_plane)
            grid[p, z, t // ntx, t % ntx] = k
    else:  # TILED_SPARSE: positions from the per-frame functional groups
        entries = []
        for k, (f, i) in enumerate(frames):
            pos = _frame_groups(f.ds, i, "PlanePositionSlideSequence")
            if pos is None or "RowPositionInTotalImagePixelMatrix" not in pos:
                raise UnreadableSource(f.path, f"WSI frame {i} has no Plane Position (Slide)")
            r, c = int(pos.RowPositionInTotalImagePixelMatrix) - 1, int(pos.ColumnPositionInTotalImagePixelMatrix) - 1
            if r % th or c % tw:
                raise UnreadableSource(f.path, f"WSI frame {i} at ({r}, {c}) is not on the {th}x{tw} tile grid")
            z = float(getattr(pos, "ZOffsetInSlideCoordinateSystem", 0.0) or 0.0)
            op = _frame_groups(f.ds, i, "OpticalPathIdentificationSequence")
            path_id = str(getattr(op, "OpticalPathIdentifier", "")) if op is not None else ""
            entries.append((k, path_id, z, r // th, c // tw))
        paths = sorted({e[1] for e in entries})
        zs = sorted({e[2] for e in entries})
        n_paths, n_focal = len(paths), len(zs)
        grid = np.full((n_paths, n_focal, nty, ntx), -1, np.int64)
        for k, pid, z, ty, tx in entries:
            if ty < nty and tx < ntx:
                grid[paths.index(pid), zs.index(z), ty, tx] = k
    lead_labels, keep = [], []
    for axis, (label, n) in enumerate((("c", n_paths), ("z", n_focal))):
        if n > 1:
            lead_labels.append(label)
            keep.append(axis)
    grid = grid.reshape(tuple(grid.shape[a] for a in keep) + (nty, ntx)) if keep else grid[0, 0]
    layout = FrameLayout(
        tuple(lead_labels),
        tuple(grid.shape[:-2]),
        (H, W),
        (th, tw),
        first.samples,
        grid,
        frames,
        None,
        _raw_dtype(first),
    )
    row_sp, col_sp = _pixel_spacing(ds)
    scale = (None,) * len(lead_labels) + (row_sp, col_sp) + ((None,) if first.samples > 1 else ())
    unit = tuple(MILLIMETER if s else None for s in scale)
    meta = _plain_meta(ds)
    meta.update(_value_meta([(1.0, 0.0)], True, layout, first))
    meta.update(
        wsi_total_pixel_matrix=[H, W],
        wsi_tile=[th, tw],
        wsi_frames=len(frames),
        wsi_missing_tiles=int((grid < 0).sum()),
    )
    if len(files) > 1:
        meta["concatenation_files"] = [f.path.name for f in files]
    return layout, scale, unit, meta


def _tensor_from_file(dfile: DicomFile) -> TensorAdapter:
    layout, scale, unit, meta = _wsi_layout([dfile]) if dfile.is_wsi else _single_layout(dfile)
    return normalize_axes(DicomAdapter(dfile.path, layout, scale, unit, meta))


# ---- sources ----------------------------------------------------------------------------------
class DicomFileSource(SourceAdapter):
    """One DICOM file (``.dcm``): field ``data``."""

    format_name = "dicom"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        force = path.name.lower().endswith((".dcm", ".dicom"))
        dfile = _parse_or_raise(path, force=force)
        tensor = _tensor_from_file(dfile)
        super().__init__(path, {"data": tensor}, metadata=dict(tensor.metadata))


def _parse_or_raise(path: Path, *, force: bool = False) -> DicomFile:
    try:
        return DicomFile.parse(path, force=force)
    except UnreadableSource:
        raise
    except Exception as exc:  # InvalidDicomError, EOFError, struct.error, ...
        raise UnreadableSource(path, f"not a readable DICOM file: {type(exc).__name__}: {exc}") from exc


class DicomFolderSource(SourceAdapter):
    """A folder of DICOM files: each series of single-frame slices becomes one z-stack
    (DicomSeriesAdapter); a whole-slide pyramid becomes its largest VOLUME level with the
    smaller ones as native levels, plus thumbnail/label/overview fields; any other multi-frame
    file is a field of its own. Sub-folders and files without the DICM preamble are ignored."""

    format_name = "dicom-series"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        files = []
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            if not _has_dicm(Path(entry.path)):
                continue
            try:
                files.append(DicomFile.parse(Path(entry.path)))
            except Exception:  # a DICOMDIR, a structured report, a damaged file: not an image
                continue
        if not files:
            raise UnreadableSource(path, "folder holds no readable DICOM image")
        tensors: dict[str, TensorAdapter] = {}
        wsi = [f for f in files if f.is_wsi]
        slices = [f for f in files if not f.is_wsi and f.nframes == 1]
        others = [f for f in files if not f.is_wsi and f.nframes > 1]
        for name, tensor in _series_tensors(path, slices):
            tensors[_unique(tensors, name)] = tensor
        for name, tensor in _wsi_tensors(wsi):
            tensors[_unique(tensors, name)] = tensor
        for f in others:
            tensors[_unique(tensors, _safe(f.path.stem))] = _tensor_from_file(f)
        if not tensors:
            raise UnreadableSource(path, "folder holds no readable DICOM image")
        if len(tensors) == 1:
            tensors = {"data": next(iter(tensors.values()))}
        first = next(iter(tensors.values()))
        super().__init__(path, tensors, metadata=dict(first.metadata, fields=list(tensors)))


def _safe(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_")
    return out or "image"


def _unique(existing: dict[str, Any], name: str) -> str:
    if name not in existing:
        return name
    for k in itertools.count(2):
        if f"{name}_{k}" not in existing:
            return f"{name}_{k}"
    raise AssertionError  # pragma: no cover


def _series_tensors(folder: Path, slices: list[DicomFile]) -> list[tuple[str, TensorAdapter]]:
    groups: dict[tuple, list[DicomFile]] = {}
    for f in slices:
        ds = f.ds
        normal = _normal(ds)
        key = (
            str(ds.get("SeriesInstanceUID", "")),
            f.rows,
            f.cols,
            f.samples,
            int(ds.get("BitsAllocated", 0) or 0),
            int(ds.get("PixelRepresentation", 0) or 0),
            None if normal is None else tuple(np.round(normal, 3)),
        )
        groups.setdefault(key, []).append(f)
    out = []
    for members in sorted(groups.values(), key=lambda m: -len(m)):
        tensor = _series_tensor(folder, members)
        ds = members[0].ds
        number = ds.get("SeriesNumber")
        name = f"series{number}" if number not in (None, "") else "series"
        out.append((_safe(name), tensor))
    return out


def _series_tensor(folder: Path, members: list[DicomFile]) -> TensorAdapter:
    normal = _normal(members[0].ds)
    positions: list[float] | None = None
    if normal is not None:
        positions = []
        for f in members:
            ipp = f.ds.get("ImagePositionPatient")
            if ipp is None or len(ipp) != 3:
                positions = None
                break
            positions.append(float(np.dot(normal, np.asarray(ipp, float))))

    def instance(f: DicomFile) -> int:
        try:
            return int(f.ds.get("InstanceNumber") or 0)
        except (TypeError, ValueError):
            return 0

    if positions is not None and len(set(np.round(positions, 4))) == len(members):
        order = sorted(range(len(members)), key=lambda i: (positions[i], instance(members[i])))
        sorted_by, zstep = "ImagePositionPatient", _uniform_spacing(positions)
    else:
        order = sorted(range(len(members)), key=lambda i: (instance(members[i]), members[i].path.name))
        sorted_by = "InstanceNumber"
        zstep = None
        for kw in ("SpacingBetweenSlices", "SliceThickness"):
            try:
                zstep = float(members[0].ds.get(kw) or 0) or None
            except (TypeError, ValueError):
                zstep = None
            if zstep:
                break
    members = [members[i] for i in order]
    rescale = [_rescale(f.ds, 1)[0] for f in members]
    identity = all(s == 1 and i == 0 for s, i in rescale)
    first = members[0]
    n = len(members)
    layout = FrameLayout(
        ("z",),
        (n,),
        (first.rows, first.cols),
        (first.rows, first.cols),
        first.samples,
        np.arange(n, dtype=np.int64).reshape(n, 1, 1),
        [(f, 0) for f in members],
        None if identity else rescale,
        _raw_dtype(first),
    )
    row_sp, col_sp = _pixel_spacing(first.ds)
    scale = (zstep, row_sp, col_sp) + ((None,) if first.samples > 1 else ())
    unit = tuple(MILLIMETER if s else None for s in scale)
    meta = _plain_meta(first.ds)
    meta.update(_value_meta(rescale, identity, layout, first))
    meta.update(slices=n, sorted_by=sorted_by, files=[f.path.name for f in members])
    return normalize_axes(DicomSeriesAdapter(folder, layout, scale, unit, meta))


def _wsi_tensors(files: list[DicomFile]) -> list[tuple[str, TensorAdapter]]:
    """Largest VOLUME level as ``volume`` with smaller VOLUME levels of integer ratio as its
    native levels; other VOLUME sizes, thumbnails, labels and overviews as their own fields."""
    if not files:
        return []
    levels: dict[tuple, list[DicomFile]] = {}
    for f in files:
        itype = [str(v).upper() for v in (f.ds.get("ImageType") or [])]
        flavour = itype[2] if len(itype) > 2 else "VOLUME"
        concat = str(f.ds.get("ConcatenationUID", "") or f.ds.get("SOPInstanceUID", "") or f.path.name)
        levels.setdefault((flavour, concat), []).append(f)
    built = []
    for (flavour, _), members in levels.items():
        layout, scale, unit, meta = _wsi_layout(members)
        meta["wsi_image_flavour"] = flavour
        paths = [m.path for m in members]
        built.append((flavour, DicomAdapter(members[0].path, layout, scale, unit, meta, content_paths=paths)))
    volumes = sorted((t for fl, t in built if fl == "VOLUME"), key=lambda t: -np.prod(t.shape))
    out: list[tuple[str, TensorAdapter]] = []
    if volumes:
        base = volumes[0]
        rest = []
        for lvl in volumes[1:]:
            scale = _level_scale(base, lvl)
            if scale is None:
                rest.append(lvl)
            else:
                base.native_levels.append(NativeLevel(scale, lvl))
        base.native_levels.sort(key=lambda lv: lv.scale)
        out.append(("volume", normalize_axes(base)))
        out += [
            (f"volume_{lvl.shape[-3] if lvl.layout.samples > 1 else lvl.shape[-2]}", normalize_axes(lvl))
            for lvl in rest
        ]
    for flavour, t in built:
        if flavour != "VOLUME":
            out.append((_safe(flavour.lower()), normalize_axes(t)))
    return out


def _level_scale(base: DicomAdapter, level: DicomAdapter) -> tuple[int, ...] | None:
    """Integer downsampling factors of ``level`` against ``base`` when the planes agree on
    everything but Y/X and each Y/X factor reproduces the level's size."""
    if (
        base.dim_labels != level.dim_labels
        or base.shape[: len(base.layout.lead_shape)] != level.shape[: len(level.layout.lead_shape)]
    ):
        return None
    nlead = len(base.layout.lead_shape)
    factors = []
    for axis in (nlead, nlead + 1):
        big, small = base.shape[axis], level.shape[axis]
        f = round(big / small)
        if f < 2 or small not in (big // f, -(-big // f)):
            return None
        factors.append(f)
    return (1,) * nlead + tuple(factors) + ((1,) if base.layout.samples > 1 else ())


# ---- sniffing ---------------------------------------------------------------------------------
def sniff_dicom(path: Path, head: bytes) -> bool:
    """The DICOM File Format preamble: "DICM" at byte 128."""
    return head[128:132] == b"DICM"


def _has_dicm(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return sniff_dicom(path, fh.read(132))
    except OSError:
        return False


def sniff_dicom_folder(path: Path, head: bytes) -> bool:
    """A folder whose first few files (at most 8 looked at, 132 bytes read from each, within
    the first 64 entries) are mostly DICOM. Series membership is sorted out by the opener, not here: sniffing stays cheap."""
    if not path.is_dir():
        return False
    checked = hits = seen = 0
    with os.scandir(path) as it:
        for entry in it:
            seen += 1
            if seen > 8 * _FOLDER_SNIFF_FILES:  # a folder of folders: not a flat DICOM series
                break
            if entry.name.startswith(".") or not entry.is_file():
                continue
            checked += 1
            hits += _has_dicm(Path(entry.path))
            if checked >= _FOLDER_SNIFF_FILES:
                break
    return hits > 0 and hits * 4 >= checked * 3


register_format(
    FormatEntry(
        name="dicom",
        opener=DicomFileSource,
        sniff=sniff_dicom,
        extensions=(".dcm", ".dicom"),
        priority=65,
        description="DICOM file: single/multi-frame image or a whole-slide level (pydicom)",
    )
)
register_format(
    FormatEntry(
        name="dicom-series",
        opener=DicomFolderSource,
        sniff=sniff_dicom_folder,
        priority=40,
        folders=True,
        files=False,
        description="folder of DICOM files: series stacked along z, WSI levels (pydicom)",
    )
)
