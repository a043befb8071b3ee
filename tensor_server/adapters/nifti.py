"""NIfTI-1 and NIfTI-2 (``.nii``, ``.nii.gz``, and the ``.hdr``/``.img`` pair) through nibabel.

Axes. NIfTI stores x fastest, so nibabel's ``dataobj`` is indexed (x, y, z, t, ...). The
adapter keeps that native order (labels x, y, z, t, then c for NIfTI's 5th "component"
dimension, p, q for the 6th/7th) and ``normalize_axes`` presents it as (..., t, z, y, x). The
adapter reads and strides in native order; only the small result is transposed.

Scaling (scl_slope / scl_inter). nibabel treats a slope of 0 or NaN as "no scaling" and then
reports slope 1, intercept 0 on the proxy. With identity scaling the served dtype is the
on-disk dtype and the pixels are the raw values. Otherwise the served values are exactly
``np.asarray(img.dataobj[slices]).astype(float32)``: nibabel computes ``raw * slope + inter``
in a float type it picks from the raw dtype and the scale factors (float64 for the usual
float32/float64 factors, independent of the pixel values, so every crop of the tensor agrees
with the whole), and the adapter casts that to float32. The one exception is float64 raw
data, which stays float64: narrowing data that was stored in double precision would lose it.

Reads: ``dataobj[slices]`` plans the file read from the slice (nibabel's ``fileslice``), so a
crop reads little of an uncompressed ``.nii``: no read block. A step in the slice is planned
the same way, so nearest is served as ``dataobj[a:b:s, ...]`` (``decimates``). For
``.nii.gz`` every read decompresses the stream from the start up to the last byte it needs
(gzip cannot seek): a decimated read there still saves the memory and the copy of the skipped
voxels, not the decode; it is still exact, so it stays on.

Thread safety: the proxy opens the file per access (nibabel's default keep_file_open=False)
and guards shared state with its own lock, so concurrent reads need nothing more. The loaded
image (parsed header) sits in a LazyHandle only so an idle source drops it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._strided import StridedReads, strided_slices
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.arrays import owned_array
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import HERTZ, METER, MICROMETER, MICROSECOND, MILLIMETER, MILLISECOND, SECOND
from tensor_server.errors import UnreadableSource

__all__ = ["NiftiAdapter", "NiftiSource", "sniff_nifti", "served_dtype"]

_LABELS = ("x", "y", "z", "t", "c", "p", "q")
_SPACE_UNITS = {"meter": METER, "mm": MILLIMETER, "micron": MICROMETER}
_TIME_UNITS = {
    "sec": SECOND,
    "msec": MILLISECOND,
    "usec": MICROSECOND,
    "hz": HERTZ,
    "ppm": "ppm",
    "rads": "radian/second",
}


def served_dtype(raw: np.dtype, slope: float, inter: float) -> np.dtype:
    """The dtype a NIfTI tensor is served in (see the module docstring)."""
    if slope == 1 and inter == 0:
        return np.dtype(raw)
    if np.dtype(raw).kind == "f" and np.dtype(raw).itemsize >= 8:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


class NiftiAdapter(StridedReads, TensorAdapter):
    """One NIfTI image in nibabel's native (x, y, z, t, ...) order."""

    def __init__(
        self,
        path: Path,
        handle: LazyHandle[Any],
        shape: Sequence[int],
        dtype: np.dtype,
        physical_scale: Sequence[float | None],
        physical_unit: Sequence[str | None],
        metadata: dict[str, Any],
    ) -> None:
        self.path = path
        self._handle = handle
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=_LABELS[: len(shape)],
                native_chunk_shape=None,  # no native block: dataobj slicing reads what the crop needs
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                content_version=file_content_version(path),
                metadata=metadata,
            )
        )

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        slices = strided_slices(bounds, step)
        want = tuple(len(range(*s.indices(n))) for s, n in zip(slices, self.shape))
        try:
            with self._handle.use() as img:
                # copy inside use(): a whole-image read may be an mmap of the handle's file
                arr = owned_array(np.asarray(img.dataobj[slices]), self.dtype)
        except UnreadableSource:
            raise
        except (OSError, EOFError, ValueError, zlib.error) as exc:  # truncated / corrupt stream
            raise UnreadableSource(self.path, f"NIfTI read failed: {type(exc).__name__}: {exc}") from exc
        if arr.shape != want:
            raise UnreadableSource(self.path, f"NIfTI read returned {arr.shape} for {bounds}")
        return arr

    def close(self) -> None:
        self._handle.close()


class NiftiSource(SourceAdapter):
    """A NIfTI-1/-2 image as one tensor, field ``data``."""

    format_name = "nifti"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        handle: LazyHandle[Any] = LazyHandle(lambda: _load(path), closer=_close_image, name=str(path))
        with handle.use() as img:
            proxy = img.dataobj
            raw = np.dtype(proxy.dtype)
            if raw.fields is not None or raw.kind not in "biufc":
                raise UnreadableSource(path, f"unsupported NIfTI data type {raw} (e.g. RGB24 is not served)")
            slope, inter = float(proxy.slope), float(proxy.inter)
            dtype = served_dtype(raw, slope, inter)
            shape = tuple(int(n) for n in img.shape)
            if not shape or any(n < 1 for n in shape):
                raise UnreadableSource(path, f"NIfTI image has no voxels (shape {shape})")
            hdr = img.header
            zooms = [float(z) for z in hdr.get_zooms()][: len(shape)]
            zooms += [0.0] * (len(shape) - len(zooms))
            space, time = hdr.get_xyzt_units()
            unit_for = [_SPACE_UNITS.get(space)] * 3 + [_TIME_UNITS.get(time)]
            scale = tuple(z if (z > 0 and np.isfinite(z)) else None for z in zooms)
            unit = tuple(
                (unit_for[i] if i < len(unit_for) else None) if scale[i] is not None else None
                for i in range(len(shape))
            )
            metadata = _metadata(img, raw, slope, inter, dtype)
        tensor = NiftiAdapter(path, handle, shape, dtype, scale, unit, metadata)
        super().__init__(path, {"data": normalize_axes(tensor)}, metadata=metadata)


_NIFTI_NAMES = (".nii", ".nii.gz", ".hdr", ".hdr.gz", ".img", ".img.gz")


def _load(path: Path) -> Any:
    import nibabel as nib

    try:
        if path.name.lower().endswith(_NIFTI_NAMES):
            img = nib.load(str(path))
        else:
            img = _load_misnamed(path)
    except UnreadableSource:
        raise
    except Exception as exc:  # nibabel's ImageFileError, HeaderDataError, EOFError, ...
        raise UnreadableSource(path, f"not a readable NIfTI file: {type(exc).__name__}: {exc}") from exc
    if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image, nib.Nifti1Pair, nib.Nifti2Pair)):
        raise UnreadableSource(path, f"nibabel read it as {type(img).__name__}, not NIfTI")
    return img


def _load_misnamed(path: Path) -> Any:
    """A single-file NIfTI recognised by content under another name: nibabel picks the reader
    and the compression from the file name, so both are chosen here from the magic bytes and
    nibabel reads from a file object (its proxy serialises seeks on it with its own lock)."""
    import gzip

    import nibabel as nib
    from nibabel.fileholders import FileHolder

    with open(path, "rb") as fh:
        head = fh.read(4096)
    compressed = head[:2] == b"\x1f\x8b"
    if compressed:
        head = zlib.decompressobj(31).decompress(head, 1024)
    if len(head) >= 348 and head[344:348] == b"n+1\x00":
        klass = nib.Nifti1Image
    elif len(head) >= 8 and head[4:8] == b"n+2\x00":
        klass = nib.Nifti2Image
    else:
        raise UnreadableSource(path, "not a single-file NIfTI (a .hdr/.img pair needs its file names)")
    fileobj = gzip.open(path, "rb") if compressed else open(path, "rb")
    holder = FileHolder(filename=str(path), fileobj=fileobj)
    try:
        img = klass.from_file_map({"image": holder, "header": holder})
    except Exception:
        fileobj.close()
        raise
    img._tensor_server_owned_file = fileobj  # closed by _close_image when the handle is reaped
    return img


def _close_image(img: Any) -> None:
    owned = getattr(img, "_tensor_server_owned_file", None)
    if owned is not None:
        owned.close()


def _metadata(img: Any, raw: np.dtype, slope: float, inter: float, dtype: np.dtype) -> dict[str, Any]:
    hdr = img.header
    meta: dict[str, Any] = {
        "format": type(img).__name__.replace("Image", "").replace("Pair", " pair"),
        "stored_axes": "".join(_LABELS[: len(img.shape)]),
        "on_disk_dtype": raw.str,
        "scl_slope": slope,
        "scl_inter": inter,
        "scaled": dtype != raw,
        "zooms": [float(z) for z in hdr.get_zooms()],
        "xyzt_units": list(hdr.get_xyzt_units()),
        "affine": np.asarray(img.affine, dtype=float).tolist(),
    }
    for key in ("descrip", "intent_name", "aux_file"):
        try:
            value = hdr[key].item()
            text = value.decode("latin-1").strip("\x00 ") if isinstance(value, bytes) else str(value)
            if text:
                meta[key] = text
        except Exception:
            pass
    try:
        meta["qform_code"], meta["sform_code"] = int(hdr["qform_code"]), int(hdr["sform_code"])
        intent = hdr.get_intent()
        if intent and intent[0] != "none":
            meta["intent"] = intent[0]
    except Exception:
        pass
    return meta


def _nifti_magic(head: bytes) -> bool:
    if len(head) >= 348 and head[344:348] in (b"n+1\x00", b"ni1\x00"):
        return struct.unpack("<i", head[:4])[0] == 348 or struct.unpack(">i", head[:4])[0] == 348
    if len(head) >= 8 and head[4:8] in (b"n+2\x00", b"ni2\x00"):
        return struct.unpack("<i", head[:4])[0] == 540 or struct.unpack(">i", head[:4])[0] == 540
    return False


def sniff_nifti(path: Path, head: bytes) -> bool:
    """NIfTI-1 magic "n+1"/"ni1" at byte 344 with sizeof_hdr 348, NIfTI-2 "n+2"/"ni2" at byte 4 with
    sizeof_hdr 540 (either byte order). A gzip stream is inflated just far enough (from the
    4 KiB head, no more) to check the same magic, so ``.nii.gz`` is recognised by content."""
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(31).decompress(head, 1024)
        except zlib.error:
            return False
    return _nifti_magic(head)


register_format(
    FormatEntry(
        name="nifti",
        opener=NiftiSource,
        sniff=sniff_nifti,
        extensions=(".nii", ".nii.gz"),
        priority=65,
        description="NIfTI-1/NIfTI-2 (.nii, .nii.gz, .hdr/.img pair) via nibabel",
    )
)
