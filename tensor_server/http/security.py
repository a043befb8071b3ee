"""Browser safety for the HTTP door: an ASGI middleware in front of every route.

A web page the user merely visits can send requests to ``http://127.0.0.1:8816``. These rules
keep it from reading the user's pixels or running script in the server's origin:

* **Host** must be ``name[:port]`` (a host name or IP literal, an optional numeric port:
  anything else is 400) naming a loopback name or address, or a name the server was configured
  with (``--san``, ``[http] allowed_hosts``, the host's own names). A DNS-rebinding page (its own
  name re-pointed at 127.0.0.1) sends ``Host: evil.example`` and gets 403.
* **A door credential on every request** but ``/healthz``, even on loopback: the access
  token (printed in the URL at start) or the server's ``--token``. It is taken from a
  ``/t/<token>/`` path prefix (which every zarr client keeps when it joins keys to the URL),
  ``?token=``, ``Authorization: Bearer`` or the cookie, as ``http/credentials.py`` reads them
  (the one reading, the metrics door's too); ``service/access.py`` compares. A credential the request presents
  explicitly (path, query, header) must be valid, or the request is refused 401 even when a
  valid cookie came with it; what is handed to the runtime (``CREDENTIAL_KEY``) is exactly the
  credential checked. A tensor's read grant (a private upload's) passes the door too, for the
  runtime to judge: it reads its own tensor, nothing else (``Caller.door_requires_credential``).
* **The cookie**: a request that brings a door credential in its URL sets it (``HttpOnly;
  SameSite=Strict``, one name per port), as Jupyter does, so a page opened from that URL and
  its sub-requests (the viewer's tiles) are let in without the token in any page. The cookie
  admits only same-origin requests: never one with a foreign ``Origin``, nor one whose
  ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site`` (another port of the same host: cookies
  ignore ports). A grant never sets it.
* **CORS** only for configured origins (``--cors-origin``, still with a credential unless the
  door asks none) or for requests that carry a door credential explicitly (a page that has the
  token may use it); a grant never earns it.
* **Private Network Access**: a preflight with ``Access-Control-Request-Private-Network: true``
  gets ``Access-Control-Allow-Private-Network: true`` only when the preflight itself is allowed.
* **Every response** carries ``X-Content-Type-Options: nosniff``, ``Referrer-Policy:
  no-referrer`` (a token in a page's URL never leaves in a Referer), ``X-Frame-Options: DENY``
  and a ``Content-Security-Policy``: ``PAGE_POLICY`` for HTML (script only from the server's
  own files, no framing), ``DATA_POLICY`` for everything else.

Pure ASGI (no response buffering): an 8 MiB chunk passes through untouched.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from tensor_server.http.credentials import cookie_token, presented_tokens
from tensor_server.service.access import is_one_of

__all__ = [
    "HttpSecurity",
    "SecurityMiddleware",
    "CREDENTIAL_KEY",
    "EXPLICIT_CREDENTIAL_KEY",
    "cookie_name",
    "host_name",
    "PAGE_POLICY",
    "DATA_POLICY",
]

#: the ASGI scope key under which the credential a request presented is handed to the routes
#: (the serving runtime decides what it may read: the server token, a tensor's grant)
CREDENTIAL_KEY = "tensor_server.credential"
#: set (True) beside it when the request presented that credential itself (its URL or an
#: ``Authorization`` header), not through the cookie: only such a one is written back into the
#: links a door answers with (the cookie is ``HttpOnly``: pages never learn it)
EXPLICIT_CREDENTIAL_KEY = "tensor_server.credential_explicit"

#: paths answered without a token (liveness probes)
OPEN_PATHS = frozenset({"/healthz"})
_ALLOW_METHODS = "GET, HEAD, OPTIONS"
_ALLOW_HEADERS = "Authorization, Range, If-None-Match"
_EXPOSE_HEADERS = "ETag, Content-Range, Content-Length, Accept-Ranges, Server-Timing, X-Request-Id"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
#: the ``Sec-Fetch-Site`` values of a request from a page of this origin, or none (typed, bookmarked)
_OWN_SITE = frozenset({"same-origin", "none"})

#: the HTML pages' policy: script, images and fetches from this origin only, never framed.
#: Style may also be inline: OpenSeadragon 6 inserts a ``<style>`` element of its own (the pages'
#: style is a served file); ``data:``/``blob:`` images are what it may draw tiles from
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
#: every other response's policy (JSON, chunks, images, text opened as a document run nothing)
DATA_POLICY = "default-src 'none'; frame-ancestors 'none'; sandbox"
_HARDENING = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


def cookie_name(port: int) -> str:
    """One cookie per port: cookies ignore ports, so two servers on one host must not share."""
    return f"tensor-server-token-{port}"


@dataclass
class HttpSecurity:
    """What the middleware enforces. ``tokens`` are the door credentials (the access
    token and the server's ``--token``); none means no token is asked for (``--no-http-token``
    without ``--token``). ``allowed_hosts`` are names beyond loopback a ``Host`` may carry;
    ``cors_origins`` are origins (``scheme://host:port``) whose pages may read cross-origin
    (with a credential when the door asks one)."""

    tokens: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    cors_origins: frozenset[str] = field(default_factory=frozenset)
    #: other credentials of the server that pass the door (a tensor's grant): the runtime then
    #: decides what they read (``ServingRuntime.access.recognizes``); never CORS, never the cookie
    recognizes: Callable[[str], bool] | None = None

    @classmethod
    def build(
        cls,
        tokens: Iterable[str | None] = (),
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        recognizes: Callable[[str], bool] | None = None,
    ) -> HttpSecurity:
        return cls(
            tuple(t for t in tokens if t),
            frozenset(h.lower().strip("[]") for h in allowed_hosts if h),
            frozenset(o.rstrip("/").lower() for o in cors_origins if o),
            recognizes,
        )

    def origin_listed(self, origin: str) -> bool:
        """A configured origin, or any when the operator listed ``*`` (a public image service,
        e.g. IIIF, whose pages are anyone's)."""
        return "*" in self.cors_origins or origin.rstrip("/").lower() in self.cors_origins

    def allow_origin(self, origin: str) -> bytes:
        """The ``Access-Control-Allow-Origin`` value: ``*`` for a public service, else the origin."""
        return b"*" if "*" in self.cors_origins else origin.encode("latin-1")

    def host_allowed(self, host_header: str) -> bool:
        """A well-formed ``Host`` naming this machine (loopback, or a configured name)."""
        host = host_name(host_header)
        return host is not None and self.name_allowed(host)

    def name_allowed(self, host: str) -> bool:
        if host in _LOOPBACK_NAMES or host.endswith(".localhost") or host in self.allowed_hosts:
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def door_credential(self, presented: str | None) -> bool:
        """One of the door's own tokens (compared by ``service/access.py``): it earns CORS and the cookie."""
        return is_one_of(presented, self.tokens)

    def valid(self, presented: str | None) -> bool:
        """A door credential, or another credential of the server (a grant) the runtime judges."""
        if self.door_credential(presented):
            return True
        return presented is not None and self.recognizes is not None and self.recognizes(presented)


def host_name(host_header: str) -> str | None:
    """The lower-cased name of a ``Host`` header of the form ``name[:port]`` (a host name, an
    IPv4 address or a bracketed IPv6 one; a port of 1-5 digits up to 65535), else None:
    ``localhost:80@evil.example``, ``localhost:abc``, ``a:1:2``, userinfo, spaces and the empty
    header are not hosts. Linear in the header, which is capped first."""
    if not host_header or len(host_header) > 300:
        return None
    if host_header.startswith("["):
        name, bracket, rest = host_header[1:].partition("]")
        try:
            ok = bracket == "]" and ipaddress.ip_address(name).version == 6 and "%" not in name
        except ValueError:
            ok = False
    else:
        name, colon, port = host_header.partition(":")
        rest = colon + port
        ok = _is_dns_name(name)
    if not ok or rest and not (rest.startswith(":") and _is_port(rest[1:])):
        return None
    return name.lower()


def _is_dns_name(name: str) -> bool:
    """Dot-separated labels of 1-63 ASCII letters, digits, ``-`` or ``_`` (no leading or trailing ``-``)."""
    if not 0 < len(name) <= 253 or not name.isascii():
        return False
    return all(
        0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-" and all(c.isalnum() or c in "-_" for c in label)
        for label in name.split(".")
    )


def _is_port(text: str) -> bool:
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit() and int(text) <= 65535


class SecurityMiddleware:
    """The ASGI middleware (see the module docstring). ``refused`` is told the kind of each
    refusal it makes (``bad_host``, ``cross_origin``, ``unauthorized``: the metrics count them)."""

    def __init__(self, app: Callable, security: HttpSecurity, refused: Callable[[str], None] | None = None) -> None:
        self.app, self.security = app, security
        self.refused: Callable[[str], None] = refused or (lambda kind: None)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        send = _hardened(send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        sec = self.security
        host = headers.get("host", "")
        refusal = self._host_refusal(host)
        if refusal is not None:
            self.refused("bad_host")
            return await _refuse(send, *refusal)
        given = presented_tokens(scope["path"], scope.get("query_string", b""), headers.get("authorization", ""))
        if given.path_token is not None:
            scope = {**scope, "path": given.path, "raw_path": given.path.encode("latin-1")}
        url_tokens, explicit = given.url_tokens, given.explicit
        origin = headers.get("origin")
        cross = origin is not None and origin.lower() != f"{scope.get('scheme', 'http')}://{host}".lower()
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(send, headers, origin, any(sec.door_credential(t) for t in url_tokens))
        if sec.tokens and explicit and not all(sec.valid(t) for t in explicit):
            return await self._unauthorized(send, "the token presented is not valid")
        credential = explicit[0] if explicit else None
        cors = cross and origin is not None and (sec.origin_listed(origin) or sec.door_credential(credential))
        if cross and not cors:
            self.refused("cross_origin")
            return await _refuse(
                send,
                403,
                f"forbidden: a cross-origin request from {str(origin)[:100]!r} needs the "
                "access token in its URL or an Authorization header, or the origin listed with "
                "--cors-origin.",
            )
        if sec.tokens and credential is None and scope["path"] not in OPEN_PATHS:
            credential, cookie_refusal = self._cookie_credential(scope, headers, cross)
            if cookie_refusal is not None:
                return await cookie_refusal(send)
        if credential is not None:
            scope = {**scope, CREDENTIAL_KEY: credential, EXPLICIT_CREDENTIAL_KEY: bool(explicit)}
        extra = self._answer_headers(scope, origin if cors else None, credential if url_tokens and not cross else None)
        return await self.app(scope, receive, _with_headers(send, extra) if extra else send)

    def _cookie_credential(
        self, scope: dict, headers: dict[str, str], cross: bool
    ) -> tuple[str | None, Callable[[Callable], Awaitable[None]] | None]:
        """(the door credential the cookie carries, None), or (None, the refusal to send): the
        cookie admits only a request of this origin (no foreign ``Origin``, a ``Sec-Fetch-Site``
        of ``same-origin``, ``none`` or none at all)."""
        cookie = cookie_token(headers.get("cookie", ""), cookie_name(_port(scope)))
        if cross or not self.security.door_credential(cookie):
            return None, lambda send: self._unauthorized(send, "no access token came with it")
        site = headers.get("sec-fetch-site")
        if site is not None and site.lower() not in _OWN_SITE:
            self.refused("cross_origin")
            return None, lambda send: _refuse(
                send,
                403,
                f"forbidden: a request from another site (Sec-Fetch-Site: "
                f"{site[:30]!r}) is not admitted by this server's cookie; put the "
                "access token in its URL or an Authorization header.",
            )
        return cookie, None

    def _answer_headers(self, scope: dict, cors_origin: str | None, url_token: str | None) -> list[tuple[bytes, bytes]]:
        """CORS headers for an allowed ``cors_origin``; the cookie for a door credential that
        came in the URL of a same-origin request (``url_token``; a grant never sets it)."""
        sec, extra = self.security, []
        if cors_origin is not None:
            extra += [
                (b"access-control-allow-origin", sec.allow_origin(cors_origin)),
                (b"vary", b"Origin"),
                (b"access-control-expose-headers", _EXPOSE_HEADERS.encode()),
            ]
        if url_token is not None and sec.door_credential(url_token) and _cookie_value_ok(url_token):
            secure = "; Secure" if scope.get("scheme") == "https" else ""
            extra.append(
                (
                    b"set-cookie",
                    f"{cookie_name(_port(scope))}={url_token}; Path=/; HttpOnly; SameSite=Strict{secure}".encode(
                        "latin-1"
                    ),
                )
            )
        return extra

    def _host_refusal(self, host: str) -> tuple[int, str] | None:
        """(status, text) refusing a malformed (400) or foreign (403) ``Host``; None for a good one."""
        name = host_name(host)
        if name is None:
            return 400, (
                f"bad request: Host {host[:100]!r} is not a host name or IP address with an optional "
                "numeric port (name:port)."
            )
        if not self.security.name_allowed(name):
            return 403, (
                f"forbidden: Host {host[:100]!r} is not a name this server answers to (a guard against "
                "DNS rebinding). Dial 127.0.0.1 or localhost, or add the name with --san NAME."
            )
        return None

    async def _unauthorized(self, send: Callable, why: str) -> None:
        self.refused("unauthorized")
        await _refuse(
            send,
            401,
            f"unauthorized: {why}. This server needs its access token: open the URL it "
            "printed at start (python -m tensor_server url ...), or send 'Authorization: Bearer <token>' "
            "or ?token=.",
            {"www-authenticate": "Bearer"},
        )

    async def _preflight(self, send: Callable, headers: dict[str, str], origin: str | None, url_token_ok: bool) -> None:
        """A CORS preflight carries no credentials, so it is allowed for a configured origin,
        a URL carrying a door credential, or a request that will send ``Authorization``
        (checked when it comes)."""
        sec = self.security
        wants_auth = "authorization" in headers.get("access-control-request-headers", "").lower()
        allowed = origin is not None and (sec.origin_listed(origin) or url_token_ok or wants_auth)
        if not allowed or origin is None:
            self.refused("cross_origin")
            return await _refuse(
                send,
                403,
                f"forbidden: cross-origin requests from {str(origin)[:100]!r} are not "
                "allowed; put the access token in the URL or an Authorization header, or list "
                "the origin with --cors-origin.",
            )
        out = [
            (b"access-control-allow-origin", sec.allow_origin(origin)),
            (b"vary", b"Origin"),
            (b"access-control-allow-methods", _ALLOW_METHODS.encode()),
            (b"access-control-allow-headers", _ALLOW_HEADERS.encode()),
            (b"access-control-max-age", b"600"),
            (b"content-length", b"0"),
        ]
        if headers.get("access-control-request-private-network", "").lower() == "true":
            out.append((b"access-control-allow-private-network", b"true"))
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b""})


def _with_headers(send: Callable, extra: list[tuple[bytes, bytes]]) -> Callable:
    """``send`` with ``extra`` headers added to the response's start."""

    async def send_with_headers(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_with_headers


def _hardened(send: Callable) -> Callable:
    """``send`` adding the headers every response carries (module docstring); a policy the
    route set itself is kept."""

    async def send_hardened(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            names = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in _HARDENING if k not in names]
            if b"content-security-policy" not in names:
                kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                policy = PAGE_POLICY if kind.lower().startswith(b"text/html") else DATA_POLICY
                headers.append((b"content-security-policy", policy.encode()))
            message = {**message, "headers": headers}
        await send(message)

    return send_hardened


def _cookie_value_ok(token: str) -> bool:
    """A token a ``Set-Cookie`` can carry as it is (RFC 6265 cookie-octets); an operator's
    ``--token`` outside them is still accepted everywhere else."""
    return token.isascii() and token.isprintable() and not any(c in token for c in ' ",;\\')


def _port(scope: dict) -> int:
    server = scope.get("server") or ("", 0)
    return int(server[1] or 0)


async def _refuse(send: Callable, status: int, text: str, headers: dict[str, str] | None = None) -> None:
    body = text.encode()
    out = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    out += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})
