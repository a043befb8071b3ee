"""DeltaVision (``.dv``, ``.r3d``): an MRC-derived 1024-byte header, a per-section extended
header, then raw planes, read through the ``mrc`` package's ``DVFile`` memmap.

The header's image sequence (byte 182: ZTW, WZT or ZWT) fixes the order of the section axes
(time, wavelength, Z); ``mrc.DVFile`` maps the file with those axes in stored order and the
adapter presents them in canonical T, C, Z, Y, X through ``normalize_axes``. Singleton time
and wavelength axes are dropped (a one-timepoint, two-channel stack is C, Z, Y, X, as
DVFile's own ``asarray`` shows it); Z, Y and X always stay.

Like MRC, the pixels are one memmap: a crop reads only its pages (no read block) and nearest
is a strided index of the memmap (``decimates``). The DVFile object sits in a LazyHandle and
reads copy inside ``use()``, so the reaper never closes a mapping a read still views.

Physical scale: dx, dy, dz from the header (micrometres); the time step from the extended
header's timestamps when there is more than one time point (seconds). Wavelengths, the
objective and the per-channel exposure/excitation/emission go into metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._memmap import MemmapReads
from tensor_server.adapters.mrc import DV_MAGICS
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER, SECOND
from tensor_server.errors import UnreadableSource

__all__ = ["DeltaVisionAdapter", "DeltaVisionSource", "sniff_deltavision"]


class DeltaVisionAdapter(MemmapReads, TensorAdapter):
    """The planes of one DeltaVision file, in stored axis order with singleton T/C dropped."""

    decimates = True

    def __init__(
        self,
        path: Path,
        handle: LazyHandle[Any],
        stored_shape: tuple[int, ...],
        labels: tuple[str, ...],
        dtype: Any,
        physical_scale: tuple[float | None, ...],
        physical_unit: tuple[str | None, ...],
        metadata: dict[str, Any],
    ) -> None:
        self.path = path
        self._handle = handle
        self._stored_shape = stored_shape  # the 5-D memmap shape (section axes + Y, X)
        kept = [i for i, (d, n) in enumerate(zip(labels, stored_shape)) if not (d in "tc" and n == 1)]
        self._kept = tuple(kept)
        super().__init__(
            TensorInfo(
                tuple(stored_shape[i] for i in kept),
                dtype,
                dim_labels=tuple(labels[i] for i in kept),
                native_chunk_shape=None,  # no native block: a crop of a memmap costs its own pages
                physical_scale=tuple(physical_scale[i] for i in kept),
                physical_unit=tuple(physical_unit[i] for i in kept),
                content_version=file_content_version(path),
                metadata=metadata,
            )
        )

    def _array(self, handle: Any) -> np.ndarray:
        # Dropping size-1 axes is always a view of the memmap, never a copy.
        return handle.data.reshape(self.shape)


class DeltaVisionSource(SourceAdapter):
    """A DeltaVision file as one tensor, field ``data``."""

    format_name = "deltavision"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        handle: LazyHandle[Any] = LazyHandle(lambda: _open_dv(path), name=str(path))
        with handle.use() as dv:
            hdr = dv.hdr
            sizes = dv.sizes  # stored order, e.g. {"C": 2, "T": 1, "Z": 17, "Y": 128, "X": 128}
            nc, nt, nz = max(hdr.nc, 1), max(hdr.nt, 1), sizes["Z"]
            if nz < 1 or nc * nt * nz != hdr.n_sections:
                raise UnreadableSource(
                    path,
                    f"DeltaVision header is inconsistent: {hdr.n_sections} sections is not "
                    f"{nc} wavelengths x {nt} time points x Z",
                )
            if tuple(dv.data.shape) != tuple(sizes.values()):
                raise UnreadableSource(path, f"memmap shape {dv.data.shape} does not match {sizes}")
            labels = tuple(k.lower() for k in sizes)
            stored_shape = tuple(int(n) for n in sizes.values())
            dt = _time_step(dv, sizes)
            per_axis = {
                "x": float(hdr.dx) or None,
                "y": float(hdr.dy) or None,
                "z": float(hdr.dz) or None,
                "t": dt,
                "c": None,
            }
            units = {"x": MICROMETER, "y": MICROMETER, "z": MICROMETER, "t": SECOND, "c": None}
            scale = tuple(per_axis[d] for d in labels)
            unit = tuple(units[d] if per_axis[d] is not None else None for d in labels)
            metadata = _metadata(dv, sizes)
            dtype = dv.dtype
        tensor = DeltaVisionAdapter(path, handle, stored_shape, labels, dtype, scale, unit, metadata)
        super().__init__(path, {"data": normalize_axes(tensor)}, metadata=metadata)


def _open_dv(path: Path) -> Any:
    import mrc

    try:
        return mrc.DVFile(path)
    except KeyError as exc:  # DVFile.dtype's lookup of an unknown pixel type
        raise UnreadableSource(path, f"unsupported DeltaVision pixel type {exc}") from exc
    except (ValueError, OSError) as exc:  # not DV / memmap larger than the file
        raise UnreadableSource(path, f"not a readable DeltaVision file: {exc}") from exc
    except Exception as exc:  # struct.error on a truncated header, ...
        raise UnreadableSource(path, f"not a readable DeltaVision file: {type(exc).__name__}: {exc}") from exc


def _section_index(sizes: dict[str, int], c: int = 0, t: int = 0, z: int = 0) -> int:
    """The section (plane) number of (c, t, z) in the file's stored order."""
    order = [k for k in sizes if k in "CTZ"]
    pos = {"C": c, "T": t, "Z": z}
    return int(np.ravel_multi_index(tuple(pos[k] for k in order), tuple(sizes[k] for k in order)))


def _time_step(dv: Any, sizes: dict[str, int]) -> float | None:
    if sizes.get("T", 1) < 2 or dv.ext_hdr is None:
        return None
    try:
        t0 = dv.ext_hdr.frame(_section_index(sizes, t=0)).timeStampSeconds
        t1 = dv.ext_hdr.frame(_section_index(sizes, t=1)).timeStampSeconds
    except Exception:
        return None
    step = float(t1 - t0)
    return step if np.isfinite(step) and step > 0 else None


def _metadata(dv: Any, sizes: dict[str, int]) -> dict[str, Any]:
    hdr = dv.hdr
    nc = max(hdr.nc, 1)
    waves = [hdr.wave1, hdr.wave2, hdr.wave3, hdr.wave4, hdr.wave5][:nc]
    channels = []
    for c, wave in enumerate(waves):
        ch: dict[str, Any] = {"wavelength_nm": int(wave)}
        if dv.ext_hdr is not None:
            try:
                f = dv.ext_hdr.frame(_section_index(sizes, c=c))
                ch.update(
                    excitation_nm=float(f.exWavelen),
                    emission_nm=float(f.emWavelen),
                    exposure_s=float(f.expTime),
                    nd_filter=float(f.ndFilter),
                )
            except Exception:  # a short extended header: wavelengths from the main header only
                pass
        channels.append(ch)
    titles = bytes(dv._title) if isinstance(getattr(dv, "_title", b""), (bytes, bytearray)) else b""
    title_lines = [titles[i : i + 80].decode("latin-1").strip("\x00 ") for i in range(0, len(titles), 80)]
    try:
        image_type = hdr.image_type
    except KeyError:
        image_type = int(hdr.img_type)
    return {
        "format": "DeltaVision",
        "sizes": dict(sizes),
        "stored_axes": "".join(sizes).lower(),
        "voxel_size_um": [float(hdr.dx), float(hdr.dy), float(hdr.dz)],
        "wavelengths_nm": [int(w) for w in waves],
        "channels": channels,
        "lens": dv.lens,
        "lens_id": int(hdr.lens_num),
        "image_type": image_type,
        "titles": [t for t in title_lines if t],
        "origin_um": [float(hdr.x0), float(hdr.y0), float(hdr.z0)],
        "extended_header_bytes": int(hdr.ext_hdr_len),
    }


def sniff_deltavision(path: Path, head: bytes) -> bool:
    """The DV magic 0xC0A0 (either byte order) at byte 96 (``nDVID``)."""
    return len(head) >= 1024 and head[96:98] in DV_MAGICS


register_format(
    FormatEntry(
        name="deltavision",
        opener=DeltaVisionSource,
        sniff=sniff_deltavision,
        extensions=(".dv", ".r3d"),
        priority=65,
        description="DeltaVision .dv/.r3d (memory-mapped with the mrc package)",
    )
)
