"""One server per folder: an exclusive ``flock`` on a lock file inside it, held for the
holder's life.

The chunk cache and the upload write dir are each written by one server at a time: two
writers would interleave segments, and a second server's boot sweep would delete the first
one's uploads in flight. The lock is an open file description's ``flock`` (released by the
kernel when the process dies, however it dies), so a stale lock file never blocks a start.
The holder writes its pid into the file, so a refusal names who holds the folder.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["FolderHeld", "FolderLock"]


class FolderHeld(RuntimeError):
    """Another server (another process, or another manager in this one) holds the folder."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        self.folder, self.pid = folder, pid
        super().__init__(f"{folder} is held by another tensor-server ({'pid ' + str(pid) if pid else 'pid unknown'})")


class FolderLock:
    """The lock on ``folder`` (its file ``name``), taken at construction without waiting;
    ``held`` (a ``FolderHeld`` subclass) is raised when another holder has it."""

    def __init__(self, folder: str | os.PathLike[str], name: str = "lock", held: type[FolderHeld] = FolderHeld) -> None:
        self.folder = Path(folder)
        # held open for the holder's life (the flock is the open file's); truncated only once ours
        self._file = open(self.folder / name, "a+")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            text = self._file.read(32).strip()
            self._file.close()
            raise held(self.folder, int(text) if text.isdigit() else None) from None
        self._file.truncate(0)
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    @property
    def held(self) -> bool:
        return not self._file.closed

    def release(self) -> None:
        """Give the folder up (idempotent)."""
        if not self._file.closed:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
