"""One DICOM file: its header parsed once, and one frame decoded at a time (used by dicom.py).

Kept apart from the adapters so the parsing and frame-decoding step can be read and tested on
its own (key -> byte range -> read -> decode, as in tifffile's zarr store). The leading
underscore keeps the adapters package from importing it as a format module.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.adapters.registry import open_budgeted
from tensor_server.errors import UnreadableSource

__all__ = ["DicomFile", "WSI_SOP_CLASS"]

WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"
_PIXEL_KEYWORDS = {
    (0x7FE0, 0x0010): "PixelData",
    (0x7FE0, 0x0008): "FloatPixelData",
    (0x7FE0, 0x0009): "DoubleFloatPixelData",
}


@dataclass
class DicomFile:
    """A DICOM instance parsed up to its pixel data; ``decode(i)`` returns frame ``i``."""

    path: Path
    ds: Any  # pydicom Dataset without the pixel data
    opts: dict[str, Any]
    value_offset: int
    nframes: int
    rows: int
    cols: int
    samples: int
    _offsets_checked: bool = field(default=False, repr=False)
    _offsets_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def parse(cls, path: Path, *, force: bool = False) -> DicomFile:
        import pydicom
        from pydicom.pixels import as_pixel_options

        with open_budgeted(path) as fh:  # a huge zero-filled "x.dcm" must not parse for days
            ds = pydicom.dcmread(fh, stop_before_pixels=True, force=force)
            meta = getattr(ds, "file_meta", None)
            tsyntax = meta.get("TransferSyntaxUID") if meta is not None else None
            if not tsyntax:
                raise UnreadableSource(path, "no Transfer Syntax UID: not a DICOM file with pixel data")
            if tsyntax.is_deflated:
                raise UnreadableSource(path, f"transfer syntax {tsyntax.name} (deflated dataset) is not supported")
            if "Rows" not in ds or "Columns" not in ds:
                raise UnreadableSource(path, "DICOM object has no image (no Rows/Columns)")
            tag_pos = fh.tell()
            head = fh.read(8)
            if len(head) < 8:
                raise UnreadableSource(path, "DICOM object has no pixel data")
            endian = "<" if tsyntax.is_little_endian else ">"
            opts: dict[str, Any] = {}
            if tsyntax.is_implicit_VR:
                group, elem, length = struct.unpack(f"{endian}HHL", head)
                offset = tag_pos + 8
            else:
                group, elem, vr, _ = struct.unpack(f"{endian}HH2sH", head)
                offset = tag_pos + 12
                opts["pixel_vr"] = vr.decode("ascii", "replace")
                length = struct.unpack(f"{endian}L", fh.read(4) or b"\0\0\0\0")[0]
            keyword = _PIXEL_KEYWORDS.get((group, elem))
            if keyword is None:
                raise UnreadableSource(path, "DICOM object has no pixel data")
        opts.update(as_pixel_options(ds))
        opts["transfer_syntax_uid"] = tsyntax
        opts["pixel_keyword"] = keyword
        nframes = int(opts["number_of_frames"])
        rows, cols, samples = int(ds.Rows), int(ds.Columns), int(ds.get("SamplesPerPixel", 1) or 1)
        if rows < 1 or cols < 1 or nframes < 1:
            raise UnreadableSource(path, f"DICOM image of {nframes} x {rows} x {cols} pixels")
        if not tsyntax.is_encapsulated:  # native: the whole pixel block must be in the file
            from pydicom.pixels.utils import get_expected_length

            need = get_expected_length(ds, "bytes")
            have = os.path.getsize(path) - offset
            if have < need or (length != 0xFFFFFFFF and length < need):
                raise UnreadableSource(path, f"pixel data truncated: {have} bytes for {need}")
        return cls(Path(path), ds, opts, offset, nframes, rows, cols, samples)

    def _frame_offsets(self) -> None:
        """Give pydicom an offset table when the file has none (neither Basic nor Extended).

        Without one, pydicom walks every fragment header from the start to find frame ``i``,
        on every decode: O(frames) per tile of a large slide. When each frame is one fragment
        (the usual WSI layout) the fragment positions are scanned once here and passed as
        ``extended_offsets``, so each later decode seeks straight to its fragment."""
        from pydicom.encaps import parse_basic_offsets, parse_fragments

        with self._offsets_lock:
            if self._offsets_checked:
                return
            with open(self.path, "rb") as fh:
                fh.seek(self.value_offset)
                if not parse_basic_offsets(fh) and self.nframes > 1:
                    after_bot = fh.tell()
                    count, positions = parse_fragments(fh)
                    if count == self.nframes:
                        lengths = []
                        for pos in positions:
                            fh.seek(pos + 4)
                            lengths.append(struct.unpack("<L", fh.read(4))[0])
                        offsets = ([p - after_bot for p in positions], lengths)
                        self.opts = {**self.opts, "extended_offsets": offsets}  # rebind, never mutate
            self._offsets_checked = True

    def decode(self, index: int) -> np.ndarray:
        from pydicom.pixels import get_decoder

        try:
            ts = self.opts["transfer_syntax_uid"]
            if ts.is_encapsulated and "extended_offsets" not in self.opts and not self._offsets_checked:
                self._frame_offsets()
            decoder = get_decoder(ts)
            with open(self.path, "rb") as fh:
                fh.seek(self.value_offset)
                arr, _ = decoder.as_array(fh, index=index, validate=True, **self.opts)
        except UnreadableSource:
            raise
        except Exception as exc:  # missing plugin, corrupt fragment, truncated file, ...
            ts = self.opts["transfer_syntax_uid"]
            raise UnreadableSource(
                self.path, f"cannot decode frame {index} ({ts.name}): {type(exc).__name__}: {exc}"
            ) from exc
        if arr.shape[:2] != (self.rows, self.cols):
            raise UnreadableSource(self.path, f"frame {index} decoded to {arr.shape}, expected {self.rows}x{self.cols}")
        return arr

    @property
    def transfer_syntax(self) -> Any:
        return self.opts["transfer_syntax_uid"]

    @property
    def is_wsi(self) -> bool:
        return str(self.ds.get("SOPClassUID", "")) == WSI_SOP_CLASS and "TotalPixelMatrixRows" in self.ds
