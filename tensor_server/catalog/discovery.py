"""Walk served roots and claim sources with the adapter registry.

A folder that is one source (OME-Zarr, a TIFF sequence, a DICOM series, NDTiff,
Micro-Manager) is claimed whole and not descended into; claim order is the registry's
priority (OME-Zarr before zarr, OME-TIFF before TIFF sequences). Files are claimed by
content first, extension second; files no format recognises are not sources and are skipped
silently (a README next to the data is not an error). Hidden entries are skipped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tensor_server.adapters.registry import HEAD_BYTES, FormatEntry, formats

__all__ = ["Claim", "discover"]


@dataclass(frozen=True)
class Claim:
    path: Path
    format: FormatEntry


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(HEAD_BYTES)
    except OSError:
        return b""


def _claim(path: Path, entries: list[FormatEntry]) -> FormatEntry | None:
    is_dir = path.is_dir()
    head = b"" if is_dir else _head(path)
    candidates = [e for e in entries if (e.folders if is_dir else e.files)]
    for e in candidates:
        if e.sniff is None:
            continue
        try:
            if e.sniff(path, head):
                return e
        except Exception:
            continue
    for e in candidates:
        if e.matches_extension(path):
            return e
    return None


def discover(root: str | os.PathLike[str], on_progress: Callable[[Path], None] | None = None) -> Iterator[Claim]:
    """Yield a Claim for every source under ``root`` (``root`` itself may be one)."""
    entries = formats()
    root = Path(root)
    if not root.exists():
        return
    claim = _claim(root, entries)
    if claim is not None:
        yield Claim(root, claim)
        return
    if not root.is_dir():
        return
    stack = [root]
    while stack:
        folder = stack.pop()
        if on_progress is not None:
            on_progress(folder)
        try:
            children = sorted(os.scandir(folder), key=lambda d: d.name)
        except OSError:
            continue
        subdirs = []
        for child in children:
            if child.name.startswith("."):
                continue
            path = Path(child.path)
            entry = _claim(path, entries)
            if entry is not None:
                yield Claim(path, entry)
            elif child.is_dir(follow_symlinks=False):
                subdirs.append(path)
        stack.extend(reversed(subdirs))
