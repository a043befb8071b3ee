"""Format registry and ``open``: pick the adapter for a path by content, then by extension.

Format modules register themselves at import (``register_format``), xarray-backend style; a
module imports its format library only inside the opener, so registering costs nothing and
``import tensor_server`` stays light. Detection asks every format's ``sniff`` (magic bytes of
the file's first 4 KiB, or metadata files of a folder) in priority order before falling back
to extensions, so a misnamed file still opens and an OME-TIFF is not taken for a plain TIFF.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.montage import DEFAULT_GAP_FRACTION, check_gap_fraction
from tensor_server.errors import TensorServerError, UnknownFormat, UnreadableSource

__all__ = [
    "FormatEntry",
    "register_format",
    "formats",
    "claim_format",
    "detect_format",
    "open_source",
    "open_budgeted",
    "montage_gap",
    "montages_gapped",
    "HEAD_BYTES",
    "PROBE_BYTES",
]

HEAD_BYTES = 4096
#: most bytes a reader may parse through ``open_budgeted`` while opening one source
PROBE_BYTES = 64 << 20
_probe = threading.local()
# bytes literals a library quotes from the file (tifffile: "header=b'root'"): a reason is shown
# to every client, and the file may be one the server should never have read (/etc/passwd).
# Linear on any text (a reason may quote a client-chosen file at length): a literal opens only
# at b' or b", never at an escaped quote, so an attempt that finds no closing quote leaves no
# later opening of its kind to retry from (unlike a bare '"(?:[^"\\]|\\.)*"', quadratic on
# '"' + '\\"' x n: the issue 38 freeze).
_BYTES_LITERAL = re.compile(r"b'(?:[^'\\]|\\.)*'" + r'|b"(?:[^"\\]|\\.)*"')
_MAX_REASON = 500  # .deadline: time.monotonic() by which the open in this thread must end

Sniff = Callable[[Path, bytes], bool]
Opener = Callable[[Path], SourceAdapter]


@dataclass(frozen=True)
class FormatEntry:
    """One format: how to recognise it and how to open it.

    ``priority``: lower claims first (OME-Zarr before zarr, OME-TIFF before TIFF, a folder
    format before the files inside it). ``sniff(path, head)`` gets the first HEAD_BYTES of a
    file (``b""`` for a folder) and must be cheap and never raise. ``extensions`` are
    lower-case suffixes with the dot, multi-part allowed (``".ome.tif"``). ``claims``: for
    a folder format made of one kind of file (a TIFF sequence), the suffixes of the entries it
    owns; discovery still looks at the folder's other entries, so a ``.czi`` beside the planes
    is served too. Empty: the folder is claimed whole (OME-Zarr, DICOM series, ...).
    """

    name: str
    opener: Opener
    sniff: Sniff | None = None
    extensions: tuple[str, ...] = ()
    priority: int = 100
    folders: bool = False
    files: bool = True
    description: str = ""
    claims: tuple[str, ...] = field(default=())

    def matches_extension(self, path: Path) -> bool:
        name = path.name.lower().rstrip("/")
        return any(name.endswith(ext) for ext in self.extensions)


_lock = threading.Lock()
_formats: dict[str, FormatEntry] = {}


def register_format(entry: FormatEntry) -> FormatEntry:
    """Add (or replace, by name) a format."""
    with _lock:
        _formats[entry.name] = entry
    return entry


def formats() -> list[FormatEntry]:
    """Registered formats, in claim order."""
    _load_builtin()
    with _lock:
        return sorted(_formats.values(), key=lambda e: (e.priority, e.name))


def _load_builtin() -> None:
    import tensor_server.adapters  # noqa: F401  (its __init__ imports the builtin modules)


def _read_head(path: Path) -> tuple[bytes, OSError | None]:
    """The first HEAD_BYTES of a file (``b""`` for a folder), and the error when it cannot be read."""
    if path.is_dir():
        return b"", None
    try:
        with open(path, "rb") as fh:
            return fh.read(HEAD_BYTES), None
    except OSError as exc:
        return b"", exc


def claim_format(
    path: Path, is_dir: bool | None = None, entries: list[FormatEntry] | None = None
) -> FormatEntry | None:
    """The format that claims ``path`` (content first, extension second), or None: the one
    detection rule, used by ``detect_format`` and by discovery. A file whose head cannot be
    read (permission denied, an I/O error) is claimed by its extension alone, so it becomes
    a source whose open names the error instead of vanishing. ``is_dir`` saves a stat when
    the caller knows; ``entries`` saves sorting the registry per file in a walk."""
    is_dir = path.is_dir() if is_dir is None else is_dir
    head, _ = (b"", None) if is_dir else _read_head(path)
    candidates = [e for e in (formats() if entries is None else entries) if (e.folders if is_dir else e.files)]
    for entry in candidates:
        if entry.sniff is not None:
            try:
                if entry.sniff(path, head):
                    return entry
            except Exception:  # a sniffer must never take detection down
                continue
    for entry in candidates:
        if entry.matches_extension(path):
            return entry
    return None


class _BudgetedFile(io.FileIO):
    """A file that refuses to be read past a byte budget or the opening thread's deadline.
    Counting happens in ``readinto``, which the buffered reader above it calls per refill."""

    def __init__(self, path: Path, max_bytes: int, deadline: float | None) -> None:
        super().__init__(path, "rb")
        self._path, self._max, self._left, self._deadline = path, max_bytes, max_bytes, deadline

    def readinto(self, buffer) -> int | None:  # io signature
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise UnreadableSource(self._path, "gave up: opening ran past its deadline")
        n = super().readinto(buffer)
        self._left -= n or 0
        if self._left < 0:
            raise UnreadableSource(
                self._path, f"gave up: opening read more than {self._max} bytes without finding the image"
            )
        return n


def open_budgeted(path: str | os.PathLike[str], max_bytes: int = PROBE_BYTES) -> io.BufferedReader:
    """Open a file for a reader that parses its way through it while opening a source (e.g.
    DICOM elements up to the pixels): reading past ``max_bytes``, or past the deadline of the
    ``open_source`` call in this thread, raises UnreadableSource. A 1 TiB sparse file named
    ``.dcm`` is then given up on instead of being parsed for days."""
    return io.BufferedReader(_BudgetedFile(Path(path), max_bytes, getattr(_probe, "deadline", None)))


def detect_format(path: str | os.PathLike[str]) -> FormatEntry:
    """The format that claims ``path`` (``claim_format``), or an error naming why none does."""
    p = Path(path)
    if not p.exists():
        raise UnreadableSource(p, "no such file or directory")
    entry = claim_format(p)
    if entry is not None:
        return entry
    _, error = _read_head(p)
    if error is not None:
        raise UnreadableSource(p, f"cannot read: {error.strerror or error}")
    kind = "folder" if p.is_dir() else "file"
    raise UnknownFormat(p, f"no adapter recognises this {kind} (by content or extension)")


def open_source(
    path: str | os.PathLike[str],
    format: str | None = None,
    timeout: float | None = None,
    *,
    montage_gap: float = DEFAULT_GAP_FRACTION,
) -> SourceAdapter:
    """Open ``path`` as a SourceAdapter. Every failure is an UnreadableSource naming the path.
    ``timeout``: seconds after which files opened with ``open_budgeted`` refuse further reads.
    ``montage_gap``: the gap of the montages the source builds (a plate, its positions:
    ``core/montage.py``), which its format reads with ``montage_gap()``."""
    _probe.deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with montages_gapped(montage_gap):
            return _open(Path(path), format)
    finally:
        _probe.deadline = None


def montage_gap() -> float:
    """The gap fraction of the open running in this thread (the server's ``montage_gap``
    setting, ``montages_gapped``): handed to the format like the open's deadline, on the
    opening thread, so the openers keep their one-argument signature (plugins register those)."""
    return getattr(_probe, "montage_gap", DEFAULT_GAP_FRACTION)


@contextlib.contextmanager
def montages_gapped(gap: float) -> Iterator[None]:
    """``montage_gap()`` answers ``gap`` in this thread while the block runs: ``open_source``
    and the opens that do not go through it (an object store's zarr, ``catalog/remote.py``),
    so every plate a server opens is laid out with its setting."""
    previous = montage_gap()
    _probe.montage_gap = check_gap_fraction(gap)
    try:
        yield
    finally:
        _probe.montage_gap = previous


def _clean_reason(reason: str) -> str:
    """A failure reason fit to show clients: no bytes quoted from the file, bounded length."""
    reason = _BYTES_LITERAL.sub("<bytes>", reason)
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"


def _open(p: Path, format: str | None) -> SourceAdapter:
    try:
        return _open_unchecked(p, format)
    except UnreadableSource as exc:
        exc.reason = _clean_reason(exc.reason)
        exc.args = (f"{exc.path}: {exc.reason}",)
        raise


def _open_unchecked(p: Path, format: str | None) -> SourceAdapter:
    if format is not None:
        entries = {e.name: e for e in formats()}
        if format not in entries:
            raise UnknownFormat(p, f"unknown format {format!r}; known: {sorted(entries)}")
        entry = entries[format]
        if not p.exists():
            raise UnreadableSource(p, "no such file or directory")
    else:
        entry = detect_format(p)
    try:
        return entry.opener(p)
    except TensorServerError as exc:
        if isinstance(exc, UnreadableSource):
            raise
        raise UnreadableSource(p, f"{entry.name}: {exc}") from exc
    except MemoryError:
        raise
    except Exception as exc:  # any library error becomes one clear, named failure
        reason = f"{entry.name} reader failed: {type(exc).__name__}: {exc}"
        raise UnreadableSource(p, reason) from exc
