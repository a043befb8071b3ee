"""Render specs shared by the processes of a ``serve --workers N`` server: a spec posted to one
process is read by every other (``SharedSpecStore``), where a ``SpecStore`` alone keeps it in
the memory of the process that stored it (so a tile asked of another worker was a 400).

The folder (``cli_workers.render_specs_folder``: under the primary's chunk cache folder, which
every process is told) holds one file per spec, ``<id>.json``, its canonical JSON: content
addressed, so two processes storing the same spec write the same bytes, and a file is written
whole to a temporary name and renamed (``os.replace``), so a reader sees all of it or none.
The folder is bounded as the memory store is (``max_specs`` files, ``max_bytes``): after a
write past either bound the least recently used files go (a file's modification time is its
last use: a read touches it, at most once per ``TOUCH_SECONDS`` for a spec a process holds in
memory), each leaving an empty ``<id>.gone`` so that every process answers its id with the
404 that says to post it again; those markers are bounded too (``GONE_PER_SPEC`` per spec).
Each process keeps its own memory store in front (a tile's spec look-up reads no file).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tensor_server.errors import InvalidArgument
from tensor_server.render.spec import MAX_STORED_BYTES, MAX_STORED_SPECS, RenderSpec, SpecStore, parse_spec

__all__ = ["SharedSpecStore", "TOUCH_SECONDS", "GONE_PER_SPEC"]

TOUCH_SECONDS = 60.0
GONE_PER_SPEC = 4


class SharedSpecStore(SpecStore):
    """A ``SpecStore`` whose specs are files in ``folder``, read by every process (module docstring)."""

    def __init__(self, folder: Path, max_specs: int = MAX_STORED_SPECS, max_bytes: int = MAX_STORED_BYTES) -> None:
        super().__init__(max_specs, max_bytes)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._touched: dict[str, float] = {}
        self._disk_lock = threading.Lock()

    def put(self, spec: RenderSpec) -> str:
        key = super().put(spec)
        path = self.folder / f"{key}.json"
        if path.is_file():
            self._touch(path)
            return key
        tmp = self.folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_bytes(spec.canonical())
        os.replace(tmp, path)
        (self.folder / f"{key}.gone").unlink(missing_ok=True)
        self._bound()
        return key

    def _used(self, spec_id: str) -> None:
        now = time.monotonic()
        if now - self._touched.get(spec_id, -TOUCH_SECONDS) < TOUCH_SECONDS:
            return
        if len(self._touched) > 2 * self.max_specs:
            self._touched.clear()
        self._touched[spec_id] = now
        self._touch(self.folder / f"{spec_id}.json")

    def _load(self, spec_id: str) -> RenderSpec | None:
        path = self.folder / f"{spec_id}.json"
        try:
            spec = parse_spec(path.read_bytes())
        except (FileNotFoundError, InvalidArgument):
            return None  # never stored, evicted, or not a spec this server wrote
        if spec.id != spec_id:
            return None
        self._touch(path)
        return spec

    def _gone(self, spec_id: str) -> bool:
        return (self.folder / f"{spec_id}.gone").is_file()

    @staticmethod
    def _touch(path: Path) -> None:
        try:
            os.utime(path)
        except FileNotFoundError:
            pass  # evicted by another process meanwhile: this one still holds it in memory

    def _bound(self) -> None:
        """Evict least recently used files past the bounds, each leaving its ``.gone``."""
        with self._disk_lock:
            specs = _listed(self.folder, ".json")
            total = sum(size for _, size, _ in specs)
            count = len(specs)
            for _, size, path in specs:
                if count <= self.max_specs and total <= self.max_bytes:
                    break
                path.unlink(missing_ok=True)
                path.with_suffix(".gone").touch()
                count, total = count - 1, total - size
            gone = _listed(self.folder, ".gone")
            for _, _, path in gone[: max(0, len(gone) - GONE_PER_SPEC * self.max_specs)]:
                path.unlink(missing_ok=True)


def _listed(folder: Path, suffix: str) -> list[tuple[float, int, Path]]:
    """(modification time, size, path) of ``folder``'s files ending ``suffix``, oldest first."""
    out = []
    for path in folder.glob(f"*{suffix}"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # removed by another process meanwhile
        out.append((st.st_mtime, st.st_size, path))
    return sorted(out)
