"""Remote byte ranges, fetched once: a persistent cache, one fetch per range, a bound per host.

Why: each HTTP request to a remote image costs tens to hundreds of milliseconds, and a viewer
asks chunk by chunk. What this store guarantees:

* **Persistent and bounded.** Each fetched range is a file under ``[remote] cache_dir`` (a
  sibling of the chunk cache, its own budget ``cache_max_bytes``; the least recently used
  ranges go first). A restarted server reads the same region with zero remote requests.
* **Keyed by version.** A range is stored under its URL *and* the object's validator (ETag,
  else Last-Modified and size). An object is revalidated (one HEAD) at most every
  ``revalidate_seconds``; when its validator changed, every range of the old version is
  dropped before the new bytes are fetched, so old and new bytes are never mixed. Absent
  objects (404: zarr's absent chunks, the metadata names zarr-python probes) are remembered
  the same way.
* **Pinned reads.** A reader that parsed an object's structure (a TIFF's IFDs) passes the
  validator it parsed; a range of another version raises, naming the URL, instead of
  decoding new tiles against old offsets.
* **Coalesced.** Concurrent requests for the same range wait for one fetch; fetches to one
  host are bounded (``per_host``), the rest queue.
* **Listed versions.** An object-store root is listed at every scan, and the listing carries
  each object's ETag (``zarr_remote.py``); ``adopt_listing`` makes those the versions its reads
  trust, so a rewritten object is refetched as soon as the listing saw it (not a revalidation
  period later: the chunk ids the scan made already name the new version) and an unchanged one
  costs no HEAD.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tensor_server.adapters._url_fetch import Reply, http_request, s3_request
from tensor_server.adapters._url_rules import RemoteSettings, remote_settings
from tensor_server.errors import RemoteUnavailable, UnreadableSource

__all__ = ["ABSENT", "FETCHERS", "RemoteBytes", "remote_bytes", "reset_remote_bytes"]

log = logging.getLogger(__name__)

#: the validator of an object the host answered 404 / 410 for
ABSENT = "absent"


def _validator(reply: Reply) -> str:
    """The object's version as the reply states it: its ETag, else Last-Modified and size."""
    if reply.status in (404, 410):
        return ABSENT
    etag = reply.headers.get("etag", "").removeprefix("W/").strip('"')
    if etag:
        return f"etag:{etag}"
    total = reply.headers.get("content-range", "").rpartition("/")[2] or reply.headers.get("content-length", "")
    return f"lm:{reply.headers.get('last-modified', '')}|{total}"


def _size(reply: Reply) -> int | None:
    """The whole object's size in bytes, when the reply says it."""
    total = reply.headers.get("content-range", "").rpartition("/")[2]
    if not total and reply.status == 200:
        total = reply.headers.get("content-length", "")
    return int(total) if total.isdigit() else None


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class _ByteStore:
    """Ranges by (url, validator, range): files under ``root`` (None: in memory), within
    ``max_bytes`` (least recently used first out); and each URL's validator and when it was
    last checked (``meta.json`` beside its ranges)."""

    def __init__(self, root: Path | None, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()  # key -> size, least recent first
        self._memory: dict[str, bytes] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.total = 0
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
            found = [(e.stat().st_mtime, str(e.relative_to(root)), e.stat().st_size) for e in root.glob("*/*/r.*")]
            for _, key, size in sorted(found):
                self._sizes[key] = size
                self.total += size

    def _folder(self, url: str) -> str:
        h = _digest(url)
        return f"{h[:2]}/{h}"

    def _key(self, url: str, validator: str, byte_range: str) -> str:
        return f"{self._folder(url)}/r.{_digest(validator)[:16]}.{byte_range or 'all'}"

    def meta(self, url: str) -> dict[str, Any] | None:
        with self._lock:
            if url in self._meta:
                return self._meta[url]
        if self.root is None:
            return None
        try:
            doc = json.loads((self.root / self._folder(url) / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        with self._lock:
            self._meta[url] = doc
        return doc

    def set_meta(self, url: str, validator: str, checked_at: float, size: int | None) -> None:
        doc = {"url": url, "validator": validator, "checked_at": checked_at, "size": size}
        with self._lock:
            self._meta[url] = doc
        if self.root is not None:
            self._write(f"{self._folder(url)}/meta.json", json.dumps(doc).encode())

    def has(self, url: str, validator: str, byte_range: str) -> bool:
        with self._lock:
            return self._key(url, validator, byte_range) in self._sizes

    def get(self, url: str, validator: str, byte_range: str) -> bytes | None:
        key = self._key(url, validator, byte_range)
        with self._lock:
            if key not in self._sizes:
                return None
            self._sizes.move_to_end(key)
            if self.root is None:
                return self._memory[key]
        try:
            return (self.root / key).read_bytes()
        except OSError:
            return None

    def put(self, url: str, validator: str, byte_range: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        key = self._key(url, validator, byte_range)
        if self.root is not None:
            self._write(key, data)
        with self._lock:
            self.total += len(data) - self._sizes.pop(key, 0)
            self._sizes[key] = len(data)
            if self.root is None:
                self._memory[key] = data
            evicted = []
            while self.total > self.max_bytes and self._sizes:
                old, size = self._sizes.popitem(last=False)
                self.total -= size
                self._memory.pop(old, None)
                evicted.append(old)
        self._unlink(evicted)

    def drop(self, url: str) -> None:
        """Forget every range of ``url`` (its object changed)."""
        folder = self._folder(url) + "/"
        with self._lock:
            gone = [k for k in self._sizes if k.startswith(folder)]
            for key in gone:
                self.total -= self._sizes.pop(key)
                self._memory.pop(key, None)
        self._unlink(gone)

    def _unlink(self, keys: list[str]) -> None:
        if self.root is not None:
            for key in keys:
                (self.root / key).unlink(missing_ok=True)

    def _write(self, key: str, data: bytes) -> None:
        """Whole or not at all: a crash mid-write leaves a temporary file, never a short range."""
        assert self.root is not None
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)


class RemoteBytes:
    """The process's remote ranges (the module docstring): ``read`` is the one way in."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.store = _ByteStore(settings.cache_path(), settings.cache_max_bytes)
        self._inflight: dict[tuple[str, str, str], Future[Any]] = {}
        self._lock = threading.Lock()
        self._hosts: dict[str, threading.BoundedSemaphore] = {}
        #: url prefix -> (url -> validator) of the object-store listings adopted
        self._listed: dict[str, Mapping[str, str]] = {}
        #: requests sent to remote hosts, and reads the cache answered (the metrics, tests)
        self.requests = 0
        self.hits = 0

    def read(self, url: str, byte_range: str = "", *, pinned: str | None = None) -> tuple[bytes | None, str]:
        """(bytes, validator) of ``url``'s ``byte_range`` (``"a-b"`` inclusive, ``"-n"`` the
        last n, ``""`` all), or (None, ABSENT) when the host has no such object."""
        validator = self._current_validator(url)
        if pinned is not None and validator != pinned:
            raise UnreadableSource(
                url, f"changed on the host since it was opened ({pinned} -> {validator}); open again"
            )
        if validator == ABSENT:
            return None, ABSENT
        if validator:
            data = self.store.get(url, validator, byte_range)
            if data is not None:
                self.hits += 1  # a racy count: a statistic, not worth a lock per hit
                return data, validator
        data, got = self._once(("get", url, byte_range), lambda: self._fetch(url, byte_range))
        if pinned is not None and got != pinned:
            raise UnreadableSource(url, f"changed on the host while it was being read ({pinned} -> {got}); open again")
        return data, got

    def stats(self) -> dict[str, int]:
        """Requests sent, cache hits, bytes held and the budget (the metrics door)."""
        return {
            "requests": self.requests,
            "hits": self.hits,
            "bytes": self.store.total,
            "max_bytes": self.store.max_bytes,
        }

    def size(self, url: str) -> int | None:
        """The object's size (one HEAD when not known yet); None when absent or not said."""
        meta = self.store.meta(url)
        if meta is None or meta.get("size") is None:
            known = "" if meta is None else str(meta["validator"])
            self._once(("head", url, ""), lambda: self._head(url, known))
            meta = self.store.meta(url)
        return None if meta is None or meta["validator"] == ABSENT else meta.get("size")

    def adopt_listing(self, prefix: str, validators: Mapping[str, str]) -> None:
        """The versions (url -> validator) a listing of ``prefix`` saw, trusted by the reads
        of those URLs over the cached ones (the module docstring); replaces an earlier listing
        of the same prefix."""
        with self._lock:
            self._listed[prefix.rstrip("/") + "/"] = validators

    def _listed_validator(self, url: str) -> str | None:
        """The validator the newest listing over ``url`` saw, the cached one made to agree
        (a different one: its ranges dropped); None when no listing names it."""
        with self._lock:
            listings = [v for p, v in self._listed.items() if url.startswith(p)]
        listed = next((v[url] for v in listings if url in v), None)
        if listed is not None:
            meta = self.store.meta(url)
            if meta is None or meta["validator"] != listed:
                if meta is not None:
                    self.store.drop(url)
                self.store.set_meta(url, listed, time.time(), None)
        return listed

    def _current_validator(self, url: str) -> str:
        """The validator known for ``url``, revalidated (one HEAD) when older than
        ``revalidate_seconds``; "" when never seen; the listing's, when one names it. A host
        that does not answer the HEAD leaves the cached copy served (stale if the host is down,
        rather than nothing), and is asked again a period later, not at every read."""
        listed = self._listed_validator(url) if self._listed else None
        if listed is not None:
            return listed
        meta = self.store.meta(url)
        if meta is None:
            return ""
        known = str(meta["validator"])
        if time.time() - meta["checked_at"] < self.settings.revalidate_seconds:
            return known
        try:
            _, validator = self._once(("head", url, ""), lambda: self._revalidate(url, known))
        except RemoteUnavailable as exc:
            log.warning("%s: cannot revalidate (%s); serving the cached copy", url, exc.reason)
            self.store.set_meta(url, known, time.time(), meta.get("size"))
            return known
        return validator

    def _revalidate(self, url: str, known: str) -> tuple[None, str]:
        """One HEAD, unless another reader revalidated ``url`` since this one found it due:
        readers that found it due together wait for one HEAD (``_once``), and one that comes
        after that HEAD ended must not send another (a viewer's tiles: one HEAD an object a
        period, not one a tile)."""
        meta = self.store.meta(url)
        if meta is not None and time.time() - meta["checked_at"] < self.settings.revalidate_seconds:
            return None, str(meta["validator"])
        return self._head(url, known)

    def _head(self, url: str, known: str) -> tuple[None, str]:
        reply = self._request(url, "HEAD", "")
        validator = _validator(reply)
        if validator != known:
            self.store.drop(url)
        self.store.set_meta(url, validator, time.time(), _size(reply))
        return None, validator

    def prefetch(self, url: str, ranges: list[tuple[int, int]], *, pinned: str, gap: int = 0) -> None:
        """``prefetch_all`` of one object."""
        self.prefetch_all([(url, ranges, pinned)], gap=gap)

    def prefetch_all(self, wanted: list[tuple[str, list[tuple[int, int]], str]], *, gap: int = 0) -> None:
        """Fetch the ``(start, stop)`` ranges of each ``(url, ranges, pinned)`` not cached yet
        (a reader's blocks, a shard's inner chunks), so its reads that follow are hits: ranges
        adjacent or within ``gap`` bytes of each other as one request of up to ``MAX_RUN``
        bytes (a cold tile grid is a few large requests, not one per tile), every request in
        parallel. Stored range by range, pinned to ``pinned`` as ``read`` is."""
        runs: list[tuple[str, str, list[tuple[int, int]]]] = []
        for url, ranges, pinned in wanted:
            validator = self._current_validator(url)
            if validator != pinned:
                raise UnreadableSource(
                    url, f"changed on the host since it was opened ({pinned} -> {validator}); open again"
                )
            missing = sorted(r for r in set(ranges) if not self.store.has(url, validator, f"{r[0]}-{r[1] - 1}"))
            for run in _runs(missing, gap):
                runs.append((url, pinned, run))

        def fetch(job: tuple[str, str, list[tuple[int, int]]]) -> None:
            url, pinned, run = job
            text = f"{run[0][0]}-{max(stop for _, stop in run) - 1}"
            _, got = self._once(("get", url, text), lambda: self._fetch(url, text, pieces=run))
            if got != pinned:
                raise UnreadableSource(url, f"changed on the host while it was being read ({pinned} -> {got})")

        list(FETCHERS.map(fetch, runs))

    def _fetch(
        self, url: str, byte_range: str, pieces: list[tuple[int, int]] | None = None
    ) -> tuple[bytes | None, str]:
        """GET ``byte_range`` and store it (as ``pieces``, absolute (start, stop) ranges
        within it, when given)."""
        reply = self._request(url, "GET", byte_range)
        validator = _validator(reply)
        meta = self.store.meta(url)
        if meta is not None and meta["validator"] != validator:
            self.store.drop(url)  # a new version: none of the old ranges may be served with it
        self.store.set_meta(url, validator, time.time(), _size(reply))
        if validator == ABSENT:
            return None, ABSENT
        data = _ranged(reply, byte_range, url)
        if pieces is None:
            self.store.put(url, validator, byte_range, data)
            return data, validator
        base = pieces[0][0]
        for start, stop in pieces:
            self.store.put(url, validator, f"{start}-{stop - 1}", data[start - base : stop - base])
        return None, validator

    def _request(self, url: str, method: str, byte_range: str) -> Reply:
        host = (urlsplit(url).netloc or "").lower()
        with self._lock:
            gate = self._hosts.setdefault(host, threading.BoundedSemaphore(self.settings.per_host))
            self.requests += 1
        with gate:
            if url.startswith("s3://"):
                return s3_request(url, method=method, byte_range=byte_range, settings=self.settings)
            return http_request(url, method=method, byte_range=byte_range, settings=self.settings)

    def _once(self, key: tuple[str, str, str], fetch: Any) -> tuple[bytes | None, str]:
        """``fetch()`` once for every concurrent caller asking for ``key``."""
        with self._lock:
            future = self._inflight.get(key)
            owner = future is None
            if owner:
                future = self._inflight[key] = Future()
        assert future is not None
        if not owner:
            return future.result()
        try:
            result = fetch()
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(result)
            return result
        finally:
            with self._lock:
                self._inflight.pop(key, None)


#: the most bytes one merged request of ``prefetch_all`` asks for
MAX_RUN = 8 << 20


def _runs(ranges: list[tuple[int, int]], gap: int) -> list[list[tuple[int, int]]]:
    """Sorted ``ranges`` grouped into runs one request each fetches: the next range starts
    within ``gap`` bytes of the run's end and the run stays within ``MAX_RUN`` bytes."""
    runs: list[list[tuple[int, int]]] = []
    end = 0
    for r in ranges:
        if runs and r[0] - end <= gap and max(end, r[1]) - runs[-1][0][0] <= MAX_RUN:
            runs[-1].append(r)
            end = max(end, r[1])
        else:
            runs.append([r])
            end = r[1]
    return runs


def _ranged(reply: Reply, byte_range: str, url: str) -> bytes:
    """The requested range of ``reply``'s body: a host that ignores ``Range`` (200 with the
    whole object) is cut here; 416 (a range past the end) is an empty range."""
    body = reply.body
    if reply.status == 416:
        return b""
    if reply.status == 206 or not byte_range:
        return body
    start, _, end = byte_range.partition("-")
    if not start:
        return body[-int(end) :] if int(end) else b""
    return body[int(start) : int(end) + 1 if end else None]


#: threads that wait on remote ranges (a wait, not work: more than the cores, so a cold read
#: has its ranges in flight at once; ``per_host`` bounds what one host sees)
FETCHERS = ThreadPoolExecutor(32, thread_name_prefix="remote-fetch")

_shared: RemoteBytes | None = None
_shared_lock = threading.Lock()


def remote_bytes() -> RemoteBytes:
    """The process's store, built from the installed ``[remote]`` settings."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.settings is not remote_settings():
            _shared = RemoteBytes(remote_settings())
        return _shared


def reset_remote_bytes() -> None:
    """Forget the store (new settings: a new cache folder, budget or host rule)."""
    global _shared
    with _shared_lock:
        _shared = None
