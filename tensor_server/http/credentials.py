"""The one reading of the token a request to an HTTP listener presents (the HTTP door and the
metrics door): a ``/t/<token>/`` path prefix (which every zarr client keeps when it joins keys
to the URL), ``?token=``, ``Authorization: Bearer`` (``service.access.bearer_token``, as Flight
reads it) and, for the HTTP door's browser pages, its cookie.

Reading only: whether a token is right is ``service/access.py``'s decision, the one place
tokens are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl

from tensor_server.service.access import bearer_token
from tensor_server.service.shares import SHARE_PATH_PREFIX  # ``/s/<capability>/``: read as ``/t/``

__all__ = [
    "TOKEN_PATH_PREFIX",
    "Presented",
    "presented_tokens",
    "split_path_token",
    "cookie_token",
]

#: the path form of the token: ``/t/<token>/zarr/<id>/...``
TOKEN_PATH_PREFIX = "/t/"


@dataclass(frozen=True)
class Presented:
    """What a request presents explicitly (in its URL or an ``Authorization`` header), and
    its path with any token prefix taken off."""

    path: str
    path_token: str | None
    query_token: str | None
    bearer: str | None

    @property
    def url_tokens(self) -> tuple[str, ...]:
        """The tokens its URL carries (a browser that opened it keeps them: the cookie's source)."""
        return tuple(t for t in (self.path_token, self.query_token) if t is not None)

    @property
    def explicit(self) -> tuple[str, ...]:
        """Every token it presents itself, URL first: each must be valid for the request to pass."""
        return self.url_tokens + ((self.bearer,) if self.bearer is not None else ())


def presented_tokens(path: str, query_string: bytes, authorization: str) -> Presented:
    """The tokens of one request: its path, its raw query string and its ``Authorization`` header."""
    rest, path_token = split_path_token(path)
    query_token = dict(parse_qsl(query_string.decode("latin-1"))).get("token")
    return Presented(rest, path_token, query_token, bearer_token(authorization))


def split_path_token(path: str) -> tuple[str, str | None]:
    """``/t/<token>/rest`` or ``/s/<capability>/rest`` -> (``/rest``, token); other paths ->
    (path, None). The metrics label and the request log use the path without the token (a
    log never holds one)."""
    if not path.startswith((TOKEN_PATH_PREFIX, SHARE_PATH_PREFIX)):
        return path, None
    token, _, rest = path[len(TOKEN_PATH_PREFIX) :].partition("/")
    return "/" + rest, token


def cookie_token(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header; a malformed header is no token, never a 500."""
    if not header:
        return None
    jar = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no token, never a 500
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None
