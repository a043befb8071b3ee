"""Nikon ND2 files (modern chunk-map ND2 and legacy JPEG 2000 ND2), read with ``nd2``.

An ND2 file is a sequence of *frames*: one frame holds every channel (and RGB sample) of one
Y/X plane, and the acquisition loops (time T, stage positions P, Z stack, custom loops U) index
the frames in nesting order. ``Nd2Adapter`` serves the whole file as one tensor with the axes
``nd2`` reports in ``ND2File.sizes`` (singleton axes dropped, as ``nd2`` does), lower-cased:
loop axes first (``t``, ``p``, ``z``, ``u``), then the frame axes ``c``, ``y``, ``x`` and ``s``
(RGB samples). Stage positions are one ``p`` axis of the same tensor rather than one field per
position: every frame of an ND2 file has the same shape and dtype, so a single tensor holds
them and a client can step positions like any other axis. The source wraps the tensor with
``normalize_axes`` so clients see T, C, Z, Y, X last (``p`` in front, ``s`` last). A file of
several positions is also served as one image of them all, field ``positions``: the
positions in acquisition (``p``) order on a near-square grid, each in its own cell, named by
the XY position loop's point names (``core/positions.py``). No multi-position ND2 sample or
writer exists here: that image is tested through the same code on Micro-Manager's ``p``
axis and on a stand-in ``ND2File`` with a P loop (``tests/adapters/nd2_test.py``), never on a
real multi-position ND2 file.

Reads map the requested loop indices to frame numbers (``np.ravel_multi_index`` over the loop
axes in file order, exactly as ``nd2`` itself addresses frames), call ``ND2File.read_frame``
and crop C/Y/X/S out of each frame into an output allocated once. For uncompressed files
``read_frame`` returns a view onto the file's memory map, so a crop costs the pages it touches
and nothing more: ``read_block_shape`` is therefore None (design §3: the seed, a whole frame,
would floor every scaled read at the frame). For the same reason the adapter decimates
(design §4): a nearest read with a step selects only the frames on the step along the loop
axes and strides the mmap view inside each frame, never touching the skipped frames.

Compressed (lossless zlib) and legacy JPEG 2000 frames are decoded whole by ``read_frame``
and are still served correctly, only without the mmap saving. ``ND2File`` is not documented
as thread-safe (compressed and legacy reads seek a shared handle), so ``read_frame`` runs
under a per-file lock; the crop-copy out of the returned frame runs outside it. The file is
opened lazily through ``LazyHandle`` and closed by the idle reaper, never during a read; no
view onto the mmap outlives the call that made it (the reaper could not close the mmap
otherwise, and the contract forbids it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters._strided import StridedReads
from tensor_server.adapters.registry import FormatEntry, montage_gap, register_format
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter, TensorInfo
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.core.identity import file_content_version
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.positions import POSITIONS_FIELD, axis_positions, positions_montage
from tensor_server.core.units import MICROMETER, SECOND
from tensor_server.errors import UnreadableSource

__all__ = ["Nd2Adapter", "Nd2Source", "served_tensors", "sniff_nd2"]

#: First bytes of a modern ND2 file: the chunk magic 0x0ABECEDA, little-endian.
ND2_MAGIC = b"\xda\xce\xbe\x0a"
#: First bytes of a legacy ND2 file: the JPEG 2000 signature box (shared with plain .jp2).
LEGACY_ND2_MAGIC = b"\x00\x00\x00\x0cjP  "

# Frame axes in the order ``ND2File.sizes`` lists them, and their index in the 4-D frame
# model (channel, y, x, sample) this module reshapes every frame to.
_FRAME_AXES = {"C": 0, "Y": 1, "X": 2, "S": 3}


def sniff_nd2(path: Path, head: bytes) -> bool:
    """Modern ND2 by its chunk magic; legacy ND2 by the JPEG 2000 signature box *and* the
    ``.nd2`` suffix (the box alone is every ``.jp2`` file, which is not ours)."""
    if head.startswith(ND2_MAGIC):
        return True
    return head.startswith(LEGACY_ND2_MAGIC) and path.name.lower().endswith(".nd2")


class _FrameModel:
    """How one frame from ``ND2File.read_frame`` maps onto the tensor's frame axes.

    ``read_frame`` returns ``raw.reshape(H, W, nch, ncomp).transpose(2, 0, 1, 3).squeeze()``.
    ``nd2`` presents exactly 3 components per channel as RGB samples (``S``) and any other
    component count as plain channels (``C = componentCount``); this model reproduces that
    without depending on which singleton axes ``squeeze`` dropped.
    """

    def __init__(self, height: int, width: int, n_channels: int, n_components: int) -> None:
        self.height = height
        self.width = width
        self.n_channels = n_channels
        self.n_components = n_components

    def as_cyxs(self, frame: np.ndarray) -> np.ndarray:
        """``frame`` as a 4-D (channel, y, x, sample) view (no copy for an mmap frame)."""
        h, w, nch, ncomp = self.height, self.width, self.n_channels, self.n_components
        chyx = np.asarray(frame).reshape(nch, h, w, ncomp)  # re-inserts squeezed singletons
        if ncomp in (1, 3):
            return chyx
        # Components that are not RGB become channels: channel index = ch * ncomp + comp.
        hwcc = chyx.transpose(1, 2, 0, 3)  # back to the file's (H, W, ch, comp) order
        return hwcc.reshape(h, w, nch * ncomp).transpose(2, 0, 1)[..., np.newaxis]


class Nd2Adapter(StridedReads, TensorAdapter):
    """The frames of one ND2 file as a tensor in ``ND2File.sizes`` order (module docstring).

    ``read_block_shape`` is None: ``read_frame`` returns an mmap view for uncompressed files,
    so a crop reads only its own pages, and flooring scaled reads at the seed (a whole C/Y/X
    frame) would make every unit pay for a whole frame. ``decimates``: a step picks frames on
    the loop axes and strides the view inside a frame, so nearest never touches skipped data.
    """

    decimates = True
    reports_uniform_blocks = True

    def __init__(
        self,
        path: Path,
        handle: LazyHandle[Any],
        axes: Sequence[str],
        shape: Sequence[int],
        dtype: np.dtype,
        frame_model: _FrameModel,
        *,
        physical_scale: Sequence[float | None],
        physical_unit: Sequence[str | None],
        metadata: dict[str, Any],
    ) -> None:
        self.path = path
        self._handle = handle
        self._read_lock = threading.Lock()
        self._frame_model = frame_model
        self.axes = tuple(axes)  # nd2's own axis letters, upper-case, in file order
        self._loop_axes = tuple(i for i, a in enumerate(self.axes) if a not in _FRAME_AXES)
        self._frame_axes = tuple(i for i, a in enumerate(self.axes) if a in _FRAME_AXES)
        self._loop_shape = tuple(int(shape[i]) for i in self._loop_axes)
        # Row-major frame strides over the loop axes: np.ravel_multi_index, precomputed
        # (a NumPy call per frame cost more than reading an mmap frame).
        self._loop_strides = tuple(
            int(np.prod(self._loop_shape[k + 1 :], dtype=np.int64)) for k in range(len(self._loop_shape))
        )
        # The seed is one whole frame (C/Y/X/S), the unit nd2 addresses; see read_block_shape.
        seed = tuple(1 if i in self._loop_axes else int(n) for i, n in enumerate(shape))
        super().__init__(
            TensorInfo(
                shape,
                dtype,
                dim_labels=[a.lower() for a in self.axes],
                native_chunk_shape=seed,
                physical_scale=physical_scale,
                physical_unit=physical_unit,
                content_version=file_content_version(path),
                metadata=metadata,
            )
        )

    @property
    def read_block_shape(self) -> tuple[int, ...] | None:
        """None: a frame is an mmap view, so a crop costs its own pages (design §3)."""
        return None

    def uniform_blocks(self, bounds: Bounds) -> list[tuple[Bounds, np.generic]]:
        """Frames missing from the file's chunk map (an acquisition stopped early, a
        skipped position) read as zeros (``nd2``'s missing-frame rule): each is one block of
        one frame. Legacy (JPEG 2000) files have no chunk map here and report none."""
        missing = self._missing_frames()
        if not missing:
            return []
        zero = np.zeros((), self.dtype)[()]
        loop_ranges = [range(bounds.start[i], bounds.stop[i]) for i in self._loop_axes]
        out = []
        for coords in itertools.product(*loop_ranges):
            if self.frame_index(coords) in missing:
                start, stop = [0] * self.ndim, list(self.shape)
                for i, c in zip(self._loop_axes, coords):
                    start[i], stop[i] = c, c + 1
                out.append((Bounds(tuple(start), tuple(stop)), zero))
        return out

    def _missing_frames(self) -> frozenset[int]:
        """Frame numbers with no ``ImageDataSeq`` chunk, once per content version."""
        cached = getattr(self, "_missing", None)
        if cached is not None and cached[0] == self.content_version:
            return cached[1]
        total = int(np.prod(self._loop_shape, dtype=np.int64))
        with self._handle.use() as nd2_file:
            offsets = getattr(getattr(nd2_file, "_rdr", None), "_frame_offsets", None)
            missing = frozenset() if not isinstance(offsets, dict) else frozenset(range(total)) - offsets.keys()
        self._missing = (self.content_version, missing)
        return missing

    def close(self) -> None:
        """Close the file now (waiting for reads in flight); the next read reopens it."""
        self._handle.close()

    def frame_index(self, loop_coords: Sequence[int]) -> int:
        """Frame number of the loop coordinates (file order), as ``nd2`` addresses frames."""
        number = 0
        for i, n, stride in zip(loop_coords, self._loop_shape, self._loop_strides, strict=True):
            if not 0 <= i < n:
                raise IndexError(f"loop index {i} outside 0..{n - 1}")
            number += int(i) * stride
        return number

    def _read_strided(self, bounds: Bounds, step: tuple[int, ...]) -> np.ndarray:
        """``get_data(bounds)[::step]``, decoding only the frames on the step (design §4)."""
        """Read ``bounds`` with ``step`` into one owned output: frames on the step only."""
        picks = [range(a, b, s) for a, b, s in zip(bounds.start, bounds.stop, step)]
        out = np.empty(tuple(len(r) for r in picks), dtype=self.dtype)
        # Index into the 4-D (c, y, x, s) frame model: a strided slice per present frame
        # axis, 0 for frame axes nd2 dropped as singletons.
        in_frame: list[Any] = [0, 0, 0, 0]
        for i in self._frame_axes:
            r = picks[i]
            in_frame[_FRAME_AXES[self.axes[i]]] = slice(r.start, r.stop, r.step)
        in_frame_t = tuple(in_frame)
        loop_ranges = [picks[i] for i in self._loop_axes]
        loop_positions = [range(len(r)) for r in loop_ranges]
        number = -1
        try:
            with self._handle.use() as nd2_file:
                for coords, where in zip(itertools.product(*loop_ranges), itertools.product(*loop_positions)):
                    number = self.frame_index(coords)
                    try:
                        with self._read_lock:
                            frame = nd2_file.read_frame(number)
                        # out[where] holds the present frame axes in C, Y, X, S order.
                        out[where] = self._frame_model.as_cyxs(frame)[in_frame_t]
                    finally:
                        # No view onto the mmap may outlive the handle pin (the reaper
                        # could not close the map, and views must never leave the call).
                        frame = None
        except UnreadableSource:
            raise
        except (OSError, ValueError, RuntimeError, EOFError, IndexError) as exc:
            where_msg = f"frame {number}" if number >= 0 else "the file"
            raise UnreadableSource(self.path, f"nd2 could not read {where_msg}: {type(exc).__name__}: {exc}") from exc
        return out


class Nd2Source(SourceAdapter):
    """An ND2 file: one tensor, field ``image`` (all positions on a ``p`` axis), and its
    positions as one image (``positions``) when it has several."""

    format_name = "nd2"

    def __init__(self, path: Path) -> None:
        import nd2

        path = Path(path)
        handle: LazyHandle[Any] = LazyHandle(lambda: nd2.ND2File(path), name=str(path))
        # Parse the header once now (open must fail loudly on a damaged file); the reaper
        # closes the handle when the source sits idle.
        try:
            with handle.use() as f:
                tensor, metadata = _describe(path, f, handle)
        except BaseException:
            handle.close()  # a file that fails to describe must not keep its descriptor
            raise
        super().__init__(path, served_tensors(tensor, metadata), metadata=metadata)


def served_tensors(tensor: Nd2Adapter, metadata: dict[str, Any]) -> dict[str, TensorAdapter]:
    """The file's tensor in canonical order (``image``) and, with several positions, their
    montage (``positions``; its layout is that tensor's metadata, published on its descriptor)."""
    image = normalize_axes(tensor)
    tensors: dict[str, TensorAdapter] = {"image": image}
    montage = positions_montage(axis_positions(image, metadata.get("positions") or []), montage_gap())
    if montage is not None:
        tensors[POSITIONS_FIELD] = montage
    return tensors


def _describe(path: Path, f: Any, handle: LazyHandle[Any]) -> tuple[Nd2Adapter, dict[str, Any]]:
    """Build the adapter from an open ``ND2File``: axes, frame model, scales, metadata."""
    sizes = dict(f.sizes)
    axes = list(sizes)
    shape = [int(sizes[a]) for a in axes]
    if any(n < 1 for n in shape):
        raise UnreadableSource(path, f"nd2 reports a non-positive axis size: {sizes}")
    frame_axes = [a for a in axes if a in _FRAME_AXES]
    if axes[len(axes) - len(frame_axes) :] != frame_axes or frame_axes != sorted(frame_axes, key=_FRAME_AXES.get):
        raise UnreadableSource(path, f"unexpected ND2 axis order {''.join(axes)} (frame axes must be last, C/Y/X/S)")
    attrs = f.attributes
    n_channels = int(attrs.channelCount or 1)
    n_components = int(attrs.componentCount) // n_channels
    model = _FrameModel(int(attrs.heightPx), int(attrs.widthPx or 1), n_channels, n_components)

    voxel = f.voxel_size()
    calibrated = _calibrated_axes(f)
    spatial = {"X": voxel.x, "Y": voxel.y, "Z": voxel.z}
    time_step = _time_step_s(f)
    scale: list[float | None] = []
    unit: list[str | None] = []
    for a in axes:
        if a in spatial and calibrated.get(a, True) and spatial[a] and spatial[a] > 0:
            scale.append(float(spatial[a]))
            unit.append(MICROMETER)
        elif a == "T" and time_step is not None:
            scale.append(time_step)
            unit.append(SECOND)
        else:
            scale.append(None)
            unit.append(None)

    metadata: dict[str, Any] = {
        "nd2_version": ".".join(str(v) for v in f.version),
        "legacy": bool(f.is_legacy),
        "sizes": sizes,
        "channel_names": _channel_names(f),
        "voxel_size_um": {"x": voxel.x, "y": voxel.y, "z": voxel.z},
        "bits_significant": attrs.bitsPerComponentSignificant,
        "compression": attrs.compressionType,
        "frame_count": attrs.sequenceCount,
        "loops": [{"type": loop.type, "count": loop.count} for loop in f.experiment],
    }
    if "P" in sizes:
        metadata["positions"] = _position_names(f)
    tensor = Nd2Adapter(
        path,
        handle,
        axes,
        shape,
        np.dtype(f.dtype),
        model,
        physical_scale=scale,
        physical_unit=unit,
        metadata=metadata,
    )
    return tensor, metadata


def _calibrated_axes(f: Any) -> dict[str, bool]:
    """Which of X/Y/Z carry a real calibration (nd2 reports 1.0 µm for uncalibrated axes)."""
    try:
        cal = f.metadata.channels[0].volume.axesCalibrated
        return {"X": bool(cal[0]), "Y": bool(cal[1]), "Z": bool(cal[2])}
    except Exception:  # legacy files have no structured channel metadata
        return {}


def _time_step_s(f: Any) -> float | None:
    """The period of a single regular time loop, in seconds (None when irregular/unknown)."""
    loops = [loop for loop in f.experiment if loop.type in ("TimeLoop", "NETimeLoop")]
    if len(loops) != 1 or loops[0].type != "TimeLoop":
        return None
    period = getattr(loops[0].parameters, "periodMs", 0.0) or 0.0
    return float(period) / 1000.0 if period > 0 else None


def _position_names(f: Any) -> list[str]:
    """The XY position loop's point names, in ``p`` order ("" where a point has none)."""
    for loop in f.experiment:
        if loop.type == "XYPosLoop":
            return [point.name or "" for point in loop.parameters.points]
    return []


def _channel_names(f: Any) -> list[str]:
    try:
        return [c.channel.name for c in (f.metadata.channels or [])]
    except Exception:
        return []


def _open_nd2(path: Path) -> Nd2Source:
    return Nd2Source(path)


register_format(
    FormatEntry(
        name="nd2",
        opener=_open_nd2,
        sniff=sniff_nd2,
        extensions=(".nd2",),
        priority=65,
        description="Nikon NIS-Elements ND2 (modern and legacy JPEG 2000), via nd2",
    )
)
