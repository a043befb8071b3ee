"""OIDC bearer tokens: a JWT from the lab's sign-in, verified here and mapped to a user.

A site that runs one server for many people signs them in with OIDC (the identity provider
issues a JWT; a proxy or the client sends it as ``Authorization: Bearer``). With ``[auth]
oidc_issuer``, ``oidc_audience`` and ``oidc_jwks_file`` or ``oidc_jwks_url``, a bearer JWT is
verified by joserfc (no hand-written crypto): its signature against the issuer's JWKS
(asymmetric algorithms only, so ``alg: none`` and an HMAC made with a public key are
refused), ``iss``, ``aud``, ``exp`` and ``nbf`` within ``oidc_leeway`` seconds of clock skew,
and a ``sub``. What the user may do is ``service/access.py``'s rule: a valid token is a user
of the server (the control surface, every tensor without a read grant), whose ``sub`` owns
the uploads and annotations it makes. Rules by group or scope (``[auth.rules]``) are not
built yet.

A verified token is kept (1,024 of them) until its ``exp``, so a tile does not pay the
signature again; the JWKS of a URL is fetched at start and again when a token names a key
it does not hold (at most once a minute).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.errors import InvalidArgument, Unauthenticated

__all__ = ["OidcUser", "OidcVerifier", "ALGORITHMS"]

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

    @property
    def identity(self) -> str:
        return f"oidc:{self.issuer}|{self.subject}"


def unverified_issuer(token: str) -> str | None:
    """The ``iss`` a JWT claims, read without checking anything: only to route it to the
    verifier that can check it (a share link and an OIDC token are both JWTs)."""
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
    ) -> None:
        if not issuer or not audience or not (jwks_file or jwks_url):
            raise InvalidArgument("[auth]: oidc_issuer, oidc_audience and oidc_jwks_file or oidc_jwks_url are needed")
        self.issuer, self.audience, self.leeway = issuer, audience, float(leeway)
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
        user = OidcUser(self.issuer, str(claims["sub"]), float(claims["exp"]))
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
