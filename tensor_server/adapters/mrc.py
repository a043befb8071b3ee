"""MRC / CCP4 maps (cryo-EM volumes, image stacks, tomograms) through ``mrcfile``'s memmap.

Why a memmap: an MRC file is a 1024-byte header, an optional extended header and then raw
voxels in C order, so ``mrcfile.mmap`` gives a NumPy view of the whole file without reading
it. A crop touches only its own pages (``read_block_shape`` is None) and a stride touches only
the picked rows (``decimates``: nearest is served by ``data[::s0, ::s1, ::s2]``).

Axes. Volumes honour the header's axis map (MAPC/MAPR/MAPS: which of X/Y/Z runs along the
columns, rows and sections of the stored array). Most files store (1, 2, 3), i.e. the array
is Z, Y, X; a permuted file such as EMD-3001.map (MAPC=3, MAPR=1, MAPS=2) is an array of
Y, X, Z and is served transposed to canonical Z, Y, X, so that the per-axis voxel size
(which the header gives per physical axis X/Y/Z) lands on the right axis. Image stacks
(ISPG 0 with more than one section, or a ``.mrcs`` file) are independent images - particles,
movie frames, tilt images - not slices of a volume, so their first axis is labelled ``i``
(image index) and carries no physical scale. Volume stacks (ISPG 401+, 4-D) get ``i`` in
front of their Z, Y, X.

Thread safety: reads of a NumPy memmap are thread-safe, but closing the mmap while another
thread still holds a view would crash that thread, so the mrcfile object lives in a
LazyHandle and every read copies its pixels out inside ``use()``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._memmap import MemmapReads
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import ANGSTROM
from tensor_server.errors import UnreadableSource

__all__ = ["MrcAdapter", "MrcSource", "sniff_mrc"]

#: MRC modes mrcfile can map to a NumPy dtype (3 = complex int16 and 101 = 4-bit are not).
MRC_MODES = frozenset({0, 1, 2, 4, 6, 12})
#: Every mode the MRC2014 standard defines, for recognising a file we then decline clearly.
_KNOWN_MODES = MRC_MODES | {3, 101}
#: DeltaVision writes its magic 0xC0A0 at byte 96 of an otherwise MRC-like header.
DV_MAGICS = (b"\xa0\xc0", b"\xc0\xa0")
_AXIS_NAMES = {1: "x", 2: "y", 3: "z"}


class MrcAdapter(MemmapReads, TensorAdapter):
    """The voxels of one MRC file, in stored (native) axis order; see the module docstring."""

    decimates = True

    def __init__(
        self,
        path: Path,
        handle: LazyHandle[Any],
        shape: Sequence[int],
        dtype: Any,
        dim_labels: Sequence[str],
        physical_scale: Sequence[float | None],
        metadata: dict[str, Any],
    ) -> None:
        self.path = path
        self._handle = handle
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=dim_labels,
                native_chunk_shape=None,  # no native block: the transfer grid grows from a plane
                physical_scale=physical_scale,
                physical_unit=tuple(None if s is None else ANGSTROM for s in physical_scale),
                content_version=file_content_version(path),
                metadata=metadata,
            )
        )

    def _array(self, handle: Any) -> np.ndarray:
        return handle.data


class MrcSource(SourceAdapter):
    """An MRC/CCP4 file (``.mrc .map .rec .mrcs .st .ali``) as one tensor, field ``data``."""

    format_name = "mrc"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        handle: LazyHandle[Any] = LazyHandle(lambda: _open_mrcfile(path), name=str(path))
        with handle.use() as mrc:
            data = mrc.data
            if data is None:
                raise UnreadableSource(path, "MRC header parsed but the file holds no data block")
            if data.dtype.fields is not None:
                raise UnreadableSource(path, f"unsupported MRC pixel type {data.dtype} (mode {int(mrc.header.mode)})")
            labels = _dim_labels(mrc, path)
            voxel = mrc.voxel_size
            per_axis = {"x": float(voxel.x), "y": float(voxel.y), "z": float(voxel.z)}
            scale = tuple(per_axis.get(d) or None for d in labels)
            metadata = _header_metadata(mrc, labels)
            shape, dtype = data.shape, data.dtype
        tensor = MrcAdapter(path, handle, shape, dtype, labels, scale, metadata)
        super().__init__(path, {"data": normalize_axes(tensor)}, metadata=metadata)


def _open_mrcfile(path: Path) -> Any:
    import mrcfile

    try:
        return mrcfile.mmap(str(path), mode="r", permissive=False)
    except ValueError as exc:  # mrcfile's message for a bad header / short file
        raise UnreadableSource(path, f"not a readable MRC file: {exc}") from exc


def _dim_labels(mrc: Any, path: Path) -> tuple[str, ...]:
    ndim = mrc.data.ndim
    if ndim == 2:
        return ("y", "x")
    is_stack = ndim == 3 and (int(mrc.header.ispg) == 0 or path.name.lower().endswith(".mrcs"))
    if is_stack:
        return ("i", "y", "x")
    h = mrc.header
    order = (int(h.maps), int(h.mapr), int(h.mapc))  # sections, rows, columns
    if sorted(order) != [1, 2, 3]:
        order = (3, 2, 1)  # an invalid axis map: assume the standard Z, Y, X
    volume = tuple(_AXIS_NAMES[a] for a in order)
    if ndim == 3:
        return volume
    if ndim == 4:
        return ("i",) + volume
    raise UnreadableSource(path, f"unexpected {ndim}-D MRC data")


def _header_metadata(mrc: Any, labels: Sequence[str]) -> dict[str, Any]:
    h = mrc.header
    meta: dict[str, Any] = {
        "format": "MRC",
        "mode": int(h.mode),
        "space_group": int(h.ispg),
        "axis_map": {"mapc": int(h.mapc), "mapr": int(h.mapr), "maps": int(h.maps)},
        "stored_axes": "".join(labels),
        "voxel_size_angstrom": [float(mrc.voxel_size.x), float(mrc.voxel_size.y), float(mrc.voxel_size.z)],
        "origin_angstrom": [float(h.origin.x), float(h.origin.y), float(h.origin.z)],
        "start": [int(h.nxstart), int(h.nystart), int(h.nzstart)],
        "cell_angstrom": [float(v) for v in h.cella.tolist()],
        "nversion": int(h.nversion),
        "labels": [lbl.decode("latin-1").strip() for lbl in h.label[: int(h.nlabl)] if lbl.strip()],
        "header_min_max_mean": [float(h.dmin), float(h.dmax), float(h.dmean)],
    }
    nsymbt = int(h.nsymbt)
    if nsymbt:
        exttyp = bytes(h.exttyp).decode("latin-1").strip("\x00 ")
        ext: dict[str, Any] = {"type": exttyp or None, "bytes": nsymbt}
        eh = mrc.indexed_extended_header if hasattr(mrc, "indexed_extended_header") else None
        if eh is not None and getattr(eh, "dtype", None) is not None and eh.dtype.names and len(eh):
            ext["entries"] = int(len(eh))
            ext["first_entry"] = {name: _plain(eh[0][name]) for name in eh.dtype.names}
        meta["extended_header"] = ext
    return meta


def _plain(value: Any) -> Any:
    """A NumPy scalar from a structured header as JSON-friendly Python."""
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("latin-1").rstrip("\x00 ")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def sniff_mrc(path: Path, head: bytes) -> bool:
    """MRC has no magic at offset 0: "MAP " at byte 208 (MRC2000+) and a sane header (known
    mode, positive NX/NY/NZ in either byte order). DeltaVision files share the layout and are
    left to their own adapter (their magic sits at byte 96)."""
    if len(head) < 224 or head[208:212] != b"MAP " or head[96:98] in DV_MAGICS:
        return False
    for order in "<>":
        nx, ny, nz, mode = struct.unpack_from(f"{order}4i", head, 0)
        if mode in _KNOWN_MODES and nx > 0 and ny > 0 and nz > 0:
            return True
    return False


register_format(
    FormatEntry(
        name="mrc",
        opener=MrcSource,
        sniff=sniff_mrc,
        extensions=(".mrc", ".map", ".rec", ".mrcs", ".st", ".ali"),
        priority=65,
        description="MRC/CCP4 map, image stack or tomogram (memory-mapped with mrcfile)",
    )
)
