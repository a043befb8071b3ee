"""One level of the catalog tree: what the ``catalog_children`` action answers.

A source's place is its url read as a path (the rule the biopb SDK documents), starting at
the served root it lies under, never at the filesystem's root: under the roots ``/x/a/data``
and ``/y/b/data``, ``file:///x/a/data/p/c.tif`` is ``c.tif`` in folder ``data/p`` and the other
root is the folder ``data (2)`` (each root named by its last path component, a repeat numbered
in the roots' order, as added paths' labels are). A server with a single root lists that
root's contents at the top. ``dnd://label/x.tif`` (a path added at runtime) is ``x.tif`` in
folder ``label``; a ``file://`` url under no root keeps its whole path; a source with no path
(in-memory data, ``scratch``, a remote URL's sources) sits at the top, named by its id.

A top folder name belongs to one thing: the roots claim theirs first (they are the server's
configuration, so their keys stay put), then added paths, then other paths; a later claimant
of a taken name is shown as ``name (2)``. Every folder whose place on disk is known carries
its full ``path`` (a root's own folder: the root as given, made absolute), and so does the
level (the top of a one-root server: that root).

A chain of folders with one child each is shown as one folder (``a/b``), ending where a
source sits or the chain forks, so a deep folder does not cost the user a click per path
component. Folders come first and share ``limit`` with the sources; both are in byte order
of name. A readable source that holds no tensor is not listed (there is nothing to open).
An unknown key is an empty level: a folder emptied since the client read its key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = ["tree_parts", "root_names", "root_top_names", "CatalogTree", "SourcePlaces", "DEFAULT_LIMIT", "MAX_LIMIT"]

DEFAULT_LIMIT = 2000
MAX_LIMIT = 100_000


def tree_parts(url: str) -> list[str]:
    """The path segments of ``url`` in the tree (empty when the url has no path)."""
    if url.startswith("file://"):
        body = url[len("file://") :]
        body = unquote(body) if "%" in body else body
    elif url.startswith("dnd://"):
        body = url[len("dnd://") :].replace("\\", "/")
    else:
        return []
    return [s for s in body.split("/") if s]


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name (2)``, ``name (3)``… the first not in ``taken`` (then taken)."""
    out, n = name, 2
    while out in taken:
        out, n = f"{name} ({n})", n + 1
    taken.add(out)
    return out


def root_names(roots: Sequence[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    """(name, full path) of each root, in order: its last path component, a repeat numbered
    ``data (2)``; the path absolute as given (not resolved: the user's own spelling)."""
    taken: set[str] = set()
    out = []
    for root in roots:
        full = os.path.abspath(root)
        out.append((_unique(os.path.basename(full) or full.strip("/") or "root", taken), full))
    return out


def root_top_names(roots: Sequence[str | os.PathLike[str]]) -> set[str]:
    """The top folder names the roots claim: several roots' names, or the entries of a single
    root (listed now). An added path's label avoids them (``DroppedPaths``), so a drop never
    shares a top folder with a root and its ``dnd://<label>`` stays its top folder's key."""
    if len(roots) != 1:
        return {name for name, _ in root_names(roots)}
    try:
        return set(os.listdir(roots[0]))
    except OSError:  # a root gone or unreadable claims nothing now
        return set()


class _Roots:
    """Where each ``file://`` url sits: under which root (the deepest that holds it), matched
    on the url's components against the root's, resolved and as spelled (a url is resolved,
    a root may be a link)."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]]) -> None:
        self.named = root_names(roots)
        prefixes = []
        for index, (_, full) in enumerate(self.named):
            for form in {full, str(Path(full).resolve())}:
                prefixes.append((tuple(p for p in form.split("/") if p), index))
        self._prefixes = sorted(prefixes, key=lambda p: -len(p[0]))

    def find(self, parts: list[str]) -> tuple[int, int] | None:
        """(root index, components of ``parts`` the root spans), or None: under no root."""
        for prefix, index in self._prefixes:
            if tuple(parts[: len(prefix)]) == prefix:
                return index, len(prefix)
        return None


def _place(source_id: str, url: str, roots: _Roots) -> tuple[int, tuple[str, ...], str]:
    """(rank of its top folder's claim, folder, name) of a source: under its root, the root's
    folder (or the top, with one root), else its url's path, else the top under its id."""
    count = len(roots.named)
    parts = tree_parts(url)
    found = roots.find(parts) if parts and url.startswith("file://") else None
    if found is not None:
        index, span = found
        if span == len(parts):  # the root is itself a source (one file, one zarr)
            return 0, (), roots.named[index][0]
        inner = tuple(parts[span:-1])
        return (0, inner, parts[-1]) if count == 1 else (index, (roots.named[index][0], *inner), parts[-1])
    if parts:
        return (count if url.startswith("dnd://") else count + 1), tuple(parts[:-1]), parts[-1]
    return 0, (), source_id


class SourcePlaces:
    """Where each source sits in the tree, as path components (its folders, then its name):
    what a folder rule (``[auth.rules]``, ``service/oidc.py``) matches. Before a repeated top
    name is numbered (``data (2)``): a rule names the folder the roots and the url say, not
    the page's spelling of a clash. Kept per source id (a source's url is fixed for its id)."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]]) -> None:
        self._roots = _Roots(roots)
        self._kept: dict[str, tuple[str, ...]] = {}

    def of(self, source_id: str, url: str) -> tuple[str, ...]:
        place = self._kept.get(source_id)
        if place is None:
            _, folder, name = _place(source_id, url, self._roots)
            place = (*folder, name)
            if len(self._kept) < 1_000_000:
                self._kept[source_id] = place
        return place


class CatalogTree:
    """The folder index of one catalog generation: built once in O(sources × depth), then
    each level answers in time proportional to what it lists, not to the catalog."""

    def __init__(self, rows: Iterable[tuple[str, str, bool]], roots: Sequence[str | os.PathLike[str]] = ()) -> None:
        #: folder (tuple of names) -> its child folder names, and the (name, source_id) in it
        self._folders: dict[tuple[str, ...], set[str]] = {(): set()}
        self._sources: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        #: top folder name -> its full path (None: not a place on disk, an added path's label)
        self._top_paths: dict[str, str | None] = {}
        #: the top's own path: the root of a one-root server
        self._top_path: str | None = None
        for folder, name, source_id in self._places(rows, _Roots(roots)):
            if folder not in self._folders:  # a known folder's ancestors are known too
                for depth in range(len(folder)):
                    self._folders.setdefault(folder[:depth], set()).add(folder[depth])
                self._folders[folder] = set()
            self._sources.setdefault(folder, []).append((name, source_id))

    def _places(self, rows: Iterable[tuple[str, str, bool]], roots: _Roots) -> list[tuple[tuple[str, ...], str, str]]:
        """(folder, name, source_id) of each listed row: under its root, the root's folder
        (or the top, with one root), else its url's path; each top folder name given to one
        claimant, ranked: the roots in order, then added paths, then other paths."""
        if len(roots.named) == 1:
            self._top_path = roots.named[0][1]
        placed = [(*_place(source_id, url, roots), source_id) for source_id, url, listed in rows if listed]
        shown = self._claim_top_names({(rank, f[0]) for rank, f, _, _ in placed if f}, roots)
        out = []
        for rank, folder, name, source_id in placed:
            if folder and shown[rank, folder[0]] != folder[0]:  # a later claimant, renamed
                folder = (shown[rank, folder[0]], *folder[1:])
            out.append((folder, name, source_id))
        return out

    def _claim_top_names(self, claims: set[tuple[int, str]], roots: _Roots) -> dict[tuple[int, str], str]:
        """The name each (rank, top folder name) is shown as, the better rank first (several
        roots own their names whether or not they list anything yet); records its path."""
        count = len(roots.named)
        taken = set() if count == 1 else {name for name, _ in roots.named}
        shown: dict[tuple[int, str], str] = {}
        for rank, first in sorted(claims, key=lambda c: (c[0], c[1].encode("utf-8"))):
            if rank < count:  # a root's own folder (several roots) or a folder at its top (one)
                shown[rank, first] = first if count > 1 else _unique(first, taken)
                full = roots.named[rank][1]
                self._top_paths[shown[rank, first]] = full if count > 1 else os.path.join(full, first)
            else:
                shown[rank, first] = _unique(first, taken)
                self._top_paths[shown[rank, first]] = None if rank == count else "/" + first
        return shown

    def _chain(self, folder: tuple[str, ...]) -> tuple[str, ...]:
        """``folder`` extended down its single-child folders, ending where a source sits or
        the chain forks."""
        while not self._sources.get(folder) and len(self._folders.get(folder, ())) == 1:
            folder = folder + (next(iter(self._folders[folder])),)
        return folder

    def path(self, folder: tuple[str, ...]) -> str | None:
        """The full path of ``folder`` on disk, or None: not a place on disk (an added
        path's label, a name no folder has)."""
        if not folder:
            return self._top_path
        base = self._top_paths.get(folder[0])
        return None if base is None else os.path.join(base, *folder[1:])

    def children(self, key: str, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """``{key, path, folders: [{name, key, path}], sources: [{name, source_id}],
        truncated}`` for the folder ``key`` ("" is the top); ``path`` as ``path``."""
        limit = min(limit, MAX_LIMIT)
        here = tuple(p for p in key.split("/") if p)
        folders = []
        for first in self._folders.get(here, ()):
            chain = self._chain(here + (first,))
            name = "/".join(chain[len(here) :])
            folders.append({"name": name, "key": "/".join(chain), "path": self.path(chain)})
        folders.sort(key=lambda f: f["name"].encode("utf-8"))
        truncated = len(folders) > limit
        folders = folders[:limit]
        direct = sorted(self._sources.get(here, ()), key=lambda s: (s[0].encode("utf-8"), s[1]))
        budget = limit - len(folders)
        truncated = truncated or len(direct) > budget
        sources = [{"name": n, "source_id": sid} for n, sid in direct[: max(budget, 0)]]
        path = self.path(here) if here in self._folders else None
        return {"key": key, "path": path, "folders": folders, "sources": sources, "truncated": truncated}

    def trail(self, key: str) -> list[dict[str, Any]]:
        """The top (name "") then each folder down to ``key``, ``{name, key, path}`` each: the
        page's breadcrumb, on which a root's parents on disk never appear."""
        here = tuple(p for p in key.split("/") if p)
        return [
            {"name": here[i - 1] if i else "", "key": "/".join(here[:i]), "path": self.path(here[:i])}
            for i in range(len(here) + 1)
        ]
