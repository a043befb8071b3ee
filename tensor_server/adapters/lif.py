"""Leica LIF files (LAS X / LAS AF project files), read with ``readlif``.

A LIF file is an XML header plus one uncompressed memory block per image. Every image is a
tensor of the source; its field is the image's name as readlif reports it (folder path inside
the project joined with ``/``, made unique with ``#2``, ``#3``... when names repeat).

Axes. An image's XML declares its dimensions in storage order (fastest first), each with a
``DimID``: 1 x, 2 y, 3 z, 4 t, 5 detection (emission) wavelength, 9 illumination (excitation)
wavelength, 10 mosaic tile; 6-8 have no documented meaning. The first two dimensions form the
stored 2-D plane (``display_dims``; usually x/y, but x/z for the "atypical" XZ scans); the
channels and the remaining dimensions sit at the byte offsets the XML gives (channels usually
right after the plane). The tensor has exactly the dimensions the
XML declares plus a channel axis ``c`` that is always present (every LIF image describes its
channels), labelled ``x``, ``y``, ``z``, ``t``, ``w`` (emission wavelength), ``i``
(illumination wavelength, readlif's name), ``m`` (mosaic tile) and ``dim6``..``dim8``. An XZ
scan therefore has no ``y`` axis: it is served as its stored Z x X planes (``tczx``), which is
what a user of an XZ scan expects to see, and an XZY scan is a volume (``czyx`` after
normalisation). Wavelength sweeps keep their wavelength axis, so every stored plane is
reachable (readlif's ``get_frame`` ignores those axes; see the tests).

Reads. LIF pixels are stored raw (no compression), one memory block per image. readlif parses
the container (XML header, memory-block offsets, names, scales); the planes themselves are
read from the memory block at the byte offsets the XML declares (``BytesInc`` of every
dimension and channel), one contiguous read per plane. readlif's own plane readers are not
used for pixels because in readlif 0.6.6 they return wrong planes for real files:
``get_frame`` ignores every axis but x/y/z/t/c/m (a wavelength sweep's second "t" is its
second wavelength), and ``get_plane`` sizes pixels as ``bit_depth // 8`` bytes (one byte for
12-bit data) and assumes channels follow the plane (LAS X Navigator stores them after Z).

The read block is one plane (design §3): a plane is read whole and Y/X crops cut it. The
adapter decimates (design §4): a nearest read with a step reads only the planes on the step
along the outer axes (T/C/Z/M/wavelengths) and strides inside each plane. Pixels are 8-bit
(``uint8``) or 9-16-bit (``uint16``, as stored: 12-bit data keeps its 0..4095 range).

Thread safety and handles: the file is opened lazily through ``LazyHandle`` (closed by the
idle reaper, never during a read) and read with ``os.pread``, which takes its offset per call
and never moves a shared file position, so concurrent reads need no lock (platforms without
``pread`` fall back to seek + read under a per-file lock).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator, Sequence
from math import prod
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tensor_server.adapters._strided import StridedReads
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER, NANOMETER, SECOND
from tensor_server.errors import UnreadableSource

__all__ = ["LifAdapter", "LifSource", "sniff_lif", "LIF_DIM_LABELS"]

#: LIF DimID → axis label (see module docstring).
LIF_DIM_LABELS = {1: "x", 2: "y", 3: "z", 4: "t", 5: "w", 6: "dim6", 7: "dim7", 8: "dim8", 9: "i", 10: "m"}
_SPATIAL_DIMS = {1, 2, 3}
_WAVELENGTH_DIMS = {5, 9}
_TIME_DIM = 4


def sniff_lif(path: Path, head: bytes) -> bool:
    """LIF magic, as readlif checks it: 0x70 0 0 0, a 4-byte length, then the 0x2A byte."""
    return len(head) >= 9 and head[:4] == b"\x70\x00\x00\x00" and head[8] == 0x2A


class _Dim:
    """One dimension of an image as the XML declares it."""

    def __init__(self, dim_id: int, size: int, bytes_inc: int) -> None:
        self.dim_id = dim_id
        self.size = size
        self.bytes_inc = bytes_inc

    @property
    def label(self) -> str:
        return LIF_DIM_LABELS.get(self.dim_id, f"dim{self.dim_id}")


class _LifFileReader:
    """Positional reads from one open LIF file, shared by all its images (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: LazyHandle[BinaryIO] = LazyHandle(lambda: open(path, "rb", buffering=0), name=str(path))
        self._seek_lock = threading.Lock()  # only without os.pread

    def read(self, offset: int, nbytes: int) -> bytes:
        """Exactly ``nbytes`` at ``offset``; a short file raises UnreadableSource."""
        chunks: list[bytes] = []
        got = 0
        try:
            with self.handle.use() as fh:
                while got < nbytes:
                    if hasattr(os, "pread"):
                        chunk = os.pread(fh.fileno(), nbytes - got, offset + got)
                    else:  # pragma: no cover - Windows
                        with self._seek_lock:
                            fh.seek(offset + got)
                            chunk = fh.read(nbytes - got)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
        except OSError as exc:
            raise UnreadableSource(self.path, f"cannot read {nbytes} bytes at {offset}: {exc}") from exc
        if got < nbytes:
            raise UnreadableSource(
                self.path, f"truncated: {nbytes} bytes of pixels at offset {offset}, the file ends after {got}"
            )
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class LifAdapter(StridedReads, TensorAdapter):
    """One LIF image, axes slowest-first: outer dims (reversed storage order), ``c``, then
    the stored plane (module docstring). The read block is one plane (read whole, cropped);
    ``decimates`` because the step skips whole planes on the outer axes."""

    decimates = True

    def __init__(
        self,
        reader: _LifFileReader,
        image: Any,
        dims: Sequence[_Dim],
        channel_offsets: Sequence[int],
        dtype: np.dtype,
        *,
        content_version: bytes,
        metadata: dict[str, Any],
    ) -> None:
        self.path = reader.path
        self.name = str(image.name)
        self._reader = reader
        self._block_start = int(image.offsets[0])
        self._plane_dims = (dims[1], dims[0])  # (slow, fast) = rows, columns of a plane
        self._outer_dims = tuple(reversed(dims[2:]))  # slowest first
        self._channel_offsets = tuple(int(c) for c in channel_offsets)
        self._stored_dtype = np.dtype(dtype)  # little-endian as stored; get_data makes it native
        scale_n = dict(image.scale_n or {})
        labels = [d.label for d in self._outer_dims] + ["c"] + [d.label for d in self._plane_dims]
        shape = [d.size for d in self._outer_dims] + [len(channel_offsets)] + [d.size for d in self._plane_dims]
        physical = [_physical(scale_n, d) for d in self._outer_dims] + [(None, None)]
        physical += [_physical(scale_n, d) for d in self._plane_dims]
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=labels,
                # One plane: the unit a read fetches and decodes (design §3).
                native_chunk_shape=[1] * (len(shape) - 2) + shape[-2:],
                physical_scale=[p[0] for p in physical],
                physical_unit=[p[1] for p in physical],
                content_version=content_version,
                metadata=metadata,
            )
        )

    def plane_offset(self, outer_index: Sequence[int], channel: int) -> int:
        """File offset of the plane at outer indices (slowest first) and channel."""
        offset = self._block_start + self._channel_offsets[channel]
        return offset + sum(int(i) * d.bytes_inc for d, i in zip(self._outer_dims, outer_index))

    def read_plane(self, outer_index: Sequence[int], channel: int) -> np.ndarray:
        """One plane (rows, columns), read-only, at outer indices and channel."""
        rows, cols = self._plane_dims[0].size, self._plane_dims[1].size
        data = self._reader.read(self.plane_offset(outer_index, channel), rows * cols * self._stored_dtype.itemsize)
        return np.frombuffer(data, dtype=self._stored_dtype).reshape(rows, cols)

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        """``get_data(bounds)[::step]``: only planes on the step are read (design §4)."""
        picks = [range(a, b, s) for a, b, s in zip(bounds.start, bounds.stop, step)]
        out = np.empty(tuple(len(r) for r in picks), dtype=self.dtype)
        rows, cols = picks[-2], picks[-1]
        crop = (slice(rows.start, rows.stop, rows.step), slice(cols.start, cols.stop, cols.step))
        n_outer = len(self._outer_dims)
        plane_ranges = picks[:-2]  # outer dims, then c
        positions = [range(len(r)) for r in plane_ranges]
        for index, where in zip(itertools.product(*plane_ranges), itertools.product(*positions)):
            out[where] = self.read_plane(index[:n_outer], index[n_outer])[crop]
        return out

    def close(self) -> None:
        """Close the file now (waiting for reads in flight); the next read reopens it."""
        self._reader.handle.close()


def _physical(scale_n: dict[int, Any], dim: _Dim) -> tuple[float | None, str | None]:
    """Step per element of ``dim`` and its unit, from readlif's ``scale_n`` (elements per
    unit: px/µm for space and wavelength, frames/s for time)."""
    per_unit = scale_n.get(dim.dim_id)
    if not per_unit or per_unit <= 0:
        return None, None
    if dim.dim_id in _SPATIAL_DIMS:
        return 1.0 / per_unit, MICROMETER
    if dim.dim_id in _WAVELENGTH_DIMS:
        return 1000.0 / per_unit, NANOMETER
    if dim.dim_id == _TIME_DIM:
        return 1.0 / per_unit, SECOND
    return None, None


def _image_elements(root: Any) -> Iterator[Any]:
    """The XML ``Element``s holding images, in the order readlif lists its images (a
    depth-first walk over ``Children/Element``; the root's own elements on the first level)."""

    def walk(tree: Any) -> Iterator[Any]:
        children = tree.findall("./Children/Element") or tree.findall("./Element")
        for item in children:
            if item.find("./Data/Image") is not None:
                yield item
            if item.findall("./Children/Element/Data"):
                yield from walk(item)

    yield from walk(root)


def _dims_of(element: Any) -> tuple[list[_Dim], list[tuple[int, int, str]]]:
    """(dimensions in storage order, channels as (BytesInc, Resolution, LUTName))."""
    desc = "./Data/Image/ImageDescription"
    dims = [
        _Dim(int(d.attrib["DimID"]), int(d.attrib["NumberOfElements"]), int(d.attrib.get("BytesInc", 0)))
        for d in element.findall(f"{desc}/Dimensions/DimensionDescription")
    ]
    channels = [
        (int(c.attrib.get("BytesInc", 0)), int(c.attrib.get("Resolution", 8)), c.attrib.get("LUTName", ""))
        for c in element.findall(f"{desc}/Channels/ChannelDescription")
    ]
    return dims, channels


def _check_geometry(name: str, dims: Sequence[_Dim], channel_offsets: Sequence[int], itemsize: int, block: int) -> None:
    """Raise ValueError unless every plane is contiguous and lies inside the memory block."""
    if len(dims) < 2:
        raise ValueError(f"image {name!r} declares {len(dims)} dimension(s); a plane needs 2")
    if any(d.size < 1 for d in dims):
        raise ValueError(f"image {name!r} declares an empty dimension")
    fast, slow = dims[0], dims[1]
    if fast.bytes_inc != itemsize or (slow.size > 1 and slow.bytes_inc != fast.size * itemsize):
        raise ValueError(
            f"image {name!r}: plane {fast.label}{slow.label} is not stored contiguously "
            f"(byte steps {fast.bytes_inc}, {slow.bytes_inc} for {itemsize}-byte pixels)"
        )
    if min(channel_offsets) < 0 or any(d.bytes_inc < 0 for d in dims):
        raise ValueError(f"image {name!r} declares negative byte offsets")
    last = max(channel_offsets) + sum((d.size - 1) * d.bytes_inc for d in dims[2:])
    end = last + fast.size * slow.size * itemsize
    if end > block:
        raise ValueError(f"image {name!r}: its planes reach byte {end} of a {block}-byte memory block")


def _field_names(names: Sequence[str]) -> list[str]:
    """Image names as fields: no leading/trailing '/', no empty parts, printable, unique."""
    out: list[str] = []
    seen: set[str] = set()
    for raw in names:
        parts = [p.strip() for p in str(raw).split("/") if p.strip()]
        base = "/".join("".join(ch if ch.isprintable() else "_" for ch in p) for p in parts) or "image"
        name, k = base, 1
        while name in seen:
            k += 1
            name = f"{base}#{k}"
        seen.add(name)
        out.append(name)
    return out


class LifSource(SourceAdapter):
    """A LIF file: one tensor per image, fields named after the images (module docstring)."""

    format_name = "lif"

    def __init__(self, path: Path) -> None:
        from readlif.reader import LifFile

        path = Path(path)
        try:
            # readlif parses from a handle we close (given a path it leaks the handle when
            # the parse fails); pixels are read through _LifFileReader, never through it.
            with open(path, "rb") as fh:
                lif = LifFile(fh)
        except (ValueError, KeyError, IndexError, UnicodeDecodeError, EOFError) as exc:
            # readlif signals damage with assorted exceptions (bad magic, short header, ...).
            raise UnreadableSource(path, f"readlif cannot parse the file: {type(exc).__name__}: {exc}") from exc
        file_size = os.stat(path).st_size
        elements = list(_image_elements(lif.xml_root))
        if len(elements) != lif.num_images:
            raise UnreadableSource(path, f"XML lists {len(elements)} images but readlif found {lif.num_images}")
        if lif.num_images == 0:
            raise UnreadableSource(path, "the LIF file holds no images")
        version = file_content_version(path)
        reader = _LifFileReader(path)
        images = [lif.get_image(i) for i in range(lif.num_images)]
        tensors: dict[str, TensorAdapter] = {}
        for field, image, element in zip(_field_names([im.name for im in images]), images, elements):
            tensor = _build_tensor(reader, image, element, file_size, version)
            tensors[field] = normalize_axes(tensor)
        super().__init__(path, tensors, metadata={"images": [im.name for im in images]})


def _build_tensor(reader: _LifFileReader, image: Any, element: Any, file_size: int, version: bytes) -> LifAdapter:
    """Validate one image against the file (geometry, bit depth, truncation) and wrap it."""
    path, name = reader.path, image.name
    dims, channels = _dims_of(element)
    if not channels:
        raise UnreadableSource(path, f"image {name!r} describes no channels")
    resolutions = sorted({res for _inc, res, _lut in channels})
    if resolutions[-1] > 16 or resolutions[0] < 1:
        raise UnreadableSource(path, f"image {name!r}: {resolutions}-bit pixels are not supported (1-16 bits)")
    itemsize = 1 if resolutions[-1] <= 8 else 2
    if resolutions[0] <= 8 < resolutions[-1]:
        raise UnreadableSource(path, f"image {name!r} mixes 8-bit and 16-bit channels {resolutions}")
    start, length = (int(v) for v in image.offsets)
    nbytes = prod(d.size for d in dims) * len(channels) * itemsize
    if length < nbytes or start + nbytes > file_size:
        # readlif records a cut-off block with its declared length, or with length 0 (and a
        # warning) when the cut falls before the block: both mean pixels are missing.
        have = max(0, min(length, file_size - start))
        raise UnreadableSource(
            path, f"truncated: image {name!r} needs {nbytes} bytes of pixels at offset {start}, the file holds {have}"
        )
    channel_offsets = [inc for inc, _res, _lut in channels]
    try:
        _check_geometry(name, dims, channel_offsets, itemsize, length)
    except ValueError as exc:
        raise UnreadableSource(path, str(exc)) from None
    metadata = {
        "name": name,
        "dims": {d.label: d.size for d in dims},
        "byte_steps": {d.label: d.bytes_inc for d in dims},
        "channel_byte_offsets": channel_offsets,
        "bit_depth": list(image.bit_depth),
        "channel_luts": [lut for _inc, _res, lut in channels],
        "mosaic_positions": list(image.mosaic_position),
        "settings": dict(image.settings or {}),
    }
    dtype = np.dtype(np.uint8 if itemsize == 1 else "<u2")
    return LifAdapter(reader, image, dims, channel_offsets, dtype, content_version=version, metadata=metadata)


def _open_lif(path: Path) -> LifSource:
    return LifSource(path)


register_format(
    FormatEntry(
        name="lif",
        opener=_open_lif,
        sniff=sniff_lif,
        extensions=(".lif",),
        priority=65,
        description="Leica LIF (LAS X / LAS AF), via readlif",
    )
)
