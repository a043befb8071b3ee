"""Has a file changed since a source opened it? One ``stat``, compared with the one at open.

Shared by the TIFF family's ``stale_reason``: a file rewritten in place must not be read
through what was parsed from its old bytes (offsets, pages), nor mixed with chunks already
served from it; the stamp is the content version (``core.identity.file_stat_stamp``: size,
mtime, ctime and inode, so a rewrite whose mtime was set back is still seen).
"""

from __future__ import annotations

import os

from tensor_server.core.identity import file_content_version

__all__ = ["file_stamp", "changed_since"]


def file_stamp(path: str | os.PathLike[str]) -> bytes | None:
    """The file's stamp (its content version), or None when it cannot be stat'ed."""
    try:
        return file_content_version(path)
    except OSError:
        return None


def changed_since(path: str | os.PathLike[str], stamp: bytes | None) -> str | None:
    """Why ``path`` no longer matches ``stamp`` (taken at open), or None."""
    now = file_stamp(path)
    if now == stamp:
        return None
    return f"{os.path.basename(path)} was {'removed' if now is None else 'rewritten'} since it was opened"
