"""Walk served roots and claim sources with the adapter registry.

A folder that is one source (OME-Zarr, a DICOM series, NDTiff, Micro-Manager) is claimed
whole and not descended into; a folder format made of one kind of file (a TIFF sequence,
``FormatEntry.claims``) owns only those files, and the folder's other entries are still
looked at (a ``.map`` beside the planes is a source too). Claim order is the registry's
priority (OME-Zarr before zarr, OME-TIFF before TIFF sequences). Files are claimed by
content first, extension second; files no format recognises are not sources and are skipped
silently (a README next to the data is not an error). Hidden entries are skipped.

Nothing under a root may stop the walk: only regular files and folders are looked at (a
FIFO would block the first read forever; sockets and devices are not data), a symlink loop
or a dangling link is skipped, and by default a symlink whose target leaves the served roots
is not followed (it would serve any file the server can read, e.g. ``/etc/passwd``). Each
skipped entry is reported through ``on_skip`` with the reason, and the walk goes on.

A walk a client asks for (``add_source``) carries a ``WalkBudget``: every directory entry
looked at is spent from it, and the walk stops with ``ResourceExhausted`` once it has looked
at ``max_entries`` or run ``max_seconds``, or with ``ReadCancelled`` as soon as the client has
gone. Folders in ``exclude`` (served roots, the write dir, the cache) are not entered.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensor_server.adapters.registry import FormatEntry, claim_format, formats
from tensor_server.errors import ReadCancelled, ResourceExhausted

__all__ = ["Claim", "WalkBudget", "discover", "links_leaving"]


@dataclass
class WalkBudget:
    """What one client-asked walk may spend (see the module docstring)."""

    max_entries: int = 100_000
    max_seconds: float = 60.0
    cancelled: Callable[[], bool] | None = None
    entries: int = 0
    started: float = field(default_factory=time.monotonic)

    def spend(self, what: Path) -> None:
        """Count one entry; stop the walk when the client went or the budget is spent."""
        self.entries += 1
        if self.cancelled is not None and self.cancelled():
            raise ReadCancelled(f"the walk of {what} was stopped: the client went away")
        if self.entries > self.max_entries:
            raise ResourceExhausted(
                f"the walk stopped at {what}: it looked at {self.max_entries} entries, the "
                "limit of one request; add a smaller folder"
            )
        if time.monotonic() - self.started > self.max_seconds:
            raise ResourceExhausted(
                f"the walk stopped at {what}: it ran {self.max_seconds:g} s, the limit of one "
                "request; add a smaller folder"
            )


@dataclass(frozen=True)
class Claim:
    """A source found by the walk; ``format`` None: a file whose format its opener sniffs
    (``discover(claim_files=False)``)."""

    path: Path
    format: FormatEntry | None


OUTSIDE_ROOTS = "symlink to a target outside the served roots: not followed (follow_symlinks_outside_roots = false)"


def _within(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def _refusal(path: Path, allowed: Sequence[str] | None) -> tuple[str | None, bool]:
    """(why ``path`` must not be opened or None, whether it is a folder). Never opens it."""
    try:
        link = os.path.islink(path)
        st = os.stat(path)  # follows a link: the target decides what the entry is
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop", False
        return f"cannot stat ({exc.strerror or exc}){' (dangling symlink)' if os.path.islink(path) else ''}", False
    if link and allowed is not None and not any(_within(os.path.realpath(path), r) for r in allowed):
        return OUTSIDE_ROOTS, False
    if stat.S_ISDIR(st.st_mode):
        return None, True
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, socket or device): not opened", False
    return None, False


#: entries of a folder source looked at for symlinks out of the roots (a bigger store is
#: checked up to this many entries: enough for every chunk file of a zarr array of 1e5 chunks)
LINK_CHECK_ENTRIES = 200_000


def links_leaving(
    folder: Path, allowed: Sequence[str | os.PathLike[str]], limit: int = LINK_CHECK_ENTRIES
) -> list[str]:
    """Paths (relative to ``folder``) of symlinks inside a folder source whose targets leave
    ``allowed``: a zarr chunk or a TIFF plane linked to a file outside the roots would be
    read by its format library without ever passing discovery. Symlinked folders are
    reported, not entered; at most ``limit`` entries are looked at (no stat: the directory
    entry says whether it is a link)."""
    roots = [os.path.realpath(r) for r in allowed]
    found: list[str] = []
    seen = 0
    stack = [str(folder)]
    while stack and seen < limit:
        try:
            with os.scandir(stack.pop()) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.is_symlink():
                if not any(_within(os.path.realpath(entry.path), r) for r in roots):
                    found.append(os.path.relpath(entry.path, folder))
            elif entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return found


def _listing(folder: Path, budget: WalkBudget | None) -> list[os.DirEntry]:
    """A folder's entries; under a budget, no more than it has left (plus one, to trip it),
    so a folder of ten million files is not listed whole first."""
    with os.scandir(folder) as it:
        if budget is None:
            return list(it)
        return list(itertools.islice(it, max(0, budget.max_entries - budget.entries) + 1))


def discover(
    root: str | os.PathLike[str],
    on_progress: Callable[[Path], None] | None = None,
    *,
    allowed_roots: Sequence[str | os.PathLike[str]] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
    budget: WalkBudget | None = None,
    exclude: Sequence[str | os.PathLike[str]] = (),
    known: Callable[[Path, bool], FormatEntry | None] | None = None,
    on_unclaimed: Callable[[Path], None] | None = None,
    claim_files: bool = True,
) -> Iterator[Claim]:
    """Yield a Claim for every source under ``root`` (``root`` itself may be one).

    ``allowed_roots``: folders a symlink's target must lie in to be followed (None: follow
    every symlink). ``on_skip(path, reason)`` hears about every entry refused on the way.
    ``budget``: spent per entry (raises when spent, see ``WalkBudget``). ``exclude``: folders
    not entered (nor claimed). ``known(path, is_dir)``: the format a caller already knows the
    entry has (a rescan of an unchanged file), asked before sniffing, so a rescan only stats
    what it knows. ``on_unclaimed(path)`` hears about each file no format recognises (``list``
    prints them). ``claim_files`` False: a file not ``known`` is yielded with no format, unsniffed:
    the caller's opener sniffs it (where the work runs in parallel), and reports the files no
    format recognises itself."""
    entries = formats()
    root = Path(root)
    allowed = None if allowed_roots is None else [os.path.realpath(r) for r in allowed_roots]
    excluded = {os.path.realpath(e) for e in exclude}

    def refused(path: Path) -> tuple[bool, bool]:
        reason, is_dir = _refusal(path, allowed)
        if reason is not None and on_skip is not None:
            on_skip(path, reason)
        return reason is not None, is_dir

    if not os.path.lexists(root):
        return
    skip, is_dir = refused(root)
    if skip:
        return

    def claimed(path: Path, is_dir: bool) -> FormatEntry | None:
        return (known(path, is_dir) if known is not None else None) or claim_format(path, is_dir, entries)

    if not is_dir and not claim_files:
        yield Claim(root, known(root, False) if known is not None else None)
        return
    claim = claimed(root, is_dir)
    if claim is not None:
        yield Claim(root, claim)
        if not (is_dir and claim.claims):
            return
    if not is_dir:
        return
    # (folder, suffixes of entries a folder source there already owns)
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, claim.claims if claim is not None else ())]
    while stack:
        folder, owned = stack.pop()
        if on_progress is not None:
            on_progress(folder)
        try:
            children = sorted(_listing(folder, budget), key=lambda d: d.name)
        except OSError as exc:
            if on_skip is not None:
                on_skip(folder, f"cannot list ({exc.strerror or exc})")
            continue
        subdirs = []
        for child in children:
            if budget is not None:
                budget.spend(Path(child.path))
            if child.name.startswith(".") or (owned and child.name.lower().endswith(owned)):
                continue
            if excluded and os.path.realpath(child.path) in excluded:
                continue
            path = Path(child.path)
            skip, is_dir = refused(path)
            if skip:
                continue
            if not is_dir and not claim_files:
                yield Claim(path, known(path, False) if known is not None else None)
                continue
            entry = claimed(path, is_dir)
            if entry is not None:
                yield Claim(path, entry)
            elif not is_dir and on_unclaimed is not None:
                on_unclaimed(path)
            if is_dir and not child.is_symlink() and (entry is None or entry.claims):
                subdirs.append((path, entry.claims if entry is not None else ()))  # a linked folder: only when claimed
        stack.extend(reversed(subdirs))
