"""Roots that are not local folders: object stores and upstream servers.

A root may be a URL instead of a path:

* ``s3://bucket/prefix`` (or any fsspec URL with a registered filesystem): listed
  recursively once per scan; every zarr / OME-Zarr store under it is a source, opened when
  new or when any of its objects changed (an ETag differs), so chunk ids planned before a
  rewrite are stale (``adapters/zarr_remote.py``);
* ``https://host/path/image.ome.zarr`` (or ``http://``, or a ``.tif`` / ``.ome.tif`` URL): one
  image, opened by its own metadata, never listed (a static host cannot be), read range by
  range through the persistent byte cache under the host rule (``adapters/url_source.py``);
  its signature is its URL, so a rescan leaves it open (its bytes are revalidated on their own);
* ``grpc://host:port[/source_id]``: another tensor server; its readable sources (or the
  one named) are listed here under ids prefixed ``<host>-<port>.``, read through this
  server's cache and engine (``adapters/upstream.py``); re-described at every scan, so an
  upstream whose data changed gives new content versions here.

A root that cannot be listed (endpoint down, bucket missing, access denied) becomes one
unresolved row for the root URL with the reason; its sources already listed stay as they
were (reads of them report their own errors) and every other root is scanned as usual.
URLs are shown without user-info, so a credential in a URL never reaches the catalog.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensor_server.adapters.registry import montages_gapped
from tensor_server.core.identity import source_id_for_url
from tensor_server.errors import UnreadableSource

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.catalog.catalog import Catalog

__all__ = ["is_remote_root", "resolve_remote", "scan_remote_root"]

log = logging.getLogger(__name__)

_UPSTREAM_SCHEMES = ("grpc", "grpc+tcp", "grpcs", "grpc+tls")
#: one image by its URL (adapters/url_source.py)
_URL_SCHEMES = ("http", "https")


def is_remote_root(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def scan_remote_root(catalog: Catalog, url: str) -> dict[str, int]:
    """Bring the catalog's rows of one URL root up to date; never raises for a bad store."""
    from tensor_server.adapters.zarr_remote import public_url

    shown = public_url(url).rstrip("/")
    root_id = source_id_for_url(shown)
    try:
        if _scheme(url) in _UPSTREAM_SCHEMES:
            found = _upstream_records(url)
        elif _scheme(url) in _URL_SCHEMES:
            found = _url_records(url)
        else:
            found = _object_store_records(url)
    except UnreadableSource as exc:
        log.warning("cannot list root %s: %s", shown, exc.reason)
        from tensor_server.catalog.catalog import SourceRecord

        catalog.put_record(SourceRecord(root_id, shown, "remote-root", None, None, exc.reason))
        return {"added": 0, "changed": 0, "removed": 0, "unresolved": 1}
    counts = {"added": 0, "changed": 0, "removed": 0, "unresolved": 0}
    existing = {r.source_id: r for r in catalog.records() if _belongs(r.url, shown) or r.source_id == root_id}
    for rec, opener in found:
        old = existing.pop(rec.source_id, None)
        if old is not None and old.is_resolved and old.signature == rec.signature:
            continue  # unchanged: keep the open source, its content versions and the cache
        with montages_gapped(catalog.montage_gap):  # a plate in a bucket: the server's gap too
            rec = _opened(rec, opener)
        catalog.put_record(rec)
        counts["added" if old is None else "changed"] += 1
        counts["unresolved"] += not rec.is_resolved
    counts["removed"] = len(catalog.remove_records(list(existing)))
    return counts


def resolve_remote(catalog: Catalog, rec: Any) -> Any:
    """``resolve`` of a row without a path: an unreadable row of a URL root lists that root
    again (the endpoint may be back) and returns the row as it is now; a root row that
    listed fine is gone then, and is returned with ``unresolved_reason`` saying so. Rows of
    no URL root (in-memory sources) are returned as they are."""
    from tensor_server.adapters.zarr_remote import public_url

    if rec.is_resolved:
        return rec
    for url in catalog.remote_roots:
        if _belongs(rec.url, public_url(url).rstrip("/")):
            scan_remote_root(catalog, url)
            try:
                return catalog.get_record(rec.source_id)
            except Exception:
                rec.unresolved_reason = "listed again: its sources are now rows of their own"
                return rec
    return rec


def _belongs(url: str, root: str) -> bool:
    return url == root or url.startswith(root + "/")


# ---- object stores ---------------------------------------------------------------------------
def _object_store_records(url: str) -> list[tuple[Any, Callable[[], Any]]]:
    """(record, opener) per zarr store under ``url``: stores are listed here and opened
    only when new or changed, so an unchanged store costs nothing."""
    from tensor_server.adapters.zarr_remote import ObjectListing, RemoteZarrSource, public_url, zarr_store_kind
    from tensor_server.catalog.catalog import SourceRecord

    listing = ObjectListing.from_url(url)
    records = []
    stack = [listing.path()]
    while stack:
        folder = stack.pop()
        kind = zarr_store_kind(folder)
        if kind is None:
            stack.extend(
                sorted(
                    (c for c in folder.iterdir() if c.is_dir() and not c.name.startswith(".")),
                    key=lambda c: c.key,
                    reverse=True,
                )
            )
            continue
        shown = public_url(str(folder))
        rec = SourceRecord(source_id_for_url(shown), shown, kind, None, None, None, listing.signature(folder.key))
        records.append((rec, lambda folder=folder, sid=rec.source_id: RemoteZarrSource(folder, sid)))
    return records


def _url_records(url: str) -> list[tuple[Any, Callable[[], Any]]]:
    """The one record of an image URL; opened only when new (or unreadable before)."""
    from tensor_server.adapters.url_source import open_url_source
    from tensor_server.adapters.zarr_remote import public_url
    from tensor_server.catalog.catalog import SourceRecord

    shown = public_url(url).rstrip("/")
    rec = SourceRecord(source_id_for_url(shown), shown, "remote-image", None, None, None, (shown,))
    return [(rec, lambda: open_url_source(url, rec.source_id))]


def _opened(rec: Any, opener: Callable[[], Any]) -> Any:
    """``rec`` with its source opened; an unreadable store is its record with the reason."""
    try:
        src = opener()
    except UnreadableSource as exc:
        rec.unresolved_reason = exc.reason
    except Exception as exc:  # never let one store take the scan down
        rec.unresolved_reason = f"{type(exc).__name__}: {exc}"
    else:
        rec.source, rec.type = src, src.type
        return rec
    log.warning("unreadable source %s: %s", rec.url, rec.unresolved_reason)
    return rec


# ---- upstream servers -------------------------------------------------------------------------
def _upstream_records(url: str) -> list[tuple[Any, Callable[[], Any]]]:
    """One resolved record per upstream source; the signature is the upstream's content
    versions, so an unchanged upstream keeps this server's versions (and its cache)."""
    from tensor_server.adapters.upstream import Upstream, open_upstream_sources
    from tensor_server.catalog.catalog import SourceRecord

    upstream = Upstream(url)
    host_port = upstream.location.partition("://")[2].replace(":", "-")
    records = []
    for src in open_upstream_sources(upstream, prefix=f"{host_port}."):
        rec = SourceRecord(
            src.source_id,
            src.url,
            src.type,
            None,
            None,
            None,
            tuple((t.upstream_id, t.upstream_version) for t in src.tensors.values()),
        )
        records.append((rec, lambda src=src: src))
    return records
