"""One walk of a local store folder: every file by its store key, with a stat on demand.

Shared by the zarr adapter's two needs of the same listing at open: the chunk-file stamps
(stale-data checks, the content version) and the stored chunk keys (uniform blocks: an
absent key reads as the fill value). One listing serves both, so they agree.
"""

from __future__ import annotations

import os

from tensor_server.core.identity import file_stat_stamp

__all__ = ["ABSENT", "stored_files", "file_stamp_of"]

#: The stamp of a chunk file that does not exist.
ABSENT = (-1, -1, -1, -1)


def stored_files(folder: str | os.PathLike[str]) -> dict[str, os.DirEntry[str]]:
    """Every file under ``folder`` by its store key relative to it (``c/0/1``, ``0.1``,
    ``0/1``), in one walk. Linked folders are followed, once each (zarr reads through them);
    unreadable ones are skipped."""
    out: dict[str, os.DirEntry[str]] = {}
    seen: set[str] = set()
    stack = [(os.fspath(folder), "")]
    while stack:
        path, prefix = stack.pop()
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir():
                        stack.append((entry.path, f"{prefix}{entry.name}/"))
                    else:
                        out[prefix + entry.name] = entry
        except OSError:
            continue
    return out


def file_stamp_of(entry: os.DirEntry[str] | None) -> tuple[int, ...]:
    """``file_stat_stamp`` of a listed file (of its target, for a link), or ABSENT."""
    if entry is None:
        return ABSENT
    try:
        st = entry.stat()
    except FileNotFoundError:  # a dangling link, or removed since the listing
        return ABSENT
    return file_stat_stamp(st)
