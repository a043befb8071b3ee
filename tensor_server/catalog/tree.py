"""One level of the catalog tree: what the ``catalog_children`` action answers.

A source's place is its url read as a path (the rule the biopb SDK documents):
``file:///a/b/c.zarr`` is ``c.zarr`` in folder ``a/b``; ``dnd://label/x.tif`` (a path
added at runtime) is ``x.tif`` in folder ``label``; a source with no path (in-memory data)
sits at the top, named by its id. A chain of folders with one child each is shown as one
folder (``a/b``), ending where a source sits or the chain forks, so a deep root does not
cost the user a click per path component. Folders come first and share ``limit`` with the
sources; both are in byte order of name. A readable source that holds no tensor is not
listed (there is nothing to open).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

__all__ = ["tree_parts", "CatalogTree", "DEFAULT_LIMIT", "MAX_LIMIT"]

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


class CatalogTree:
    """The folder index of one catalog generation: built once in O(sources × depth), then
    each level answers in time proportional to what it lists, not to the catalog."""

    def __init__(self, rows: Iterable[tuple[str, str, bool]]) -> None:
        #: folder (tuple of names) -> its child folder names, and the (name, source_id) in it
        self._folders: dict[tuple[str, ...], set[str]] = {(): set()}
        self._sources: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for source_id, url, listed in rows:
            if not listed:
                continue
            parts = tree_parts(url)
            folder, name = (tuple(parts[:-1]), parts[-1]) if parts else ((), source_id)
            if folder not in self._folders:  # a known folder's ancestors are known too
                for depth in range(len(folder)):
                    self._folders.setdefault(folder[:depth], set()).add(folder[depth])
                self._folders[folder] = set()
            self._sources.setdefault(folder, []).append((name, source_id))

    def _chain(self, folder: tuple[str, ...]) -> tuple[str, ...]:
        """``folder`` extended down its single-child folders, ending where a source sits or
        the chain forks."""
        while not self._sources.get(folder) and len(self._folders.get(folder, ())) == 1:
            folder = folder + (next(iter(self._folders[folder])),)
        return folder

    def children(self, key: str, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """``{key, folders: [{name, key}], sources: [{name, source_id}], truncated}`` for the
        folder ``key`` ("" is the top); an unknown key is an empty level."""
        limit = min(limit, MAX_LIMIT)
        here = tuple(p for p in key.split("/") if p)
        folders = []
        for first in self._folders.get(here, ()):
            name = "/".join(self._chain(here + (first,))[len(here) :])
            folders.append({"name": name, "key": "/".join(here) + "/" + name if here else name})
        folders.sort(key=lambda f: f["name"].encode("utf-8"))
        truncated = len(folders) > limit
        folders = folders[:limit]
        direct = sorted(self._sources.get(here, ()), key=lambda s: (s[0].encode("utf-8"), s[1]))
        budget = limit - len(folders)
        truncated = truncated or len(direct) > budget
        sources = [{"name": n, "source_id": sid} for n, sid in direct[: max(budget, 0)]]
        return {"key": key, "folders": folders, "sources": sources, "truncated": truncated}
