"""Share links: a capability to read one tensor, signed by the server, that expires and can be
revoked. What a capability may read is ``Access``'s rule (``service/access.py``); here the
capabilities themselves: minting, listing, revoking, and checking one a caller presents.

A capability is a JWT (RFC 7519, HS256, made and checked by joserfc: no hand-written crypto)
whose claims name the link (``jti``), the tensor (``sub``), the scope (``read`` or
``read+annotate``) and the end (``exp``), signed with the server's share secret. Its
characters are URL-safe, so it rides as a path prefix (``/s/<capability>/zarr/<id>/``) that
zarr clients keep on every key, as ``?token=`` or a bearer token on every door.

The secret and the list of links live in the server home (``Settings.shares_dir``:
``<data home>/shares``, files 0600 in a 0700 folder; in memory when none is given):
``secret`` (32 random bytes, hex) and ``links.json``. Rotating the secret forgets every link,
so every capability made before is refused (a signature the new secret does not check).
Revoking and expiring take effect on the next request: the signature check is cached per
capability, the revocation list and the clock are looked at every time, and a process that
serves beside the one that minted (``serve --workers``) reloads the list when its file
changes (one ``stat`` per check), and every change of the list is made under an ``flock`` of
the folder, so links minted by two processes at once are both kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tensor_server.errors import InvalidArgument, ResourceExhausted, Unauthenticated

__all__ = ["Share", "ShareStore", "SCOPES", "MAX_EXPIRES_SECONDS", "SHARE_PATH_PREFIX", "parse_duration"]

#: the HTTP form of a link: ``/s/<capability>/zarr/<array_id>/`` (a path prefix every zarr client keeps)
SHARE_PATH_PREFIX = "/s/"

SCOPES = ("read", "read+annotate")
#: a share link lives at most a year; a longer one is a standing grant, not a link to send
MAX_EXPIRES_SECONDS = 366 * 86400
DEFAULT_EXPIRES_SECONDS = 7 * 86400
#: live links a server keeps (expired ones are forgotten as new ones are made)
MAX_LINKS = 10_000
#: capabilities whose signature was checked, kept so a tile does not pay the HMAC and JSON again
_VERIFIED_KEPT = 1024
_ISSUER = "tensor-server-share"
#: a JWS compact serialisation: three base64url parts (what ``looks_like`` lets reach the check)
_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]{8,2000}\.[A-Za-z0-9_-]{8,4000}\.[A-Za-z0-9_-]{16,200}")
_DURATION = re.compile(r"(\d{1,9})\s*([smhdw]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """Seconds of ``30m``, ``12h``, ``7d``, ``2w`` or a bare number of seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise InvalidArgument(f"a duration is a number with s, m, h, d or w (7d, 12h); got {text[:40]!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class Share:
    """One link as the server keeps it (never the capability itself: it can be re-made from
    the secret, and a list of them would be a list of keys)."""

    id: str
    array_id: str
    scope: str
    created_at: float
    expires_at: float
    #: who made it: the SHA-256 of the token presented ("" for none, or the server token)
    creator: str
    revoked_at: float | None = None

    def public(self) -> dict[str, Any]:
        """What ``share_list`` says of it."""
        out = {k: v for k, v in asdict(self).items() if k != "creator"}
        out["state"] = "revoked" if self.revoked_at is not None else "expired" if self.expired() else "live"
        return out

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at

    @property
    def annotates(self) -> bool:
        return self.scope == "read+annotate"


class ShareStore:
    """The links of one server home (module docstring). Thread-safe."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = None if folder is None else Path(folder)
        self._lock = threading.Lock()
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._links: dict[str, Share] = {}
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the links file last read
        self._key = self._load_key()
        self._reload()

    # ---- the secret -----------------------------------------------------------------------
    def _load_key(self) -> Any:
        """The kept secret's key; a first one is made and linked into place, so processes
        starting together on a fresh home (``serve --workers``) agree on one."""
        from joserfc.jwk import OctKey

        secret = self._kept_secret()
        if secret is None:
            secret = secrets.token_bytes(32)
            if self.folder is not None:
                self._write(self.folder / "secret", secret.hex() + "\n", only_if_absent=True)
                secret = self._kept_secret() or secret  # another process's, when it was first
        return OctKey.import_key(secret)

    def _kept_secret(self) -> bytes | None:
        if self.folder is None:
            return None
        try:
            secret = bytes.fromhex((self.folder / "secret").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return secret if len(secret) >= 32 else None

    def rotate(self) -> int:
        """A new secret, and no links: every capability made before is refused. The number of
        links forgotten."""
        from joserfc.jwk import OctKey

        with self._writing():
            self._refresh()
            forgotten = len(self._links)
            secret = secrets.token_bytes(32)
            if self.folder is not None:
                self._write(self.folder / "secret", secret.hex() + "\n")
            self._key = OctKey.import_key(secret)
            self._links, self._verified = {}, OrderedDict()
            self._save()
        return forgotten

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A change of the list (or the secret): this store's lock, and with a folder an
        exclusive ``flock`` on its ``.lock`` file, so two processes of one server
        (``serve --workers``: the catalog page's share button is answered by any) never
        read the list, change it and write it over each other's change."""
        with self._lock:
            if self.folder is None:
                yield
                return
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock

    # ---- the list of links ----------------------------------------------------------------
    def _write(self, path: Path, text: str, *, only_if_absent: bool = False) -> None:
        """``text`` into ``path`` whole (0600, in a 0700 folder): a reader never sees half, and
        a crash after the answer never brings back a list from before it (a revoked link would
        read again). ``only_if_absent``: linked into place, leaving a file another process put
        there first."""
        from tensor_server.uploads.marker import sync_path  # here: uploads/ imports the cache (pyarrow)

        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if not only_if_absent:
            os.replace(tmp, path)
            sync_path(path.parent)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        sync_path(path.parent)

    def _links_file(self) -> Path | None:
        return None if self.folder is None else self.folder / "links.json"

    def _reload(self) -> None:
        """The links file again, and the secret when another process rotated it (a rotation
        rewrites both, the secret first)."""
        path = self._links_file()
        if path is None:
            return
        secret = self._kept_secret()
        if secret is not None and secret != self._key.raw_value:
            from joserfc.jwk import OctKey

            self._key, self._verified = OctKey.import_key(secret), OrderedDict()
        try:
            st = path.stat()
            rows = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            self._links, self._seen = {}, None
            return
        self._links = {r["id"]: Share(**r) for r in rows if isinstance(r, dict)}
        self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        """Read the links file again when another process changed it (a revocation there)."""
        path = self._links_file()
        if path is None:
            return
        try:
            st = path.stat()
            seen: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            self._reload()

    def _save(self) -> None:
        path = self._links_file()
        if path is None:
            return
        self._write(path, json.dumps([asdict(s) for s in self._links.values()]))
        st = path.stat()
        self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)

    # ---- the verbs ------------------------------------------------------------------------
    def mint(
        self, array_id: str, scope: str, expires_seconds: int, creator: str, *, now: float | None = None
    ) -> tuple[Share, str]:
        """(the new link, its capability); ``now``: when its life starts (default: now)."""
        from joserfc import jwt

        if scope not in SCOPES:
            raise InvalidArgument(f"share: scope must be one of {', '.join(SCOPES)}; got {str(scope)[:40]!r}")
        if isinstance(expires_seconds, bool) or not isinstance(expires_seconds, int):
            raise InvalidArgument("share: expires_seconds must be a whole number of seconds")
        if not 1 <= expires_seconds <= MAX_EXPIRES_SECONDS:
            raise InvalidArgument(
                f"share: expires_seconds must be in [1, {MAX_EXPIRES_SECONDS}] (a year); got {expires_seconds}"
            )
        now = time.time() if now is None else now
        share = Share(_link_id(), array_id, scope, now, now + expires_seconds, creator)
        claims = {
            "iss": _ISSUER,
            "jti": share.id,
            "sub": array_id,
            "scope": scope,
            "iat": int(now),
            "exp": int(share.expires_at),
        }
        with self._writing():
            self._refresh()
            self._links = {k: s for k, s in self._links.items() if not s.expired()}
            if len(self._links) >= MAX_LINKS:
                raise ResourceExhausted(
                    f"share: {len(self._links)} live links, the most a server keeps; revoke some first"
                )
            self._links[share.id] = share
            self._save()
            capability = jwt.encode({"alg": "HS256"}, claims, self._key)
        return share, capability

    def links(self, creator: str | None) -> list[Share]:
        """The links ``creator`` made (None: every link), oldest first, the revoked and the
        expired ones included until they are forgotten."""
        with self._lock:
            self._refresh()
            return sorted(
                (s for s in self._links.values() if creator is None or s.creator == creator),
                key=lambda s: s.created_at,
            )

    def get(self, share_id: str) -> Share | None:
        with self._lock:
            self._refresh()
            return self._links.get(share_id)

    def revoke(self, share_id: str) -> Share:
        with self._writing():
            self._refresh()
            share = self._links.get(share_id)
            if share is None:
                raise InvalidArgument(f"share_revoke: no link {share_id[:40]!r} (share_list lists them)")
            if share.revoked_at is None:
                share = Share(**{**asdict(share), "revoked_at": time.time()})
                self._links[share_id] = share
                self._save()
            return share

    # ---- the check ------------------------------------------------------------------------
    @staticmethod
    def looks_like(token: str) -> bool:
        """``token`` has a capability's shape (a door lets it through; ``check`` decides)."""
        return _has_shape(token)

    def check(self, capability: str) -> Share:
        """The live link ``capability`` is, or Unauthenticated saying why it is not: not signed
        by this server (forged, tampered with, or made before the secret was rotated), revoked
        (when, and its id) or expired (when)."""
        with self._lock:
            self._refresh()  # first: a rotation elsewhere changes the key the signature is checked with
        claims = self._verified_claims(capability)
        with self._lock:
            share = self._links.get(str(claims.get("jti", "")))
        if share is None or share.array_id != claims.get("sub"):
            raise Unauthenticated("unauthenticated: this share link is no longer known to the server (revoked)")
        if share.revoked_at is not None:
            raise Unauthenticated(
                f"unauthenticated: share link {share.id} was revoked at {_iso(share.revoked_at)}; ask for a new one"
            )
        if share.expired():
            raise Unauthenticated(
                f"unauthenticated: share link {share.id} expired at {_iso(share.expires_at)}; ask for a new one"
            )
        return share

    def _verified_claims(self, capability: str) -> dict[str, Any]:
        """The claims of a capability whose signature this server's secret checks (cached)."""
        from joserfc import errors, jwt

        with self._lock:
            claims = self._verified.get(capability)
            if claims is not None:
                self._verified.move_to_end(capability)
                return claims
            key = self._key
        try:
            token = jwt.decode(capability, key, algorithms=["HS256"])
        except (errors.JoseError, ValueError):
            raise Unauthenticated(
                "unauthenticated: this share link was not signed by this server (forged, tampered with, or "
                "made before its share secret was rotated)"
            ) from None
        claims = dict(token.claims)
        if claims.get("iss") != _ISSUER:
            raise Unauthenticated("unauthenticated: this token is not a share link of this server")
        with self._lock:
            if key is self._key:  # not rotated meanwhile
                self._verified[capability] = claims
                while len(self._verified) > _VERIFIED_KEPT:
                    self._verified.popitem(last=False)
        return claims


@functools.lru_cache(maxsize=1024)
def _has_shape(token: str) -> bool:
    """Remembered per token: the regex over a JWT of ~800 characters took ~3 us, asked two or
    three times a request (cProfile of ``Access.read``, loaded 2-core VM, 2026-12-05)."""
    return _SHAPE.fullmatch(token) is not None


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _link_id() -> str:
    """A new link's id: 72 random bits, URL-safe, never starting with ``-`` (one in 64 did, and
    ``share --revoke <id>`` then read the id as an option and refused the command)."""
    while True:
        link_id = secrets.token_urlsafe(9)
        if not link_id.startswith("-"):
            return link_id
