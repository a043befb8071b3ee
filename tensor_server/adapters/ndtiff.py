"""NDTiff datasets (Micro-Manager 2.0, pycro-manager, Magellan), versions 2 and 3.

A dataset folder holds ``NDTiff.index`` and ``*_NDTiffStack*.tif`` files; a multi-resolution
(Magellan / tiled) dataset holds ``Full resolution/`` and ``Downsampled_xN/`` folders, each
such a level. The index is a sequence of entries, one per image, little-endian::

    uint32 n, n bytes of JSON axes ({"time": 3, "channel": "DAPI", "row": 1, "column": 2})
    uint32 m, m bytes of the data file's name
    uint32 pixel offset, int32 width, int32 height, int32 pixel type, int32 compression,
    uint32 metadata offset, int32 metadata length, int32 metadata compression

Why not the ``ndtiff`` package: the index above is all a reader needs (the pixels are raw,
uncompressed, at the given offset), so parsing it here is ~40 lines, adds no dependency (the
package pulls in dask), keeps every read a plain ``pread`` we control, and sidesteps the
package's own failures (ndtiff 3.1.0 ``as_array()`` fails on the Magellan sample). tifffile
also reads NDTiff through the index; it serves as the independent reference in the tests.

Axes: ``time`` -> t, ``channel`` -> c, ``z`` -> z, ``position`` -> p, others by name (see
tiff_sequence.axis_label_for) or a spare letter. Integer axis values span min..max (absent
images read as zeros); string values (channel names) are categories in acquisition order,
listed in the metadata. Axes with one value are dropped (as tifffile and ndtiff do).

Tiled datasets (``row``/``column`` axes) are served stitched into one y/x mosaic, the way
Magellan and NDViewer show them: tile (row, column) covers ``[(row - min_row) * (h - overlap),
...)`` and, at full resolution, each tile gives up ``floor(overlap/2)`` pixels at its start and
``ceil(overlap/2)`` at its end (``GridPixelOverlapX/Y`` of the summary metadata; the ndtiff
package's stitching convention). Missing tiles read as zeros.

Downsampled levels are not offered as native levels. Magellan computes ``Downsampled_xN`` in
its own global tile grid: a level tile (R, C) covers full-resolution pixels
``[R * (h - overlap) * N, ...)`` of a grid whose origin is row/column 0, not the first
acquired tile, so a level lines up with the served mosaic only when the mosaic's origin
(``min_row * (h - overlap)``) is a multiple of N; in the sample it is 341 (odd), and its x4/x8
levels also hold tiles outside the full-resolution footprint. A level that is not a pyramid of
the served tensor would show different pixels at different zooms, so the server computes
levels on demand instead; the folders are listed in the metadata and each opens on its own.

Read granularity: NDTiff images are raw and uncompressed at the index's offset, so a window
costs its own rows (``read_block_shape`` None) and nearest decimates by skipping images and
striding rows (TiffPlaneGridAdapter). The design doc's "the dask block" is the reference
server's ndtiff-package route; there is no dask here.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._tiff_planes import FileLayout, TiffPlaneGridAdapter, axis_label_for, unique_label
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import file_content_version, file_stat_stamp
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER
from tensor_server.errors import UnreadableSource

__all__ = ["NdTiffAdapter", "NdTiffSource", "read_ndtiff_index"]

INDEX_NAME = "NDTiff.index"
FULL_RESOLUTION = "Full resolution"
_NDTIFF_MAGIC = 483729  # uint32 at byte 8 of an NDTiff data file
#: pixel type -> (dtype, samples, bits)
_PIXEL_TYPES = {
    0: ("<u1", 1, 8),
    1: ("<u2", 1, 16),
    2: ("<u1", 3, 8),
    3: ("<u2", 1, 10),
    4: ("<u2", 1, 12),
    5: ("<u2", 1, 14),
    6: ("<u2", 1, 11),
}
_AXIS_LABELS = {"time": "t", "channel": "c", "z": "z", "position": "p"}
_ENTRY_TAIL = struct.Struct("<IiiiiIii")
#: held while a level looks for growth: two looks would publish one growth twice
_LOOKING = threading.Lock()


class NdTiffAdapter(TiffPlaneGridAdapter):
    """One NDTiff resolution level: images (or stitched tiles) read raw at the index's offsets.

    A live acquisition (Micro-Manager, pycro-manager) appends each image's pixels to a data
    file and then its entry to the index, so the index says which images are on disk. A look
    (``refresh_extent``: one stat of the index, the level read again only when it changed)
    takes new entries in place when they extend one grid axis and leave every image already
    published where it was: the content version, the chunk ids and the cached chunks of those
    images stay valid. Anything else (an image re-acquired or filled in, another plane size,
    an axis that appears, shrinks or a second one that grows) is not growth: the source is
    reopened. Data files are written by appending (Micro-Manager pre-allocates them and never
    rewrites an image in place), so a data file that grew is not stale; one replaced or
    shortened is.
    """

    #: the level folder and its downsampling, set by ``open_ndtiff_level`` (growth reads it again)
    folder: Path | None = None
    factor = 1
    #: the index's stat stamp when the level was read
    index_stamp: tuple[int, ...] | None = None
    #: the growing grid axis, once the level has grown
    growth_axis: int | None = None

    def growth_paths(self) -> tuple[Path, ...]:
        return () if self.folder is None else (self.folder,)

    def stale_reason(self, bounds: Bounds, exact: bool = False) -> str | None:
        """A data file replaced (another inode) or shortened since it was read; one appended to
        is not (class docstring)."""
        for i in self._files_under(bounds):
            try:
                st = os.stat(self._files[i])
            except OSError:
                return f"{os.path.basename(self._files[i])} was removed since it was opened"
            ino, size = self._appended[i]
            if st.st_ino != ino or st.st_size < size:
                return f"{os.path.basename(self._files[i])} was rewritten since it was opened"
        return None

    @cached_property
    def _appended(self) -> list[tuple[int, int]]:
        """(inode, size) of each data file when the level was read."""
        return [(st.st_ino, st.st_size) for st in map(os.stat, self._files)]

    def refresh_extent(self) -> str | None:
        """Take new index entries in place when they are growth (class docstring)."""
        if self.folder is None:
            return None
        try:
            if file_stat_stamp(os.stat(self.folder / INDEX_NAME)) == self.index_stamp:
                return None
        except FileNotFoundError:
            return f"{INDEX_NAME} is gone"
        with _LOOKING:
            try:
                fresh = open_ndtiff_level(self.folder, self.factor)
            except UnreadableSource as exc:
                return f"{INDEX_NAME} changed and no longer reads: {exc}"
            why = self._not_growth(fresh)
            if why is not None:
                return why
            self._adopt(fresh)
            self.index_stamp = fresh.index_stamp
        return None

    def _not_growth(self, fresh: NdTiffAdapter) -> str | None:
        old, new = self.shape, fresh.shape
        if (fresh.dim_labels, fresh.dtype, new[self._ngrid :]) != (self.dim_labels, self.dtype, old[self._ngrid :]):
            return f"the images changed: {list(self.dim_labels)} {list(old)} -> {list(fresh.dim_labels)} {list(new)}"
        grown = [a for a in range(self._ngrid) if new[a] != old[a]]
        if (
            any(new[a] < old[a] for a in grown)
            or len(grown) > 1
            or (grown and self.growth_axis not in (None, grown[0]))
        ):
            return f"the images changed in another way than growing along one axis ({list(old)} -> {list(new)})"
        region = tuple(slice(0, n) for n in old[: self._ngrid])
        if not np.array_equal(self._placements(region), fresh._placements(region)):
            return "an image already published was re-acquired or filled in"
        return None

    def _placements(self, region: tuple[slice, ...]) -> np.ndarray:
        """(file name, offset) of each image in ``region`` of the grid, as strings ("" absent)."""
        files, planes = self._file_index[region], self._plane_index[region]
        out = np.full(files.shape, "", dtype=object)
        for f in np.unique(files[files >= 0]):
            at = files == f
            offsets = self._layouts[int(f)].offsets[planes[at]]
            out[at] = [f"{os.path.basename(self._files[int(f)])}@{o}" for o in offsets]
        return out

    def _adopt(self, fresh: NdTiffAdapter) -> None:
        """Take ``fresh``'s images up to its last complete step along the growing axis (the
        files first: the ones known keep their numbers, as the index lists them in the order
        written) and publish that extent."""
        grown = [a for a in range(self._ngrid) if fresh.shape[a] > self.shape[a]]
        if not grown:
            return
        axis = grown[0]
        extent = self._complete(fresh, axis)
        if extent <= self.shape[axis]:
            return  # the newest step is still being acquired: looked at again when the index changes
        cut = (slice(None),) * axis + (slice(0, extent),)
        self._files, self._stamps, self._layouts = fresh._files, fresh._stamps, fresh._layouts
        self.__dict__["_appended"] = fresh._appended
        self._file_index, self._plane_index = fresh._file_index[cut], fresh._plane_index[cut]
        self.growth_axis = axis
        self.info = replace(self.info, metadata=fresh.info.metadata)
        self.grow_to(self.shape[:axis] + (extent,) + self.shape[axis + 1 :])

    def _complete(self, fresh: NdTiffAdapter, axis: int) -> int:
        """How far along ``axis`` every step holds at least the images of the first step: a
        time point whose other channels are not written yet would read them as zeros."""
        first = np.take(fresh._file_index, 0, axis=axis) >= 0
        for k in range(self.shape[axis], fresh.shape[axis]):
            if not (np.take(fresh._file_index, k, axis=axis) >= 0)[first].all():
                return k
        return fresh.shape[axis]


def read_ndtiff_index(
    path: str | os.PathLike[str],
) -> tuple[list[tuple[dict[str, Any], str, int, int, int, int, int]], bool]:
    """Entries ``(axes, file name, offset, width, height, pixel type, compression)`` and
    whether the file ended inside an entry (an acquisition still writing: that last entry is
    dropped). Garbage inside an entry raises UnreadableSource."""
    data = Path(path).read_bytes()
    entries = []
    pos, end = 0, len(data)
    while pos < end:
        try:
            if pos + 4 > end:
                return entries, True
            (n,) = struct.unpack_from("<I", data, pos)
            if pos + 4 + n + 4 > end:
                return entries, True
            axes = json.loads(data[pos + 4 : pos + 4 + n].decode("utf-8"))
            pos += 4 + n
            (m,) = struct.unpack_from("<I", data, pos)
            if pos + 4 + m + _ENTRY_TAIL.size > end:
                return entries, True
            name = data[pos + 4 : pos + 4 + m].decode("utf-8")
            pos += 4 + m
            offset, width, height, ptype, compression, _, _, _ = _ENTRY_TAIL.unpack_from(data, pos)
            pos += _ENTRY_TAIL.size
        except (ValueError, UnicodeDecodeError, struct.error) as exc:
            raise UnreadableSource(path, f"corrupt NDTiff index entry at byte {pos}: {exc}") from None
        if not isinstance(axes, dict) or not name or os.path.basename(name) != name or width <= 0 or height <= 0:
            raise UnreadableSource(path, f"corrupt NDTiff index entry at byte {pos - _ENTRY_TAIL.size}")
        entries.append((axes, name, offset, width, height, ptype, compression))
    return entries, False


def _axis_values(values: list[Any]) -> tuple[dict[Any, int], list[Any]]:
    """Value -> index along an axis: integers span min..max, anything else is a category in
    order of first appearance."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo, hi = min(values), max(values)
        return {v: v - lo for v in range(lo, hi + 1)}, list(range(lo, hi + 1))
    order: dict[Any, int] = {}
    for v in values:
        order.setdefault(str(v), len(order))
    return order, list(order)


def _summary(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Summary metadata and version of an NDTiff data file (tifffile parses the header)."""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            mm = tif.micromanager_metadata or {}
    except Exception:  # the pixels do not depend on it; the size check below names bad files
        return {}, {}
    version = {k: mm[k] for k in ("MajorVersion", "MinorVersion") if k in mm}
    return dict(mm.get("Summary") or {}), version


def open_ndtiff_level(folder: Path, factor: int = 1) -> NdTiffAdapter:
    """The level in ``folder`` (holding NDTiff.index); ``factor`` is its downsampling
    (``Downsampled_xN``), 1 for full resolution."""
    index_path = folder / INDEX_NAME
    try:
        stamp = file_stat_stamp(os.stat(index_path))
    except OSError as exc:
        raise UnreadableSource(index_path, f"cannot stat the index: {exc.strerror}") from None
    entries, truncated_tail = read_ndtiff_index(index_path)
    if not entries:
        raise UnreadableSource(index_path, "the NDTiff index lists no images")
    first = entries[0]
    width, height, ptype = first[3], first[4], first[5]
    for _axes, name, _, w, h, pt, comp in entries:
        if comp != 0:
            raise UnreadableSource(folder / name, f"NDTiff pixel compression {comp} is not supported")
        if (w, h, pt) != (width, height, ptype):
            raise UnreadableSource(
                index_path, f"images differ in size or pixel type ({w}x{h} type {pt} vs {width}x{height} type {ptype})"
            )
    if ptype not in _PIXEL_TYPES:
        raise UnreadableSource(index_path, f"unknown NDTiff pixel type {ptype}")
    dtype_str, samples, bits = _PIXEL_TYPES[ptype]
    dtype = np.dtype(dtype_str)
    plane_shape = (height, width) + ((samples,) if samples > 1 else ())
    plane_labels = ["y", "x"] + (["s"] if samples > 1 else [])
    nbytes = height * width * samples * dtype.itemsize

    # axes in order of first appearance; a missing key in an entry counts as 0
    names: dict[str, None] = {}
    for axes, *_ in entries:
        names.update(dict.fromkeys(axes))
    values = {n: [e[0].get(n, 0) for e in entries] for n in names}
    mapping = {n: _axis_values(v) for n, v in values.items()}
    tiled = "row" in names or "column" in names
    grid_names = [n for n in names if n not in ("row", "column") and len(mapping[n][1]) > 1]
    used: set[str] = set()
    grid_labels = [unique_label(_AXIS_LABELS.get(n) or axis_label_for(n), used) for n in grid_names]
    grid_shape = tuple(len(mapping[n][1]) for n in grid_names)
    rows = mapping["row"] if "row" in names else ({0: 0}, [0])
    cols = mapping["column"] if "column" in names else ({0: 0}, [0])
    tile_counts = (len(rows[1]), len(cols[1])) + ((1,) if samples > 1 else ())

    summary, version = _summary(folder / first[1])
    extent, crop = list(plane_shape), [0] * len(plane_shape)
    if tiled and factor == 1:  # full resolution tiles keep their overlap; levels do not
        for ax, key in ((0, "GridPixelOverlapY"), (1, "GridPixelOverlapX")):
            ov = int(summary.get(key) or 0)
            if 0 < ov < plane_shape[ax]:
                extent[ax], crop[ax] = plane_shape[ax] - ov, ov // 2

    files: dict[str, int] = {}
    offsets: list[list[int]] = []
    file_index = np.full(grid_shape + tile_counts, -1, dtype=np.int64)
    plane_index = np.zeros(grid_shape + tile_counts, dtype=np.int64)
    sizes: dict[str, int] = {}
    for axes, name, offset, *_ in entries:
        if name not in sizes:
            try:
                sizes[name] = os.stat(folder / name).st_size
            except OSError as exc:
                raise UnreadableSource(
                    folder / name, f"data file listed in the index is missing: {exc.strerror}"
                ) from None
        if offset <= 0 or offset + nbytes > sizes[name]:
            raise UnreadableSource(
                folder / name,
                f"truncated: image {axes} needs bytes {offset}..{offset + nbytes}, the file has {sizes[name]}",
            )
        f = files.setdefault(name, len(files))
        if f == len(offsets):
            offsets.append([])
        key = tuple(mapping[n][0][_key(axes.get(n, 0), mapping[n])] for n in grid_names)
        key += (rows[0][_key(axes.get("row", 0), rows)], cols[0][_key(axes.get("column", 0), cols)])
        key += (0,) * (samples > 1)
        file_index[key] = f  # a re-acquired image (same axes) replaces the earlier one
        plane_index[key] = len(offsets[f])
        offsets[f].append(offset)

    paths = [str(folder / n) for n in files]
    layouts = {f: FileLayout(dtype, np.asarray(offs, dtype=np.int64)) for f, offs in enumerate(offsets)}
    pixel = _positive(summary.get("PixelSize_um"))
    zstep = _positive(summary.get("z-step_um"))
    labels = grid_labels + plane_labels
    scale = [pixel * factor if pixel and d in ("y", "x") else zstep if d == "z" else None for d in labels]
    metadata: dict[str, Any] = {
        "layout": "NDTiff",
        **version,
        "bit_depth": bits,
        "axes": {lab: {"name": n, "values": mapping[n][1]} for lab, n in zip(grid_labels, grid_names)},
        "constant_axes": {n: mapping[n][1][0] for n in names if n not in grid_names and n not in ("row", "column")},
        "missing_images": int((file_index < 0).sum()),
    }
    if tiled:
        metadata["tiles"] = {
            "rows": rows[1],
            "columns": cols[1],
            "tile_shape": [height, width],
            "overlap": [plane_shape[0] - extent[0], plane_shape[1] - extent[1]],
        }
    if truncated_tail:
        metadata["index_tail_ignored"] = "the index ends inside an entry (acquisition still writing?)"
    if "channel" in grid_names:
        metadata["channel_names"] = [str(v) for v in mapping["channel"][1]]
    level = NdTiffAdapter(
        files=paths,
        file_index=file_index,
        plane_index=plane_index,
        grid_labels=grid_labels,
        plane_labels=plane_labels,
        plane_shape=plane_shape,
        stored_dtype=dtype,
        layouts=layouts,
        tile_extent=extent,
        tile_crop=crop,
        physical_scale=scale if any(s is not None for s in scale) else None,
        physical_unit=[None if s is None else MICROMETER for s in scale] if any(s is not None for s in scale) else None,
        content_version=file_content_version(index_path, *paths),
        metadata=metadata,
    )
    level.folder, level.factor, level.index_stamp = folder, factor, stamp
    level._appended  # noqa: B018 - the data files' (inode, size) as read, before any grows
    return level


def _key(value: Any, mapping: tuple[dict[Any, int], list[Any]]) -> Any:
    return value if value in mapping[0] else str(value)


def _positive(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _level_factor(folder: Path) -> int:
    name = folder.name
    if name.startswith("Downsampled_x"):
        try:
            return max(1, int(name[len("Downsampled_x") :]))
        except ValueError:
            return 1
    return 1


class NdTiffSource(SourceAdapter):
    """An NDTiff dataset folder, one of its level folders, or one of its data files."""

    format_name = "ndtiff"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        folder = path.parent if path.is_file() else path
        levels: list[str] = []
        if (folder / INDEX_NAME).is_file():
            level_folder = folder
        elif (folder / FULL_RESOLUTION / INDEX_NAME).is_file():
            level_folder = folder / FULL_RESOLUTION
            levels = sorted(
                (
                    p.name
                    for p in folder.iterdir()
                    if p.is_dir() and (p / INDEX_NAME).is_file() and p.name != FULL_RESOLUTION
                ),
                key=lambda n: _level_factor(Path(n)),
            )
        else:
            raise UnreadableSource(path, f"no {INDEX_NAME} (nor {FULL_RESOLUTION}/{INDEX_NAME})")
        tensor = open_ndtiff_level(level_folder, _level_factor(level_folder))
        if levels:
            tensor.metadata["downsampled_levels_not_served"] = levels
        name = folder.name if level_folder == folder else level_folder.parent.name
        super().__init__(path, {name or "image": normalize_axes(tensor)}, metadata={"ndtiff": tensor.metadata})


def sniff_ndtiff_folder(path: Path, head: bytes) -> bool:
    return path.is_dir() and ((path / INDEX_NAME).is_file() or (path / FULL_RESOLUTION / INDEX_NAME).is_file())


def sniff_ndtiff_file(path: Path, head: bytes) -> bool:
    """An NDTiff data file: TIFF header, then the NDTiff magic at byte 8, with its index beside it."""
    return (
        len(head) >= 12
        and head[:4] == b"II*\x00"
        and struct.unpack_from("<I", head, 8)[0] == _NDTIFF_MAGIC
        and (path.parent / INDEX_NAME).is_file()
    )


register_format(
    FormatEntry(
        name="ndtiff",
        opener=NdTiffSource,
        sniff=sniff_ndtiff_folder,
        priority=30,
        folders=True,
        files=False,
        description="NDTiff dataset folder (Micro-Manager 2, pycro-manager, Magellan)",
    )
)
register_format(
    FormatEntry(
        name="ndtiff-file",
        opener=NdTiffSource,
        sniff=sniff_ndtiff_file,
        priority=55,
        folders=False,
        files=True,
        description="one NDTiff data file, opened as its dataset (the folder's NDTiff.index)",
    )
)
