"""One HTTP(S) (or S3) request to a remote image, under the host rule and a deadline.

Why not fsspec's HTTP filesystem: the host rule has to hold at the socket. aiohttp resolves
the host again when it connects (a hostile DNS server can answer a public address to the
check and ``127.0.0.1`` to the connection) and follows redirects on its own; here the
connection goes to an address ``_url_rules.checked_addresses`` approved, TLS still verifies
the certificate against the host name, and every redirect hop is checked again. A request
gives up after ``[remote] timeout`` seconds in all (connect, headers, body): a host that
stalls mid-body is a ``RemoteUnavailable`` naming the URL, never a thread held forever.

Idle connections are kept per (host, port, address) and reused (a new TLS handshake per
range would double the round trips of a cold read).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from tensor_server.adapters._url_rules import RemoteSettings, checked_addresses, remote_settings
from tensor_server.errors import PermissionDenied, RemoteUnavailable, UnreadableSource

__all__ = ["Reply", "http_request", "s3_request"]

_READ_BLOCK = 1 << 20
_IDLE_PER_HOST = 8


@dataclass(frozen=True)
class Reply:
    """A response: status, lower-cased headers, body (empty for HEAD and 304), final URL."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to one checked address, TLS verified against the host name."""

    def __init__(self, host: str, port: int, address: str, timeout: float, tls: bool) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address
        self.tls = tls

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host) if self.tls else sock


_idle: dict[tuple[str, int, str, bool], list[_PinnedConnection]] = {}
_idle_lock = threading.Lock()


def _connection(host: str, port: int, address: str, tls: bool, timeout: float) -> _PinnedConnection:
    with _idle_lock:
        pool = _idle.get((host, port, address, tls))
        if pool:
            conn = pool.pop()
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn
    return _PinnedConnection(host, port, address, timeout, tls)


def _release(conn: _PinnedConnection) -> None:
    with _idle_lock:
        pool = _idle.setdefault((conn.host, conn.port, conn.address, conn.tls), [])
        if len(pool) < _IDLE_PER_HOST:
            pool.append(conn)
            return
    conn.close()


def http_request(
    url: str, *, method: str = "GET", byte_range: str = "", settings: RemoteSettings | None = None
) -> Reply:
    """``method`` ``url`` (``byte_range``: ``"a-b"`` or ``"-n"``, HTTP's inclusive form),
    following same-host redirects. 2xx, 304, 404 and 410 are returned; a timeout, a refused
    connection or a 5xx raise ``RemoteUnavailable``; another status ``UnreadableSource``; a
    refused host or redirect ``PermissionDenied``; each naming the URL."""
    settings = settings or remote_settings()
    deadline = time.monotonic() + settings.timeout
    first = url
    for _ in range(settings.follow_redirects + 1):
        reply = _one_request(url, method, byte_range, settings, deadline)
        if reply.status not in (301, 302, 303, 307, 308) or "location" not in reply.headers:
            return reply
        target = urljoin(url, reply.headers["location"])
        old, new = urlsplit(url), urlsplit(target)
        if new.netloc.lower() != old.netloc.lower() and not settings.allows_listed(new.hostname or "", new.port):
            raise PermissionDenied(
                f"{first}: redirected to another host ({new.hostname}), refused: a redirect may only leave "
                "the host when [remote] allowed_hosts lists the target"
            )
        url = target
    raise UnreadableSource(first, f"more than {settings.follow_redirects} redirects")


def s3_request(url: str, *, method: str = "GET", byte_range: str = "", settings: RemoteSettings | None = None) -> Reply:
    """``http_request`` for ``s3://bucket/key``, through s3fs (credentials and endpoint are the
    server's own configuration, ``zarr_remote.storage_options``): the same ``Reply``, its
    ETag, size and 404 as an HTTP host would say them."""
    from fsspec.asyn import sync
    from fsspec.core import url_to_fs

    from tensor_server.adapters.zarr_remote import storage_options

    settings = settings or remote_settings()
    bucket, _, key = url.partition("://")[2].partition("/")
    try:
        fs, _ = url_to_fs(url, **storage_options("s3"))
    except ImportError as exc:
        raise UnreadableSource(
            url, f"no filesystem for s3:// is installed ({exc}); pip install 'tensor-server[s3]'"
        ) from None

    async def ask() -> Reply:
        args = {"Bucket": bucket, "Key": key, **({"Range": f"bytes={byte_range}"} if byte_range else {})}
        try:
            out = await fs._call_s3("head_object" if method == "HEAD" else "get_object", **args)
        except FileNotFoundError:
            return Reply(404, {}, b"", url)
        if method != "HEAD" and int(out.get("ContentLength") or 0) > settings.max_object_bytes:
            out["Body"].close()
            raise UnreadableSource(
                url, f"the answer is larger than [remote] max_object_bytes ({settings.max_object_bytes}): refused"
            )
        body = b"" if method == "HEAD" else await out["Body"].read()
        headers = {
            "etag": str(out.get("ETag", "")),
            "content-length": str(out.get("ContentLength", len(body))),
            "content-range": str(out.get("ContentRange") or ""),
            "last-modified": str(out.get("LastModified", "")),
        }
        return Reply(206 if headers["content-range"] else 200, headers, body, url)

    try:
        return sync(fs.loop, ask, timeout=settings.timeout)
    except (TimeoutError, ConnectionError) as exc:
        raise RemoteUnavailable(url, f"the store did not answer within {settings.timeout:g} s ({exc})") from None
    except PermissionError as exc:
        raise UnreadableSource(url, f"access denied: {exc}") from None
    except OSError as exc:
        if "InvalidRange" in str(exc):
            return Reply(416, {}, b"", url)
        raise UnreadableSource(url, f"{type(exc).__name__}: {exc}") from None


def _one_request(url: str, method: str, byte_range: str, settings: RemoteSettings, deadline: float) -> Reply:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise PermissionDenied(f"{url}: only http:// and https:// are fetched directly, not {parts.scheme}://")
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Accept-Encoding": "identity", "User-Agent": "tensor-server"}
    if parts.port:
        headers["Host"] = f"{host}:{parts.port}"
    if byte_range:
        headers["Range"] = f"bytes={byte_range}"
    last: BaseException | None = None
    for address in checked_addresses(url, settings):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        conn = _connection(host, port, address, tls, remaining)
        try:
            return _exchange(conn, url, method, target, headers, deadline, settings.max_object_bytes)
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise UnreadableSource(url, f"TLS certificate not valid for {host}: {exc.verify_message}") from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            last = exc
    why = "no answer" if last is None else f"{type(last).__name__}: {last}"
    raise RemoteUnavailable(url, f"the host did not answer within {settings.timeout:g} s ({why})")


def _exchange(
    conn: _PinnedConnection,
    url: str,
    method: str,
    target: str,
    headers: dict[str, str],
    deadline: float,
    max_bytes: int,
) -> Reply:
    """One request on ``conn``; the body read in blocks, each under what is left of the
    deadline, and refused past ``max_bytes`` (a hostile URL must not fill the memory)."""
    try:
        conn.request(method, target, headers=headers)
        resp = conn.getresponse()
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
        conn.close()  # a kept connection the host had closed: once more on a new one
        conn.connect()
        conn.request(method, target, headers=headers)
        resp = conn.getresponse()
    got = {k.lower(): v for k, v in resp.getheaders()}
    blocks: list[bytes] = []
    received = 0
    while True:  # a HEAD's read is empty at once, and leaves the connection ready for the next
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed while the body was arriving")
        if conn.sock is not None:
            conn.sock.settimeout(left)
        block = resp.read(_READ_BLOCK)
        if not block:
            break
        received += len(block)
        if received > max_bytes:
            conn.close()
            raise UnreadableSource(
                url, f"the answer is larger than [remote] max_object_bytes ({max_bytes}): refused, not read whole"
            )
        blocks.append(block)
    if resp.will_close:
        conn.close()
    else:
        _release(conn)
    status = resp.status
    if status >= 500:
        raise RemoteUnavailable(url, f"the host answered HTTP {status} {resp.reason}")
    if status >= 400 and status not in (404, 410, 416):
        raise UnreadableSource(url, f"the host answered HTTP {status} {resp.reason}")
    if status < 300 and got.get("content-type", "").lower().startswith("text/html"):
        raise UnreadableSource(
            url, "the host answered with an HTML page (text/html), not image data: a login, error or index page?"
        )
    return Reply(status, got, b"".join(blocks), url)
