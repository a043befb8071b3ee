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

from typing import Any, Iterable
from urllib.parse import unquote

__all__ = ["tree_parts", "children", "DEFAULT_LIMIT", "MAX_LIMIT"]

DEFAULT_LIMIT = 2000
MAX_LIMIT = 100_000


def tree_parts(url: str) -> list[str]:
    """The path segments of ``url`` in the tree (empty when the url has no path)."""
    if url.startswith("file://"):
        body = unquote(url[len("file://"):])
    elif url.startswith("dnd://"):
        body = url[len("dnd://"):].replace("\\", "/")
    else:
        return []
    return [s for s in body.split("/") if s]


def _common_prefix(rests: list[tuple[str, ...]]) -> tuple[str, ...]:
    lo, hi = min(rests), max(rests)  # the common prefix of a set is that of its min and max
    out = []
    for a, b in zip(lo, hi):
        if a != b:
            break
        out.append(a)
    return tuple(out)


def children(rows: Iterable[tuple[str, str, bool]], key: str, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """``{key, folders: [{name, key}], sources: [{name, source_id}], truncated}`` for the
    folder ``key`` ("" is the top), from ``(source_id, url, listed)`` rows."""
    limit = min(limit, MAX_LIMIT)
    here = tuple(p for p in key.split("/") if p)
    direct: list[tuple[str, str]] = []
    groups: dict[str, list[tuple[str, ...]]] = {}
    for source_id, url, listed in rows:
        if not listed:
            continue
        parts = tree_parts(url)
        folder, name = (tuple(parts[:-1]), parts[-1]) if parts else ((), source_id)
        if folder[: len(here)] != here:
            continue
        rest = folder[len(here):]
        if rest:
            groups.setdefault(rest[0], []).append(rest)
        else:
            direct.append((name, source_id))
    folders = []
    for first in groups:
        name = "/".join(_common_prefix(groups[first]))
        folders.append({"name": name, "key": f"{key.strip('/')}/{name}" if here else name})
    folders.sort(key=lambda f: f["name"].encode("utf-8"))
    truncated = len(folders) > limit
    folders = folders[:limit]
    direct.sort(key=lambda s: (s[0].encode("utf-8"), s[1]))
    budget = limit - len(folders)
    truncated = truncated or len(direct) > budget
    sources = [{"name": n, "source_id": sid} for n, sid in direct[:max(budget, 0)]]
    return {"key": key, "folders": folders, "sources": sources, "truncated": truncated}
