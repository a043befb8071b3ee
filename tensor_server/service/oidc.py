"""OIDC bearer tokens: a JWT from the lab's sign-in, verified here and mapped to a user.

A site that runs one server for many people signs them in with OIDC (the identity provider
issues a JWT; a proxy or the client sends it as ``Authorization: Bearer``). With ``[auth]
oidc_issuer``, ``oidc_audience`` and ``oidc_jwks_file`` or ``oidc_jwks_url``, a bearer JWT is
verified by joserfc (no hand-written crypto): its signature against the issuer's JWKS
(asymmetric algorithms only, so ``alg: none`` and an HMAC made with a public key are
refused), ``iss``, ``aud``, ``exp`` and ``nbf`` within ``oidc_leeway`` seconds of clock skew,
and a ``sub``. What the user may do is ``service/access.py``'s rule: a valid token is a user
of the server (the control surface, every tensor without a read grant), whose ``sub`` owns
the uploads and annotations it makes.

**Folder rules** (``[[auth.rules]]``): each maps a group (a value of the token's
``oidc_groups_claim``, default ``groups``) or a scope (``scope``, ``scp``) to ``read`` or
``write`` on a folder of the catalog (``catalog/tree.py``'s ``SourcePlaces``: a source's
folders under its root, the root's name first when there are several, ``""`` for all).
With rules, a user reads the tensors of the folders its groups are given (and the uploads it
owns), writes (annotations, uploads, share links, exports) where a rule says ``write``, and only a
``write`` rule on ``""`` administers (adds and removes sources, rotates the share secret,
prunes annotations). Without rules, every user reads everything, as before.

A verified token is kept (1,024 of them) until its ``exp``, so a tile does not pay the
signature again; the JWKS of a URL is fetched at start and again when a token names a key
it does not hold (at most once a minute).
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.errors import InvalidArgument, Unauthenticated

__all__ = ["OidcUser", "OidcVerifier", "ALGORITHMS", "FolderRule", "parse_rules", "folder_access", "ACCESS_LEVELS"]

#: what a rule gives, weakest first
ACCESS_LEVELS = ("read", "write")
#: the claims a token's scopes are in (RFC 8693 ``scope``, a space-separated string; Azure AD's ``scp``)
_SCOPE_CLAIMS = ("scope", "scp")

#: the signatures an identity provider makes (RFC 7518): asymmetric only
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
_KEPT = 1024
_REFETCH_SECONDS = 60.0


@dataclass(frozen=True)
class OidcUser:
    """A verified token's user: ``identity`` names it for owners and writers."""

    issuer: str
    subject: str
    expires_at: float
    #: its groups (the configured claim) and scopes: what folder rules match
    groups: frozenset[str] = frozenset()

    @property
    def identity(self) -> str:
        return f"oidc:{self.issuer}|{self.subject}"


@dataclass(frozen=True)
class FolderRule:
    """``[[auth.rules]]``: members of ``group`` may ``access`` the folder ``folder``."""

    group: str
    folder: tuple[str, ...]
    access: str


def parse_rules(raw: Any) -> tuple[FolderRule, ...]:
    """The rules of the config file (a list of tables with ``group``, ``folder``, ``access``),
    or InvalidArgument naming the bad one: a typo must not widen or silently drop a rule."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidArgument("[auth] rules: a list of [[auth.rules]] tables (group, folder, access)")
    rules = []
    for n, entry in enumerate(raw, 1):
        known = {"group", "folder", "access"}
        if not isinstance(entry, dict) or set(entry) != known:
            raise InvalidArgument(f"[[auth.rules]] #{n}: needs exactly group, folder and access; got {entry!r:.200}")
        group, folder, access = entry["group"], entry["folder"], entry["access"]
        if not isinstance(group, str) or not group or not isinstance(folder, str):
            raise InvalidArgument(f"[[auth.rules]] #{n}: group is a non-empty string and folder a string")
        if access not in ACCESS_LEVELS:
            raise InvalidArgument(f"[[auth.rules]] #{n}: access is 'read' or 'write'; got {access!r:.40}")
        rules.append(FolderRule(group, tuple(p for p in folder.split("/") if p), access))
    return tuple(rules)


def folder_access(rules: tuple[FolderRule, ...], groups: frozenset[str], place: tuple[str, ...]) -> str | None:
    """The most the rules give ``groups`` on a source at ``place`` (its folders and name): a
    rule's folder covers every source under it, component by component (``lab-a`` covers
    ``lab-a/x.tif``, not ``lab-ab/x.tif``); None: nothing."""
    best = None
    for rule in rules:
        if rule.group in groups and place[: len(rule.folder)] == rule.folder:
            if rule.access == "write":
                return "write"
            best = "read"
    return best


def _claim_values(value: Any, *, spaced: bool) -> set[str]:
    """A claim's strings: a list of them, or one string (space-separated when ``spaced``)."""
    if isinstance(value, str):
        return set(value.split()) if spaced else {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, str)}
    return set()


@functools.lru_cache(maxsize=1024)
def unverified_issuer(token: str) -> str | None:
    """The ``iss`` a JWT claims, read without checking anything: only to route it to the
    verifier that can check it (a share link and an OIDC token are both JWTs). Remembered per
    token (a pure function of it): the base64 and JSON of its payload were 8-15 us, asked
    once or twice a request (cProfile of ``Access.read``, loaded 2-core VM, 2026-12-05)."""
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > 8192:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    iss = claims.get("iss") if isinstance(claims, dict) else None
    return iss if isinstance(iss, str) else None


class OidcVerifier:
    """The checks above for one issuer and audience (module docstring). Thread-safe."""

    def __init__(
        self,
        issuer: str,
        audience: str,
        *,
        jwks_file: str | None = None,
        jwks_url: str | None = None,
        leeway: float = 60,
        groups_claim: str = "groups",
        rules: tuple[FolderRule, ...] = (),
    ) -> None:
        if not issuer or not audience or not (jwks_file or jwks_url):
            raise InvalidArgument("[auth]: oidc_issuer, oidc_audience and oidc_jwks_file or oidc_jwks_url are needed")
        self.issuer, self.audience, self.leeway = issuer, audience, float(leeway)
        self.groups_claim, self.rules = groups_claim, rules
        self._file, self._url = jwks_file, jwks_url
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, OidcUser] = OrderedDict()
        self._fetched_at = 0.0
        self._keys = self._load_keys()

    def _load_keys(self) -> Any:
        from joserfc.jwk import KeySet

        try:
            if self._file:
                text = Path(self._file).read_text()
            else:
                import urllib.request

                with urllib.request.urlopen(str(self._url), timeout=10) as answer:
                    text = answer.read(1 << 20).decode()
            self._fetched_at = time.monotonic()
            return KeySet.import_key_set(json.loads(text))
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"[auth]: cannot read the JWKS ({self._file or self._url}): {exc}") from None

    def claims_issuer(self, token: str) -> bool:
        """The token says it is this issuer's (whether it is, ``user`` checks)."""
        return unverified_issuer(token) == self.issuer

    def user(self, token: str) -> OidcUser:
        """The user of a valid token, or Unauthenticated naming what is wrong with it."""
        with self._lock:
            kept = self._kept.get(token)
            if kept is not None and time.time() < kept.expires_at + self.leeway:
                self._kept.move_to_end(token)
                return kept
        claims = self._verified(token)
        groups = _claim_values(claims.get(self.groups_claim), spaced=False)
        for name in _SCOPE_CLAIMS:
            groups |= _claim_values(claims.get(name), spaced=True)
        user = OidcUser(self.issuer, str(claims["sub"]), float(claims["exp"]), frozenset(groups))
        with self._lock:
            self._kept[token] = user
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
        return user

    def _verified(self, token: str) -> dict[str, Any]:
        from joserfc import errors, jwt

        try:
            decoded = self._decode(token)
            registry = jwt.JWTClaimsRegistry(
                leeway=int(self.leeway),
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.audience},
                sub={"essential": True},
                exp={"essential": True},
            )
            registry.validate(decoded.claims)
        except errors.ExpiredTokenError:
            raise Unauthenticated("unauthenticated: the sign-in token has expired; sign in again") from None
        except errors.BadSignatureError:
            raise Unauthenticated(
                "unauthenticated: the sign-in token's signature is not the issuer's (signed by another key)"
            ) from None
        except errors.JoseError as exc:
            raise Unauthenticated(
                f"unauthenticated: the sign-in token is refused: {exc.description or exc.error}"
            ) from None
        except ValueError:
            raise Unauthenticated("unauthenticated: the sign-in token is not a JWT") from None
        return dict(decoded.claims)

    def _decode(self, token: str) -> Any:
        """The token's signature checked against the JWKS; a key id the JWKS lacks fetches a
        URL's JWKS again (the provider rotated its keys), at most once a minute."""
        from joserfc import errors, jwt

        try:
            return jwt.decode(token, self._keys, algorithms=ALGORITHMS)
        except (errors.InvalidKeyIdError, errors.MissingKeyError, ValueError):
            if not self._url or time.monotonic() - self._fetched_at < _REFETCH_SECONDS:
                raise
        with self._lock:
            self._keys = self._load_keys()
        return jwt.decode(token, self._keys, algorithms=ALGORITHMS)
