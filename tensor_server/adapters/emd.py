"""EMD files: HDF5 containers from electron microscopy, Berkeley EMD and Thermo Fisher Velox.

Both flavours are plain HDF5, so the pixels are read by the HDF5 adapters
(``Hdf5Adapter`` for chunked datasets, ``Hdf5ContiguousAdapter`` for contiguous ones, with the
same read blocks and decimation); this module only knows where the signals are and what their
axes mean. Fields are dataset paths without the leading ``/``, as in the HDF5 adapter, so a
dataset keeps its name whichever adapter claims the file. The format's signals come first
(the first is the default tensor); every other numeric N-D dataset follows, served as stored.

Berkeley EMD (v0.2, Prismatic's 0.5 and emdfile/py4DSTEM 1.0). A group whose attribute
``emd_group_type`` is 1 (or ``"array"`` in emdfile 1.0) holds one data dataset (``data``, or
Prismatic's ``realslice``/``datacube``) and one dimension vector per axis: ``dim1..dimN``
(``dim0..dimN-1`` in 1.0) with ``name`` and ``units`` attributes. A vector is either the full
coordinate list or, in emdfile 1.0, just ``[origin, origin + step]``; either gives the physical
scale when regular. Axis names become labels through ``labels_from_axis_names``: ``x``/``y``
style names directly; 4D-STEM ``R_x, R_y, Q_x, Q_y`` make the last (diffraction) pair the Y/X
plane, kept in array order as py4DSTEM displays it, and the scan axes become z, c. The dim
vectors are calibration, not tensors.

Velox (FEI/Thermo). ``/Data/<Kind>/<uuid>/Data`` with the acquisition metadata as JSON text in
the sibling ``Metadata`` uint8 dataset (one column per frame; column 0 is parsed and kept in
the tensor metadata, the dataset itself is not served). Images are stored (Y, X, frames); the
frame axis is labelled ``t``: Velox frames are successive acquisitions (camera movies, repeated
scans, drift-corrected series), not focal sections, and it is served first (T, Y, X). Pixel
size: ``BinaryResult.PixelSize`` height/width in ``PixelUnitY``/``PixelUnitX`` (metres);
frame time ``Scan.FrameTime`` (s) when the acquisition was a scan. Spectra (channels, frames)
are labelled x, t with the detector's ``Dispersion`` (eV per channel) as the x scale.
SpectrumImage and SpectrumStream ``Data`` are packed event streams, served raw with default
labels, as are FrameLookupTable/FrameLocationTable. The JPEG ``Thumbnail.jpg`` byte array is
not a tensor.

Detection: the HDF5 signature plus EMD structure (root ``version_major``/``emd_group_type``,
a first-level group carrying ``emd_group_type``, or Velox's ``/Data/<Kind>`` with a root
``Version``). The structure is not in the first 4 KiB, so the sniffer opens the file with h5py
(a few ms, only for files that already carry the HDF5 signature); ``.emd`` with the HDF5
signature is accepted without opening.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tensor_server.adapters.hdf5 import (
    AxesInfo,
    DatasetInfo,
    Hdf5File,
    apply_axes,
    clean_unit,
    default_first,
    has_hdf5_signature,
    make_tensor,
    no_tensor_error,
    open_h5py_file,
    plain_attrs,
    plain_value,
    regular_step,
    scan_datasets,
    skipped_summary,
)
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter

__all__ = ["EmdSource", "emd_flavour", "sniff_emd"]

EMD_EXTENSIONS = (".emd",)
#: Velox signal kinds, in the order their datasets are listed (images first).
VELOX_KINDS = ("Image", "Spectrum", "SpectrumImage", "SpectrumStream")
_DIM_NAME = re.compile(r"^dim(\d+)$")
_BERKELEY_SIGNAL_TYPES = frozenset({"1", "array"})
#: First-level groups probed for an ``emd_group_type`` (Prismatic keeps it below the root).
_PROBE_GROUPS = 64


# ---- detection -------------------------------------------------------------------------------
def emd_flavour(h5file: Any) -> str | None:
    """``"velox"``, ``"berkeley"`` or None for an open h5py file (root and first level only)."""
    import h5py

    data = h5file.get("Data", getclass=True)
    if data is h5py.Group and any(k in h5file["Data"] for k in VELOX_KINDS):
        if "Version" in h5file or "Application" in h5file:
            return "velox"
    if "version_major" in h5file.attrs or "emd_group_type" in h5file.attrs:
        return "berkeley"
    for i, name in enumerate(h5file):
        if i >= _PROBE_GROUPS:
            break
        if h5file.get(name, getclass=True) is h5py.Group and "emd_group_type" in h5file[name].attrs:
            return "berkeley"
    return None


def sniff_emd(path: Path, head: bytes) -> bool:
    if not has_hdf5_signature(head):
        return False
    if path.name.lower().endswith(EMD_EXTENSIONS):
        return True
    try:
        h5file = open_h5py_file(path)
    except Exception:
        return False
    try:
        return emd_flavour(h5file) is not None
    except Exception:
        return False
    finally:
        h5file.close()


# ---- Berkeley EMD ----------------------------------------------------------------------------
def _text(value: Any) -> str:
    v = plain_value(value)
    if isinstance(v, list):
        v = v[0] if v else ""
    return "" if v is None else str(v)


def _berkeley_signals(h5file: Any, by_path: dict[str, DatasetInfo], consumed: set[str]) -> list[DatasetInfo]:
    """Calibrate the data dataset of every EMD signal group; mark its dim vectors consumed."""
    import h5py

    groups: list[tuple[str, Any]] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Group) and "emd_group_type" in obj.attrs:
            if _text(obj.attrs["emd_group_type"]).strip().lower() in _BERKELEY_SIGNAL_TYPES:
                groups.append((name, obj))
        return None

    h5file.visititems(visit)
    signals: list[DatasetInfo] = []
    for name, group in groups:
        dims = {int(m.group(1)): key for key in group if (m := _DIM_NAME.match(key))}
        members = [by_path[f"{name}/{key}"] for key in group if f"{name}/{key}" in by_path and key not in dims.values()]
        if not members:
            continue
        data = next((m for m in members if m.path.endswith("/data")), None)
        if data is None:
            shaped = [m for m in members if len(m.shape) == len(dims)] if dims else members
            if len(shaped) != 1:
                continue
            data = shaped[0]
        base = 0 if 0 in dims else 1
        axes = _berkeley_axes(group, dims, base, data.shape)
        if axes is not None:
            apply_axes(data, axes)
            consumed.update(f"{name}/{dims[i + base]}" for i in range(len(data.shape)))
        data.extra_metadata["emd_group"] = {"path": "/" + name, "attributes": plain_attrs(group.attrs)}
        signals.append(data)
    return signals


def _berkeley_axes(group: Any, dims: dict[int, str], base: int, shape: tuple[int, ...]) -> AxesInfo | None:
    if not all(i + base in dims for i in range(len(shape))):
        return None
    names: list[Any] = []
    scales: list[float | None] = []
    units: list[str | None] = []
    for i, n in enumerate(shape):
        vec = group[dims[i + base]]
        names.append(_text(vec.attrs.get("name", "")))
        unit = clean_unit(vec.attrs.get("units"))
        scale = None
        explicitly_unitless = unit is None and "units" in vec.attrs  # "[]": uncalibrated axis
        if vec.ndim == 1 and vec.dtype.kind in "iuf" and vec.shape[0] in (n, 2) and not explicitly_unitless:
            # the full coordinate list, or emdfile's [origin, origin + step] for a linear axis
            scale = regular_step(vec[()])
        scales.append(scale)
        units.append(unit)
    return AxesInfo("emd dim vectors", names, scales, units)


# ---- Velox -----------------------------------------------------------------------------------
def _velox_metadata(group: Any) -> dict[str, Any]:
    """Column 0 of a Velox ``Metadata`` dataset: NUL-padded UTF-8 JSON."""
    if "Metadata" not in group:
        return {}
    ds = group["Metadata"]
    try:
        raw = ds[:, 0] if ds.ndim == 2 else ds[()]
        return json.loads(bytes(raw.tobytes()).rstrip(b"\0").decode("utf-8", "replace"))
    except Exception:  # damaged or foreign metadata: serve the pixels uncalibrated
        return {}


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _velox_axes(kind: str, info: DatasetInfo, meta: dict[str, Any]) -> AxesInfo | None:
    binary = meta.get("BinaryResult", {}) if isinstance(meta, dict) else {}
    ndim = len(info.shape)
    if kind == "Image" and ndim in (2, 3):
        size = binary.get("PixelSize", {}) or {}
        scales: list[float | None] = [_number(size.get("height")), _number(size.get("width"))]
        units: list[str | None] = [clean_unit(binary.get("PixelUnitY")), clean_unit(binary.get("PixelUnitX"))]
        names: list[Any] = ["y", "x"]
        if ndim == 3:
            frame_time = _number((meta.get("Scan") or {}).get("FrameTime"))
            names.append("t")
            scales.append(frame_time)
            units.append("s" if frame_time else None)
        return AxesInfo("velox metadata", names, scales, units)
    if kind == "Spectrum" and ndim in (1, 2):
        detector = (meta.get("Detectors") or {}).get(f"Detector-{binary.get('DetectorIndex')}", {}) or {}
        dispersion = _number(detector.get("Dispersion"))
        names = ["x", "t"][:ndim]
        return AxesInfo("velox metadata", names, [dispersion, None][:ndim], ["eV" if dispersion else None, None][:ndim])
    return None


def _velox_signals(
    h5file: Any, by_path: dict[str, DatasetInfo], consumed: set[str], skipped: dict[str, str]
) -> list[DatasetInfo]:
    import h5py

    data = h5file["Data"]
    kinds = [k for k in VELOX_KINDS if k in data] + sorted(k for k in data if k not in VELOX_KINDS)
    signals: list[DatasetInfo] = []
    for kind in kinds:
        if not isinstance(data[kind], h5py.Group):
            continue
        for uid in data[kind]:
            group = data[kind][uid]
            if not isinstance(group, h5py.Group):
                continue
            prefix = f"Data/{kind}/{uid}"
            if "Metadata" in group:
                consumed.add(f"{prefix}/Metadata")
                skipped[f"{prefix}/Metadata"] = "Velox JSON metadata (parsed into the tensor metadata)"
            info = by_path.get(f"{prefix}/Data")
            if info is None:
                continue
            meta = _velox_metadata(group)
            apply_axes(info, _velox_axes(kind, info, meta))
            info.extra_metadata["velox"] = {"kind": kind, "uuid": uid, "metadata": meta}
            signals.append(info)
    for name in h5file:
        if name.lower().endswith((".jpg", ".jpeg", ".png")):
            consumed.add(name)
            skipped[name] = "encoded thumbnail image"
    return signals


def _velox_version(h5file: Any) -> Any:
    if "Version" not in h5file:
        return None
    try:
        return json.loads(_text(h5file["Version"][0]))
    except Exception:
        return None


# ---- the source ------------------------------------------------------------------------------
class EmdSource(SourceAdapter):
    """A Berkeley or Velox EMD file (see the module docstring)."""

    format_name = "emd"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        file = Hdf5File(path)
        skipped: dict[str, str] = {}
        consumed: set[str] = set()
        with file.handle.use() as h5file:
            flavour = emd_flavour(h5file)
            infos = scan_datasets(h5file, skipped)
            by_path = {info.path: info for info in infos}
            metadata: dict[str, Any] = {
                "format": "EMD",
                "flavour": flavour,
                "root_attributes": plain_attrs(h5file.attrs),
            }
            if flavour == "velox":
                signals = _velox_signals(h5file, by_path, consumed, skipped)
                metadata["velox_version"] = _velox_version(h5file)
            elif flavour == "berkeley":
                signals = _berkeley_signals(h5file, by_path, consumed)
            else:  # an .emd name on a plain HDF5 file: serve it as generic HDF5
                signals = []
        chosen = {info.path for info in signals}
        rest = [info for info in infos if info.path not in chosen and info.path not in consumed]
        ordered = signals + rest if signals else default_first(rest)
        if not ordered:
            file.close()
            raise no_tensor_error(path, skipped)
        metadata["signals"] = [info.path for info in signals]
        metadata["skipped_datasets"] = skipped_summary(path, skipped)
        self.file = file
        super().__init__(path, {info.path: make_tensor(file, info) for info in ordered}, metadata=metadata)

    def close(self) -> None:
        self.file.close()


register_format(
    FormatEntry(
        name="emd",
        opener=EmdSource,
        sniff=sniff_emd,
        extensions=EMD_EXTENSIONS,
        priority=74,
        description="EMD (Berkeley EMD, Thermo Fisher Velox): HDF5 with electron-microscopy axes",
    )
)
