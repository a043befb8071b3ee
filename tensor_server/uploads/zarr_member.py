"""``zarr://`` members: an OME-Zarr image group (multiscales + upload marker in ``.zattrs``,
array ``0/``), chunked on the tensor's transfer grid.

Writes land with zarr's own encoder; reads go through the ordinary zarr adapter
(``adapters/zarr.py``), so an uploaded zarr tensor is read exactly like a discovered one and
unwritten chunks read as the fill value (0). The store chunk *is* the transfer grid, so a
planned chunk covers whole store chunks and concurrent DoPuts never share one. Zarr writes no
file for a chunk of fill values, so the files its metadata names are the metadata files
(``METADATA_FILES``): READY and boot require those, and boot also the chunk files READY
recorded (``integrity.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.core.bounds import Bounds
from tensor_server.uploads.integrity import StoreDamaged, check_manifest, require_files, write_manifest
from tensor_server.uploads.marker import MARKER_KEY, Marker, read_json, sync_path, write_json_atomic

__all__ = ["METADATA_FILES", "ZarrMember"]

#: the group's and the array's metadata (zarr v2: members are written as v2 groups)
METADATA_FILES = (".zgroup", ".zattrs", "0/.zarray")


def _zattrs(marker: Marker, ndim: int, extra: dict[str, Any] | None) -> dict[str, Any]:
    axes = (
        [{"name": n} for n in marker.dim_labels]
        if len(marker.dim_labels) == ndim
        else [{"name": f"dim_{i}"} for i in range(ndim)]
    )
    doc = {
        "multiscales": [
            {
                "version": "0.4",
                "name": marker.array_id,
                "axes": axes,
                "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0] * ndim}]}],
            }
        ],
        MARKER_KEY: marker.to_json(),
    }
    doc.update(extra or {})
    return doc


class ZarrMember:
    store_format = "zarr"

    def __init__(self, path: Path, marker: Marker, array: Any, extra_attrs: dict[str, Any]) -> None:
        self.path = path
        self.marker = marker
        self._array = array
        self._extra = extra_attrs

    @classmethod
    def create(
        cls,
        path: Path,
        marker: Marker,
        shape: tuple[int, ...],
        dtype: np.dtype,
        grid: tuple[int, ...],
        extra_attrs: dict[str, Any] | None = None,
    ) -> ZarrMember:
        import zarr

        root = zarr.open_group(str(path), mode="w-", zarr_format=2)
        array = root.create_array("0", shape=shape, chunks=grid, dtype=dtype, fill_value=0)
        write_json_atomic(path / ".zattrs", _zattrs(marker, len(shape), extra_attrs))
        return cls(path, marker, array, dict(extra_attrs or {}))

    @classmethod
    def open(cls, path: Path) -> ZarrMember | None:
        """The member at ``path`` for adoption (None when it carries no marker); raises
        ``StoreDamaged`` when a metadata file or a file READY recorded is missing or cut."""
        import zarr

        attrs = read_json(path / ".zattrs")
        marker = Marker.from_json((attrs or {}).get(MARKER_KEY))
        if attrs is None or marker is None:
            return None
        missing = [n for n in METADATA_FILES if not (path / n).is_file()]
        if missing:
            raise StoreDamaged(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
        check_manifest(path)
        extra = {k: v for k, v in attrs.items() if k not in ("multiscales", MARKER_KEY)}
        return cls(path, marker, zarr.open_array(str(path / "0"), mode="r+"), extra)

    @staticmethod
    def read_marker(path: Path) -> Marker | None:
        return Marker.from_json((read_json(path / ".zattrs") or {}).get(MARKER_KEY))

    def reader(self):
        """The tensor this member serves: the zarr adapter over array ``0``."""
        from tensor_server.adapters.zarr import ZarrAdapter

        m = self.marker
        return ZarrAdapter(
            self._array,
            store_path=self.path,
            zarr_path="0",
            dim_labels=m.dim_labels or None,
            physical_scale=None,
            physical_unit=None,
            is_labels=m.is_labels,
            content_version=bytes.fromhex(m.content_version),
        )

    def write(self, bounds: Bounds, data: np.ndarray) -> None:
        self._array[bounds.to_slices()] = data

    def publish(self, marker: Marker) -> None:
        """READY: the metadata files are all there, the files zarr wrote (it never fsyncs)
        reach the disk and are recorded, then the marker flips, so a READY marker never names
        a file a power cut could lose or one that was never there."""
        require_files(self.path, METADATA_FILES, marker.array_id)
        written, folders = [self.path / ".zgroup"], []
        for folder, _, files in os.walk(self.path / "0"):
            written += [Path(folder) / name for name in files]
            folders.append(Path(folder))
        for f in written + folders:
            sync_path(f)
        write_manifest(self.path, written)
        write_json_atomic(self.path / ".zattrs", _zattrs(marker, self._array.ndim, self._extra))
        self.marker = marker

    def locate(self, bounds: Bounds):  # same signature as CacheMember.locate
        """zarr members use the default fast path (resolve into the chunk cache)."""
        return None

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        pass
