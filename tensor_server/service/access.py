"""Who may do what: the server token, per-tensor read grants, upload owners and share links,
decided once.

Three rules, in the biopb reference's terms (its ``_authorize`` / ``_grants``), and share links:

* **the control surface** (SQL, actions, ROI writes, creating uploads): the server token when
  one is configured; open otherwise (local mode: the machine is the boundary), except to a
  caller of a door that requires a credential (the HTTP door's access token), who needs a full one;
* **a read of one tensor** (describe, plan, chunk, the localhost fast path, stats, ROI reads,
  every HTTP view): the server token grants everything; otherwise a tensor that carries a
  read grant is read only by the holder of that grant (a stranger is UNAUTHENTICATED even in
  local mode), and one that carries none falls back to the control-surface rule. A grant
  never authorizes the control surface;
* **a write of one upload** (its chunks, a re-plan, READY, DISCARDED): its owner — the holder
  of the token it was created with, or the server token; an upload created without one, the
  control surface's. Anyone else is PERMISSION_DENIED, told whose the upload is to write and
  never its state or grid (the same answer whatever its state).

Owner and read grant are told apart, as in the reference, which never derives a read grant
from a presented token: in local mode the token a client presents when it creates an upload
makes it the upload's **owner** and nothing more, so a notebook that uploads with
``token="your-token"`` publishes results the token-less Tensor Browser reads, as it reads any
served file. A **read grant** is given on purpose: the SDK's ``setup_array_upload`` has no
private option, so uploads over the wire carry none; an in-process producer makes a private
upload with ``UploadManager.add_tensor(..., grant=grant_digest(token))`` (and
``owner=grant_digest(token)`` to write it). With a server token, uploads are the server's.
Only SHA-256s are kept (in the upload's marker, so both survive restarts).

A **share link** (``service/shares.py``: a capability signed by the server, with an id, a
scope and an end) reads one tensor and what it contains — its levels, its label images — on
every door, and nothing else: no other tensor, no listing, no control verb; a forged, revoked
or expired one is refused saying which. Its scope ``read+annotate`` also writes annotations
on that tensor (as its own writer: ``roi_writer``). A link is made by the server token or the
tensor's owner (an upload's: the token it was created with); a tensor without an owner's,
by the control surface (``may_share``).

An **OIDC sign-in token** (``service/oidc.py``, when ``[auth]`` names an issuer) that verifies
is a user of the server: the control surface, and every tensor no read grant covers; its
``sub`` is who owns the uploads and writes the annotations it makes (``identity``), across
token refreshes. With **folder rules** (``[[auth.rules]]``) a user reads only the tensors of
the folders its groups or scopes are given, and the uploads it owns: a tensor elsewhere is
refused exactly as an id nothing serves (``OUTSIDE``: its existence is a read), and listings
and SQL rows leave it out (``row_view``); annotations, uploads and share links need a
``write`` rule on the folder (``folder_write``), and the verbs that change the server itself
(adding and removing sources, rotating the share secret, pruning annotations) a ``write``
rule on the whole catalog (``administer``).

One read rule for everything about a tensor: its existence, shape, state and rows are a read
of it. SQL rows (``sources.tensors``, ``rois``, ``decode_rates``; ``row_view``), ``resolve``'s
row, ``catalog_children``, ROI reads and writes, and every refusal that would name a private
tensor's shape or state (``add_tensor`` of a label set or a taken name, a describe or write
plan) apply the read check first, so a stranger sees neither a private tensor's rows nor its
shape or state; a write of an upload by another (a chunk, ``set_upload_status``) hears the
owner rule, which names the upload and neither.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tensor_server.catalog.sql import EVERY_ROW, RowView
from tensor_server.errors import PermissionDenied, Unauthenticated
from tensor_server.service.oidc import folder_access

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.config import Settings
    from tensor_server.service.caller import Caller
    from tensor_server.service.oidc import OidcUser, OidcVerifier
    from tensor_server.service.shares import Share, ShareStore

__all__ = ["Access", "bearer_token", "grant_digest", "is_one_of", "OUTSIDE"]

#: what a user bound by folder rules hears of a tensor outside its folders and of an id nothing
#: serves alike: the same words, so a refusal tells nothing of what exists
OUTSIDE = (
    "permission denied: no tensor of that id is in the folders your sign-in's groups may read "
    "(the server's [auth.rules])"
)

#: the ``Authorization`` scheme every door takes a token in (RFC 6750; the scheme is case-insensitive)
_BEARER = "bearer "


def grant_digest(token: str) -> str:
    """What is kept of a grant: its SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (Flight's metadata, an HTTP
    header), else None: one reading of the header for every door."""
    if authorization[: len(_BEARER)].lower() != _BEARER:
        return None
    return authorization[len(_BEARER) :]


def _same(a: str, b: str) -> bool:
    """The one comparison of credentials: constant-time, so a wrong guess learns nothing from timing."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


def is_one_of(presented: str | None, tokens: Iterable[str]) -> bool:
    """``presented`` is one of ``tokens`` (constant-time each): for a door that holds tokens of
    its own to tell apart (the HTTP door's credential, which earns CORS and the cookie)."""
    return presented is not None and any(_same(presented, t) for t in tokens)


def _holds(caller: Caller, digest: str) -> bool:
    """The caller presented the token whose SHA-256 is ``digest``."""
    return caller.token is not None and _same(grant_digest(caller.token), digest)


class Access:
    """The three rules over one server's settings and its uploads (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        uploads: Any | None,
        access_tokens: Iterable[str] = (),
        *,
        shares: ShareStore | None = None,
        label_ids: Callable[[str], frozenset[str]] | None = None,
        oidc: OidcVerifier | None = None,
        place_of: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        """``shares``: the server's share links; ``label_ids(array_id)``: the ids of that
        tensor's label images (what its link reads beside it); ``oidc``: the sign-in tokens'
        verifier (None: none are taken); ``place_of(array_id)``: where its source sits in the
        catalog's folders (what the verifier's folder rules match)."""
        self.token = settings.token or None
        #: credentials that hold full access: the server token and, e.g., the HTTP door's access token
        self._full_tokens = tuple(t for t in (self.token, *access_tokens) if t)
        self.uploads = uploads
        self.shares = shares
        self._label_ids = label_ids or (lambda array_id: frozenset())
        self.oidc = oidc
        self._place_of = place_of or (lambda array_id: (array_id,))

    def full(self, caller: Caller) -> bool:
        """The caller holds a full-access credential (the server token, or one beside it)."""
        return caller.token is not None and any(_same(caller.token, t) for t in self._full_tokens)

    def recognizes(self, token: str) -> bool:
        """Whether ``token`` is any credential of this server (full access, or the read grant
        of an upload): a door guarding its transport (HTTP against other web pages) lets it
        through and the rules above decide what it may do. An owner's token is none: it
        writes only what anyone may read (open in local mode, the server token's otherwise)."""
        if any(_same(token, t) for t in self._full_tokens):
            return True
        if self.shares is not None and self.shares.looks_like(token):
            return True  # the read rule says whether it is live, and if not, why
        if self.oidc is not None and self.oidc.claims_issuer(token):
            return True  # the same for a sign-in token
        uploads = [] if self.uploads is None else self.uploads.all_uploads()
        digest = grant_digest(token)
        return any(up.grant and _same(up.grant, digest) for up in uploads)

    def control(self, caller: Caller) -> None:
        """The control-surface rule; also what a tensor without a grant falls back to. A caller
        of a door that requires a credential needs a full one even in local mode (a grant
        passed that door for its own tensor, not for the rest: ``Caller.door_requires_credential``).
        A share link never passes, in local mode either: its holder was sent one tensor, and
        the machine being the boundary (no server token) does not make a link a user of it
        (before this, a link rotated the share secret on a token-less Flight server)."""
        share = self.share_of(caller)
        if share is not None:
            raise Unauthenticated(
                f"unauthenticated: share link {share.id} reads {share.array_id} (its levels and label images) "
                "and nothing else: no other tensor, no listing, no control verb"
            )
        if (
            (self.token is not None or caller.door_requires_credential)
            and not self.full(caller)
            and self.oidc_user(caller) is None
        ):
            raise Unauthenticated(
                "unauthenticated: a valid token is required (Flight: an 'authorization: Bearer "
                "<token>' header; HTTP: that header or ?token=<token>)"
            )

    def _grant(self, tensor: Any) -> str:
        up = None if self.uploads is None else self.uploads.upload_of(tensor)
        return "" if up is None else up.grant

    def share_of(self, caller: Caller) -> Share | None:
        """The live share link the caller presents; None when its token is no capability;
        Unauthenticated saying why for a forged, revoked or expired one."""
        if self.shares is None or caller.token is None or not self.shares.looks_like(caller.token):
            return None
        if self.oidc is not None and self.oidc.claims_issuer(caller.token):
            return None  # a sign-in token: also a JWT
        return self.shares.check(caller.token)

    def oidc_user(self, caller: Caller) -> OidcUser | None:
        """The signed-in user the caller's token names; None when it claims no configured
        issuer; Unauthenticated naming what is wrong with one that does (expired, another
        audience, a signature the issuer's keys do not check, ``alg: none``)."""
        if self.oidc is None or caller.token is None or not self.oidc.claims_issuer(caller.token):
            return None
        return self.oidc.user(caller.token)

    def ruled_user(self, caller: Caller) -> OidcUser | None:
        """The signed-in user the caller is, when folder rules bind users (None otherwise)."""
        if self.oidc is None or not self.oidc.rules:
            return None
        return self.oidc_user(caller)

    def _folder_level(self, user: OidcUser, array_id: str) -> str | None:
        """What the rules give ``user`` on ``array_id`` ("read", "write" or None); an upload
        it owns, "write" wherever it is."""
        up = None if self.uploads is None else self.uploads.get(array_id)
        if up is not None and up.owner and _same(up.owner, grant_digest(user.identity)):
            return "write"
        assert self.oidc is not None  # a ruled user has a verifier
        return folder_access(self.oidc.rules, user.groups, self._place_of(array_id))

    def unknown(self, caller: Caller) -> None:
        """Before a NOT_FOUND: with full access it is said; a user bound by folder rules hears
        ``OUTSIDE``, as of a tensor outside its folders; anyone else the control rule."""
        if self.full(caller):
            return
        if self.ruled_user(caller) is not None:
            raise PermissionDenied(OUTSIDE)
        self.control(caller)

    def folder_read(self, caller: Caller, array_id: str) -> None:
        """A user bound by folder rules reads ``array_id`` (or a source id) only in its
        folders: elsewhere ``OUTSIDE``, as an id nothing serves; everyone else passes here."""
        user = self.ruled_user(caller)
        if user is not None and self._folder_level(user, array_id) is None:
            raise PermissionDenied(OUTSIDE)

    def folder_write(self, caller: Caller, array_id: str) -> None:
        """A write onto ``array_id`` (an annotation, an upload onto its source, a share link of
        it) by a user bound by folder rules needs a ``write`` rule on its folder (or to own the
        upload); everyone else, as the write's own rule says."""
        user = self.ruled_user(caller)
        if user is None:
            return
        level = self._folder_level(user, array_id)
        if level is None:
            raise PermissionDenied(OUTSIDE)
        if level != "write":
            raise PermissionDenied(
                f"permission denied: {array_id} is in a folder your sign-in's groups read but do not write "
                '(the server\'s [auth.rules] give write with access = "write")'
            )

    def administer(self, caller: Caller) -> None:
        """The verbs that change the server itself (adding and removing sources, rotating the
        share secret, pruning annotations): the control surface, and for a user bound by
        folder rules a ``write`` rule on the whole catalog (``folder = ""``)."""
        self.control(caller)
        user = self.ruled_user(caller)
        if user is not None and self.oidc is not None and folder_access(self.oidc.rules, user.groups, ()) != "write":
            raise PermissionDenied(
                "permission denied: this verb changes the server; the server's [auth.rules] give it to a group "
                'with access = "write" on folder = "" (the whole catalog), which your sign-in has not'
            )

    def identity(self, caller: Caller) -> str:
        """Who the caller is for owners and writers, as kept (a SHA-256): a signed-in user's
        ``sub`` (not the token, which is refreshed), else the token presented; "" for none."""
        user = self.oidc_user(caller)
        if user is not None:
            return grant_digest(user.identity)
        return grant_digest(caller.token) if caller.token else ""

    def _is(self, caller: Caller, digest: str) -> bool:
        identity = self.identity(caller)
        return bool(identity) and _same(identity, digest)

    def read(self, caller: Caller, tensor: Any) -> None:
        """A read of ``tensor`` (module docstring), on every request of a tile: each credential
        is looked at once here (cProfile of the HTTP app: a sign-in asked its verifier three
        times a request, and the share and full checks twice)."""
        if self.full(caller):
            return
        share = self.share_of(caller)
        if share is not None:
            if tensor.array_id == share.array_id or tensor.array_id in self._label_ids(share.array_id):
                return
            raise Unauthenticated(
                f"unauthenticated: share link {share.id} reads {share.array_id} (its levels and label images) "
                "and nothing else"
            )
        user = self.oidc_user(caller)  # once: the control rule below would ask again
        if user is not None and self.oidc is not None and self.oidc.rules:
            if self._folder_level(user, tensor.array_id) is None:
                raise PermissionDenied(OUTSIDE)
        grant = self._grant(tensor)
        if not grant:
            if user is None:  # a signed-in user passes the control rule
                self.control(caller)
            return
        if not _holds(caller, grant):
            raise Unauthenticated(
                f"unauthenticated: {tensor.array_id} is read with its capability token (or the "
                "server token); the token presented is neither"
            )

    def may_read(self, caller: Caller, tensor: Any) -> bool:
        """``read`` as a yes or no (a listing leaves out what it would refuse)."""
        try:
            self.read(caller, tensor)
        except (Unauthenticated, PermissionDenied):
            return False
        return True

    def write(self, caller: Caller, up: Any) -> None:
        """A write of an upload (its chunks, a re-plan, READY, DISCARDED): its owner's (the
        holder of the token it was created with, or full access; an upload with no owner, the
        control surface's). Anyone else hears why, never the upload's state or grid."""
        if self.full(caller):
            return
        if not up.owner:
            self.control(caller)
            return
        if not self._is(caller, up.owner):
            raise PermissionDenied(
                f"permission denied: {up.array_id} is an upload whose chunks and status only "
                "its owner writes (the client whose token created it) or the server token; the "
                "token presented is neither",
                upload=up.array_id,
            )

    def row_view(self, caller: Caller) -> RowView:
        """The rows of the catalog's SQL tables (and listings) ``caller`` sees: every row with
        full access; otherwise the rows of the tensors it may read — everything no read grant
        covers (the control rule let it in already) and the uploads whose grant it holds.
        Callers holding no grant of any upload share one view, so strangers cycling tokens
        share one snapshot; each grant holder has its own (``catalog/sql.py``)."""
        if self.full(caller):
            return EVERY_ROW
        uploads = [] if self.uploads is None else self.uploads.all_uploads()
        digest = grant_digest(caller.token) if caller.token else ""  # once, not once per upload
        held = next((up.grant for up in uploads if up.grant and digest and _same(up.grant, digest)), "")
        user = self.ruled_user(caller)
        if user is not None:  # its groups and its own uploads decide: a view per user
            return RowView(
                ("user", user.identity, user.groups, held),
                lambda array_id: self._granted_to_another(array_id, held) or self._folder_level(user, array_id) is None,
                lambda source_id: self._folder_level(user, source_id) is None,
            )
        return RowView(("grant", held), lambda array_id: self._granted_to_another(array_id, held))

    def _granted_to_another(self, array_id: str, held: str) -> bool:
        """``array_id`` is an upload (live or a tombstone) whose read grant is not ``held``."""
        up = None if self.uploads is None else self.uploads.get(array_id)
        return up is not None and bool(up.grant) and not (held and _same(up.grant, held))

    def annotate(self, caller: Caller) -> None:
        """An annotation write: the control surface, or a share link whose scope is
        ``read+annotate`` (the tensor's read rule then keeps it to its tensor)."""
        share = self.share_of(caller)
        if share is None:
            self.control(caller)
        elif not share.annotates:
            raise PermissionDenied(
                f"permission denied: share link {share.id} reads {share.array_id}; its scope ({share.scope}) "
                "writes no annotations"
            )

    def may_share(self, caller: Caller, tensor: Any) -> None:
        """Making a share link to ``tensor``: the server token, or the tensor's owner (an
        upload's: the holder of the token it was created with); a tensor without an owner,
        the control surface. Never a share link itself."""
        if self.full(caller):
            return
        if self.share_of(caller) is not None:
            raise PermissionDenied("permission denied: a share link makes no share links")
        up = None if self.uploads is None else self.uploads.upload_of(tensor)
        if up is None or not up.owner:
            self.control(caller)
            self.folder_write(caller, tensor.array_id)
        elif not self._is(caller, up.owner):
            raise PermissionDenied(
                f"permission denied: {up.array_id} is shared by its owner (the client whose token created it) "
                "or the server token; the token presented is neither"
            )

    def creator(self, caller: Caller) -> str:
        """Who a share link is by: "" for full access or no token, else the digest of the token."""
        return "" if self.full(caller) else self.identity(caller)

    def roi_writer(self, caller: Caller) -> str | None:
        """Who an annotation write is by (``catalog/rois.py``): None for full access (it may
        change any row), else the caller's ``identity`` ("" for none)."""
        if self.full(caller):
            return None
        return self.identity(caller)

    def owner_for(self, caller: Caller) -> str:
        """The owner a new upload created by ``caller`` gets: a signed-in user; in local mode
        the token it presented, if any; with a server token, the server (none). Never a read
        grant."""
        if self.oidc_user(caller) is not None or (self.token is None and caller.token):
            return self.identity(caller)
        return ""
