"""Browser safety for the HTTP door: an ASGI middleware in front of the OME-Zarr routes.

A web page the user merely visits can send requests to ``http://127.0.0.1:8816``. Four rules
keep it from reading the user's pixels:

* **Host** must be a loopback name or address, or a name the server was configured with
  (``--san``, ``[http] allowed_hosts``, the host's own names). A DNS-rebinding page (its own
  name re-pointed at 127.0.0.1) sends ``Host: evil.example`` and gets 403.
* **A token on every request** but ``/healthz``, even on loopback: the per-run access token
  (printed in the URL at start) or the server's ``--token``. It is taken from a ``/t/<token>/``
  path prefix (which every zarr client keeps when it joins keys to the URL), ``?token=``,
  ``Authorization: Bearer``, or a cookie. A request that brings the token in its URL sets the
  cookie (``HttpOnly; SameSite=Strict``, one name per port), as Jupyter does, so a page opened
  from that URL and its sub-requests are let in.
* **CORS** only for configured origins (``--cors-origin``) or for requests that carry the token
  explicitly (path, query or header: a page that has the token may use it). The cookie never
  admits a cross-origin request: a browser attaches it to requests from any port of the same
  host, which is exactly the page this guards against.
* **Private Network Access**: a preflight with ``Access-Control-Request-Private-Network: true``
  gets ``Access-Control-Allow-Private-Network: true`` only when the preflight itself is allowed.

Pure ASGI (no response buffering): an 8 MiB chunk passes through untouched.
"""
from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Callable, Iterable
from urllib.parse import parse_qsl

__all__ = ["HttpSecurity", "SecurityMiddleware", "TOKEN_PATH_PREFIX", "CREDENTIAL_KEY", "cookie_name"]

#: the ASGI scope key under which the credential a request presented is handed to the routes
#: (the serving runtime decides what it may read: the server token, a tensor's grant)
CREDENTIAL_KEY = "tensor_server.credential"

#: the path form of the token: ``/t/<token>/zarr/<id>/...``
TOKEN_PATH_PREFIX = "/t/"
#: paths answered without a token (liveness probes)
OPEN_PATHS = frozenset({"/healthz"})
_ALLOW_METHODS = "GET, HEAD, OPTIONS"
_ALLOW_HEADERS = "Authorization, Range, If-None-Match"
_EXPOSE_HEADERS = "ETag, Content-Range, Content-Length, Accept-Ranges, Server-Timing, X-Request-Id"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def cookie_name(port: int) -> str:
    """One cookie per port: cookies ignore ports, so two servers on one host must not share."""
    return f"tensor-server-token-{port}"


@dataclass
class HttpSecurity:
    """What the middleware enforces. ``tokens`` are the accepted tokens (the per-run access
    token and the server's ``--token``); none means no token is asked for (``--no-http-token``
    without ``--token``). ``allowed_hosts`` are names beyond loopback a ``Host`` may carry;
    ``cors_origins`` are origins (``scheme://host:port``) that may read cross-origin without
    the token."""

    tokens: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    cors_origins: frozenset[str] = field(default_factory=frozenset)
    #: other credentials of the server that pass the door (a tensor's grant): the runtime then
    #: decides what they read (``ServingRuntime.access.recognizes``)
    recognizes: Callable[[str], bool] | None = None

    @classmethod
    def build(cls, tokens: Iterable[str | None] = (), allowed_hosts: Iterable[str] = (),
              cors_origins: Iterable[str] = (), recognizes: Callable[[str], bool] | None = None) -> HttpSecurity:
        return cls(tuple(t for t in tokens if t), frozenset(h.lower().strip("[]") for h in allowed_hosts if h),
                   frozenset(o.rstrip("/").lower() for o in cors_origins if o), recognizes)

    def origin_listed(self, origin: str) -> bool:
        """A configured origin, or any when the operator listed ``*`` (a public image service,
        e.g. IIIF, whose pages are anyone's)."""
        return "*" in self.cors_origins or origin.rstrip("/").lower() in self.cors_origins

    def allow_origin(self, origin: str) -> bytes:
        """The ``Access-Control-Allow-Origin`` value: ``*`` for a public service, else the origin."""
        return b"*" if "*" in self.cors_origins else origin.encode("latin-1")

    def host_allowed(self, host_header: str) -> bool:
        host = _host_name(host_header)
        if host in _LOOPBACK_NAMES or host.endswith(".localhost") or host in self.allowed_hosts:
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def valid(self, presented: str | None) -> bool:
        if presented is None:
            return False
        given = presented.encode("utf-8", "surrogatepass")
        if any(hmac.compare_digest(given, t.encode()) for t in self.tokens):
            return True
        return self.recognizes is not None and self.recognizes(presented)


def _host_name(host_header: str) -> str:
    """The name of a ``Host`` header: ``[::1]:8816`` -> ``::1``, ``Example:80`` -> ``example``."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class SecurityMiddleware:
    """The ASGI middleware (see the module docstring). ``calls`` counts refusals by kind."""

    def __init__(self, app: Callable, security: HttpSecurity, calls: dict[str, int] | None = None) -> None:
        self.app, self.security = app, security
        self.calls = calls if calls is not None else {}
        for kind in ("unauthorized", "bad_host", "cross_origin_refused"):
            self.calls.setdefault(kind, 0)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        sec = self.security
        host = headers.get("host", "")
        if not sec.host_allowed(host):
            self.calls["bad_host"] += 1
            return await _refuse(send, 403, f"forbidden: Host {host[:100]!r} is not a name this server answers to "
                                 "(a guard against DNS rebinding). Dial 127.0.0.1 or localhost, or add the name "
                                 "with --san NAME.")
        scope, path_token = _strip_path_token(scope)
        query_token = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("token")
        header_token = _bearer(headers.get("authorization", ""))
        explicit = next((t for t in (path_token, query_token, header_token) if sec.valid(t)), None)
        origin = headers.get("origin")
        cross = origin is not None and origin.lower() != f"{scope.get('scheme', 'http')}://{host}".lower()
        cors = cross and (sec.origin_listed(origin) or explicit is not None)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(send, headers, origin, sec.valid(path_token) or sec.valid(query_token))
        if cross and not cors:
            self.calls["cross_origin_refused"] += 1
            return await _refuse(send, 403, f"forbidden: a cross-origin request from {origin[:100]!r} needs the "
                                 "access token in its URL or an Authorization header, or the origin listed with "
                                 "--cors-origin.")
        cookie_token = _cookie(headers.get("cookie", ""), cookie_name(_port(scope)))
        if sec.tokens and scope["path"] not in OPEN_PATHS and explicit is None and not sec.valid(cookie_token):
            self.calls["unauthorized"] += 1
            return await _refuse(send, 401, "unauthorized: this server needs its access token: open the URL it "
                                 "printed at start (python -m tensor_server url ...), or send "
                                 "'Authorization: Bearer <token>' or ?token=.", {"www-authenticate": "Bearer"})
        presented = explicit or next((t for t in (path_token, query_token, header_token) if t is not None),
                                     cookie_token if sec.valid(cookie_token) else None)
        if presented is not None:
            scope = {**scope, CREDENTIAL_KEY: presented}
        extra: list[tuple[bytes, bytes]] = []
        if cors:
            extra += [(b"access-control-allow-origin", sec.allow_origin(origin)), (b"vary", b"Origin"),
                      (b"access-control-expose-headers", _EXPOSE_HEADERS.encode())]
        url_token = path_token if sec.valid(path_token) else query_token if sec.valid(query_token) else None
        if url_token is not None and not cross:
            secure = "; Secure" if scope.get("scheme") == "https" else ""
            extra.append((b"set-cookie", f"{cookie_name(_port(scope))}={url_token}; Path=/; HttpOnly; "
                                         f"SameSite=Strict{secure}".encode("latin-1")))
        if not extra:
            return await self.app(scope, receive, send)

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        return await self.app(scope, receive, send_with_headers)

    async def _preflight(self, send: Callable, headers: dict[str, str], origin: str | None, url_token_ok: bool) -> None:
        """A CORS preflight carries no credentials, so it is allowed for a configured origin,
        a URL carrying the token, or a request that will send ``Authorization`` (checked when
        it comes)."""
        sec = self.security
        wants_auth = "authorization" in headers.get("access-control-request-headers", "").lower()
        allowed = origin is not None and (sec.origin_listed(origin) or url_token_ok
                                          or wants_auth)
        if not allowed:
            self.calls["cross_origin_refused"] += 1
            return await _refuse(send, 403, f"forbidden: cross-origin requests from {str(origin)[:100]!r} are not "
                                 "allowed; put the access token in the URL or an Authorization header, or list "
                                 "the origin with --cors-origin.")
        out = [(b"access-control-allow-origin", sec.allow_origin(origin)), (b"vary", b"Origin"),
               (b"access-control-allow-methods", _ALLOW_METHODS.encode()),
               (b"access-control-allow-headers", _ALLOW_HEADERS.encode()),
               (b"access-control-max-age", b"600"), (b"content-length", b"0")]
        if headers.get("access-control-request-private-network", "").lower() == "true":
            out.append((b"access-control-allow-private-network", b"true"))
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b""})


def split_path_token(path: str) -> tuple[str, str | None]:
    """``/t/<token>/rest`` -> (``/rest``, token); other paths -> (path, None). The metrics
    label and the request log use the path without the token (a log never holds one)."""
    if not path.startswith(TOKEN_PATH_PREFIX):
        return path, None
    token, _, rest = path[len(TOKEN_PATH_PREFIX):].partition("/")
    return "/" + rest, token


def _strip_path_token(scope: dict) -> tuple[dict, str | None]:
    """``/t/<token>/rest`` -> (scope with path ``/rest``, token); other paths unchanged."""
    new_path, token = split_path_token(scope["path"])
    if token is None:
        return scope, None
    return {**scope, "path": new_path, "raw_path": new_path.encode("latin-1")}, token


def _bearer(header: str) -> str | None:
    return header[len("Bearer "):] if header.startswith("Bearer ") else None


def _cookie(header: str, name: str) -> str | None:
    if not header:
        return None
    jar = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no token, never a 500
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def _port(scope: dict) -> int:
    server = scope.get("server") or ("", 0)
    return int(server[1] or 0)


async def _refuse(send: Callable, status: int, text: str, headers: dict[str, str] | None = None) -> None:
    body = text.encode()
    out = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    out += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})

