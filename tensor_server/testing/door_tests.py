"""DoorTests: the rules every door must hold, asserted through each door's own client.

A door (Flight, HTTP, the in-process API, a later IIIF or export door) is a translation of
the serving runtime, so every rule the runtime owns must read the same through it: the
upload gate, auth, each error class and its status, unknown and stale ids, the id grammar,
and that no internal error text reaches a client. A door's tests subclass ``DoorTests`` and
provide a ``door`` fixture: an object with

* ``read(array_id, token)`` → the whole tensor as an ndarray (the test tensors are one chunk);
* ``refusal(exc)`` → ``Refusal(code, status, message)`` for an error the door's client
  raised (``code``: the gRPC code name when the door has one, ``status``: the HTTP status
  when it has one), or None when ``exc`` is not a refusal of this door;
* optionally ``stats(array_id, token)``, ``read_chunk(chunk_id, token)`` and
  ``add_source(path, token)``; a door without one sets it to None and those checks skip;
* optionally the verbs that list or describe tensors, which follow the same read rule as a
  read (a stranger sees no row and no refusal text of a granted tensor): ``query(sql, token)``
  → rows as dicts; ``resolve(source_id, token)`` → the source's ``sources`` row as a dict;
  ``roi_put(array_id, token)`` → stores ``point_roi()``, the number of rows stored;
  ``add_tensor(request_id, shape, token)`` → adds a uint16 upload, its array id;
* optionally ``listed(source_id, token)`` → the array ids the door lists for that source (SQL
  rows, a resolve, the catalog page or JSON), for a door that lists tensors;
* optionally ``control_calls(world)`` → ``[(name, call, error class)]``: every request of the
  door that is not a read of one tensor (each control action, SQL, listings, an upload's
  chunk, making a link) or that writes, each ``call(token)`` made as ``world``'s ``img`` share
  link would make it, and the class it must be refused with (a share link reaches none of
  them, with a server token or without: ``Access.control``);
* ``renders = True`` for a door that answers rendered 8-bit images (IIIF, DeepZoom): its
  reads are checked for the tensor's plane size, not its values.

The world every door is tested against is the ``world`` fixture (one server per door class:
a runtime with a token, a write dir with a PENDING, a READY and a DISCARDED upload, and
tensors whose reads raise each error class); a door fixture builds its client from it. A
door class that defines ``door_on(world)`` is also tested against ``local_world``: the same
uploads on a server without a token (local mode, where the control surface is open and only
grants keep a tensor from strangers), with annotations and decode rates on the granted one.

``PublicationTests`` checks what the doors that publish an image say about it: over OME-Zarr
files ome-zarr-py writes (a stored pyramid with a label pyramid; a one-level volume with a
label volume), the OME-Zarr view and ``export`` write equal NGFF documents (axes, each
dataset's path and transforms, the labels list, each label image's), and the view, IIIF
(``info.json`` ``sizes`` and ``scaleFactors``), DeepZoom (its levels of those factors) and
``export --levels auto`` advertise the same levels.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensor_server import errors
from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.core.bounds import Bounds

__all__ = [
    "DoorTests",
    "DoorWorld",
    "Refusal",
    "TOKEN",
    "GRANT",
    "control_actions",
    "point_roi",
    "PublicationTests",
    "PublishedWorld",
]

TOKEN = "door-tests-token"
#: the grant one READY upload of the world carries (``service/access.py``)
GRANT = "door-tests-grant"
IMAGE = np.arange(32 * 24, dtype=np.uint16).reshape(32, 24)
#: tensors of the "raising" source: reading each raises this error (class, message)
RAISING = {
    "invalid": (errors.InvalidArgument, "a region this tensor refuses"),
    "overloaded": (errors.Overloaded, "too many reads waiting"),
    "too-large": (errors.RequestTooLarge, "more than a request may carry"),
    "denied": (errors.PermissionDenied, "not yours to read"),
    "internal": (RuntimeError, "secret /etc/shadow detail"),
}


@dataclass(frozen=True)
class Refusal:
    code: str | None
    status: int | None
    message: str


class _RaisingAdapter(ArrayAdapter):
    """A tensor whose every read raises one error (the taxonomy, seen through each door)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(np.zeros((8, 8), np.uint8), "yx")
        self._exc = exc

    def read_region(self, bounds: Bounds) -> np.ndarray:
        raise self._exc


@dataclass
class DoorWorld:
    served: Any  # tensor_server.testing.Served
    write_dir: Path
    pending: str
    ready: str
    discarded: str
    ready_pixels: np.ndarray
    granted: str
    #: a READY upload on the scratch source (which holds no tensor of its own)
    scratch_ready: str
    #: share links of ``img`` (``_share_links``): kind -> the capability a client presents
    shares: dict[str, str] = field(default_factory=dict)


def _uploads(runtime: Any) -> dict[str, str]:
    from tensor_server.core.chunk_id import ChunkId
    from tensor_server.service.access import grant_digest

    manager = runtime.uploads
    ids = {}
    for name in ("pending", "ready", "discarded", "granted", "scratch"):
        grant = grant_digest(GRANT) if name == "granted" else ""  # a private upload, its grant's holder's
        target = "scratch/@fields/ready" if name == "scratch" else f"img/@fields/{name}"
        up = manager.add_tensor(
            f"cache://{target}", IMAGE.shape, IMAGE.dtype, chunk_shape=IMAGE.shape, owner=grant, grant=grant
        )
        cid = ChunkId.for_extent(
            up.tensor.array_id, Bounds((0, 0), IMAGE.shape), (1, 1), "none", up.tensor.content_version
        )
        manager.write_chunk(cid, IMAGE + 1)
        ids[name] = up.array_id
    manager.set_ready(ids["ready"])
    manager.set_ready(ids["granted"])
    manager.set_ready(ids["scratch"])
    manager.discard(ids["discarded"], "door tests")
    return ids


def _share_links(runtime: Any) -> dict[str, str]:
    """Capabilities for ``img``: a live one, one that also annotates, a revoked one, an expired one, one whose payload
    was changed after signing (it names the granted upload) and one signed by another key."""
    import base64
    import json

    from joserfc import jwt
    from joserfc.jwk import OctKey

    shares = runtime.shares
    _, live = shares.mint("img", "read", 3600, "")
    revoked, revoked_cap = shares.mint("img", "read", 3600, "")
    shares.revoke(revoked.id)
    _, annotator = shares.mint("img", "read+annotate", 3600, "")
    _, expired = shares.mint("img", "read", 60, "", now=time.time() - 3600)  # last: a mint forgets expired links
    header, payload, signature = live.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "img/@fields/granted"
    tampered_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    forged = jwt.encode({"alg": "HS256"}, claims, OctKey.generate_key(256))
    return {
        "live": live,
        "annotator": annotator,
        "revoked": revoked_cap,
        "expired": expired,
        "tampered": f"{header}.{tampered_payload}.{signature}",
        "forged": forged,
    }


def control_actions(runtime: Any) -> list[tuple[str, bytes]]:
    """(name, body) of every action ``runtime`` serves that is neither open nor a read of one
    tensor (``service/actions.py``): the control surface, each refused before its body is read,
    so an empty body serves; ``share`` names ``img``, the tensor of the world's links."""
    import json

    from tensor_server.service.actions import available_actions

    bodies = {"share": json.dumps({"array_id": "img"}).encode()}
    return [(a.name, bodies.get(a.name, b"")) for a in available_actions(runtime) if not (a.open or a.per_tensor)]


def point_roi() -> Any:
    """One point annotation (what a door's ``roi_put`` stores)."""
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    roi = ROI()
    roi.point.x, roi.point.y = 3, 4
    return RoiAnnotation(roi=roi, label="door tests")


@contextmanager
def _served_world(**options: Any) -> Iterator[DoorWorld]:
    """The catalog and uploads of a world, served with ``options`` (``testing.serving``)."""
    from tensor_server.catalog import Catalog
    from tensor_server.testing.servers import serving

    with tempfile.TemporaryDirectory(prefix="door-tests-") as tmp:
        cat = Catalog([])
        cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=IMAGE.shape), source_id="img"))
        cat.add_source(
            MemorySource({name: _RaisingAdapter(cls(msg)) for name, (cls, msg) in RAISING.items()}, source_id="raising")
        )
        cat.first_scan_done.set()
        write_dir = Path(tmp) / "write"
        try:
            with serving(cat, write_dir=str(write_dir), writable=True, **options) as served:
                ids = _uploads(served.runtime)
                yield DoorWorld(
                    served,
                    write_dir,
                    ids["pending"],
                    ids["ready"],
                    ids["discarded"],
                    IMAGE + 1,
                    ids["granted"],
                    ids["scratch"],
                    _share_links(served.runtime),
                )
        finally:
            cat.close()


#: what the stranger tests ask of each table: the tensor ids its rows are of
TABLE_IDS = {
    "sources": "SELECT unnest(tensors).array_id AS array_id FROM sources",
    "rois": "SELECT array_id FROM rois",
    "decode_rates": "SELECT array_id FROM decode_rates",
}


class DoorTests:
    """Subclass and provide a ``door`` fixture (see the module docstring)."""

    @pytest.fixture(scope="class")
    @classmethod
    def world(cls) -> Iterator[DoorWorld]:
        """A server with a token, uploads in every state and tensors that raise each error
        class; Flight and HTTP doors on loopback. One per door class."""
        with _served_world(http=True, token=TOKEN) as world:
            yield world

    @pytest.fixture(scope="class")
    @classmethod
    def local_world(cls) -> Iterator[DoorWorld]:
        """The world's uploads on a server without a token (local mode), Flight and HTTP doors;
        the granted upload and ``img`` carry an annotation and a decode rate each (the
        granted one's written by its grant holder)."""
        from tensor_server.service.access import grant_digest

        with _served_world(http=True) as world:
            cat = world.served.runtime.catalog
            cat.decode_rates_refresh = 0.0  # publish every sample
            for array_id, writer in ((world.granted, grant_digest(GRANT)), ("img", "")):
                cat.rois.put(array_id, [point_roi()], source_url=None, writer=writer)
                cat.decode_rates.record(array_id, 1 << 20, 0.01)
            yield world

    def door_on(self, world: DoorWorld) -> Any | None:
        """A door of this class on ``world``'s server; None (the default): the local-mode
        checks skip for this door."""
        return None

    @pytest.fixture
    def local(self, request: Any) -> tuple[Any, DoorWorld]:
        """(door, world) in local mode; skips, without starting that server, for a door class
        without ``door_on``."""
        if type(self).door_on is DoorTests.door_on:
            pytest.skip("this door is not tested on the local-mode world")
        world = request.getfixturevalue("local_world")
        return self.door_on(world), world

    # ---- helpers --------------------------------------------------------------------------------
    @staticmethod
    def refused(door: Any, call: Any, *args: Any) -> Refusal:
        """The refusal ``call(*args)`` gets; fails the test when it succeeds or dies otherwise."""
        try:
            call(*args)
        except Exception as exc:  # each door's client raises its own types
            refusal = door.refusal(exc)
            assert refusal is not None, f"{type(exc).__name__} is not a refusal of this door: {exc}"
            return refusal
        pytest.fail(f"{getattr(call, '__name__', call)}{args!r} was not refused")

    @staticmethod
    def assert_pixels(door: Any, got: np.ndarray, want: np.ndarray) -> None:
        if getattr(door, "renders", False):
            assert got.shape[:2] == want.shape[-2:], (got.shape, want.shape)
        else:
            np.testing.assert_array_equal(got, want)

    @staticmethod
    def assert_class(refusal: Refusal, cls: type[errors.TensorServerError]) -> None:
        if refusal.code is not None:
            assert refusal.code == cls.code, refusal
        if refusal.status is not None:
            assert refusal.status == cls.http_status, refusal

    # ---- reads and the gate ---------------------------------------------------------------------
    def test_a_tensor_reads_with_the_token(self, door, world):
        self.assert_pixels(door, door.read("img", TOKEN), IMAGE)

    def test_a_ready_upload_reads(self, door, world):
        self.assert_pixels(door, door.read(world.ready, TOKEN), world.ready_pixels)

    def test_a_pending_upload_is_not_readable_yet(self, door, world):
        refusal = self.refused(door, door.read, world.pending, TOKEN)
        self.assert_class(refusal, errors.FailedPrecondition)
        assert "not readable yet" in refusal.message

    def test_a_discarded_upload_is_refused(self, door, world):
        refusal = self.refused(door, door.read, world.discarded, TOKEN)
        assert refusal.code in (None, "FAILED_PRECONDITION", "ABORTED", "NOT_FOUND"), refusal
        assert refusal.status in (None, 404, 409), refusal
        assert "discarded" in refusal.message

    def test_stats_of_a_pending_upload_are_refused(self, door, world):
        if getattr(door, "stats", None) is None:
            pytest.skip("this door has no stats verb")
        assert door.stats("img", TOKEN)["max"] == int(IMAGE.max())
        self.assert_class(self.refused(door, door.stats, world.pending, TOKEN), errors.FailedPrecondition)

    def test_the_write_dir_is_never_added_as_a_source(self, door, world):
        if getattr(door, "add_source", None) is None:
            pytest.skip("this door has no add_source verb")
        for path in (world.write_dir, world.write_dir / "fields"):
            self.assert_class(self.refused(door, door.add_source, str(path), TOKEN), errors.PermissionDenied)

    # ---- auth -----------------------------------------------------------------------------------
    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_a_stranger_is_refused(self, door, world, token):
        refusal = self.refused(door, door.read, "img", token)
        self.assert_class(refusal, errors.Unauthenticated)

    # ---- per-tensor grants (the reference's ``test_a_stranger_is_refused`` and its variants) -----
    def test_a_grant_holder_reads_its_tensor(self, door, world):
        self.assert_pixels(door, door.read(world.granted, GRANT), world.ready_pixels)
        self.assert_pixels(door, door.read(world.granted, TOKEN), world.ready_pixels)  # the server token too

    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_a_stranger_is_refused_a_granted_tensor(self, door, world, token):
        self.assert_class(self.refused(door, door.read, world.granted, token), errors.Unauthenticated)

    def test_a_grant_reads_nothing_else(self, door, world):
        for other in ("img", world.ready):
            self.assert_class(self.refused(door, door.read, other, GRANT), errors.Unauthenticated)

    def test_a_grant_never_opens_the_control_surface(self, door, world):
        if getattr(door, "add_source", None) is None:
            pytest.skip("this door has no add_source verb")
        self.assert_class(self.refused(door, door.add_source, "/tmp", GRANT), errors.Unauthenticated)

    def test_a_grant_covers_the_stats_of_its_tensor(self, door, world):
        if getattr(door, "stats", None) is None:
            pytest.skip("this door has no stats verb")
        assert door.stats(world.granted, GRANT)["max"] == int(world.ready_pixels.max())

    # ---- share links (service/shares.py) -------------------------------------------------------------
    def test_a_share_link_reads_its_tensor(self, door, world):
        self.assert_pixels(door, door.read("img", world.shares["live"]), IMAGE)

    @pytest.mark.parametrize("other", ["ready", "granted", "raising/invalid", "nope"])
    def test_a_share_link_reads_nothing_else(self, door, world, other):
        array_id = getattr(world, other, other)
        refusal = self.refused(door, door.read, array_id, world.shares["live"])
        self.assert_class(refusal, errors.Unauthenticated)
        if getattr(door, "listed", None) is not None:
            self.assert_class(self.refused(door, door.listed, "img", world.shares["live"]), errors.Unauthenticated)
        if getattr(door, "add_source", None) is not None:
            refusal = self.refused(door, door.add_source, "/tmp", world.shares["live"])
            self.assert_class(refusal, errors.Unauthenticated)

    def assert_no_control(self, door: Any, world: DoorWorld) -> None:
        """Each of the door's control calls, made with ``img``'s live link, is refused with its
        class and a message that names the link; the link still reads ``img``."""
        self.needs(door, "control_calls")
        link, wrong = world.shares["live"], []
        calls = door.control_calls(world)
        assert len(calls) >= 3, calls
        for name, call, cls in calls:
            try:
                call(link)
            except Exception as exc:  # each door's client raises its own types
                refusal = door.refusal(exc)
                if refusal is None or (refusal.code or cls.code, refusal.status or cls.http_status) != (
                    cls.code,
                    cls.http_status,
                ):
                    wrong.append((name, refusal or repr(exc)))
                elif "share link" not in refusal.message:
                    wrong.append((name, f"the refusal does not name the link: {refusal.message}"))
            else:
                wrong.append((name, "not refused"))
        assert wrong == [], wrong
        self.assert_pixels(door, door.read("img", link), IMAGE)

    def test_a_share_link_reaches_no_control_verb(self, door, world):
        self.assert_no_control(door, world)

    def test_local_a_share_link_reaches_no_control_verb(self, local):
        """Local mode: the control surface is open to anyone on the machine, never to a link."""
        door, world = local
        self.assert_no_control(door, world)

    def assert_annotates_its_tensor_alone(self, door: Any, world: DoorWorld) -> None:
        self.needs(door, "roi_put")
        annotator = world.shares["annotator"]
        assert door.roi_put("img", annotator) == 1
        for other in (world.ready, world.granted):
            refusal = self.refused(door, door.roi_put, other, annotator)
            self.assert_class(refusal, errors.Unauthenticated)
            assert "share link" in refusal.message and "reads img" in refusal.message, refusal

    def test_a_read_annotate_link_writes_annotations_of_its_tensor_alone(self, door, world):
        self.assert_annotates_its_tensor_alone(door, world)

    def test_local_a_read_annotate_link_writes_annotations_of_its_tensor_alone(self, local):
        door, world = local
        self.assert_annotates_its_tensor_alone(door, world)

    @pytest.mark.parametrize(
        "kind, says",
        [
            ("revoked", "was revoked"),
            ("expired", "expired at"),
            ("tampered", "not signed by this server"),
            ("forged", "not signed by this server"),
        ],
    )
    def test_a_share_link_that_is_no_longer_good_is_refused_saying_why(self, door, world, kind, says):
        refusal = self.refused(door, door.read, "img", world.shares[kind])
        self.assert_class(refusal, errors.Unauthenticated)
        assert says in refusal.message, refusal

    # ---- ids ------------------------------------------------------------------------------------
    @pytest.mark.parametrize("array_id", ["nope", "img/no-such-field", "raising/nope"])
    def test_an_unknown_id_is_not_found(self, door, world, array_id):
        refusal = self.refused(door, door.read, array_id, TOKEN)
        self.assert_class(refusal, errors.TensorNotFound)

    def test_a_huge_id_is_refused_with_a_bounded_message(self, door, world):
        refusal = self.refused(door, door.read, "x" * 60_000, TOKEN)  # httpx sends URLs up to 64 KiB
        assert refusal.code in (None, "NOT_FOUND", "INVALID_ARGUMENT") and refusal.status in (None, 404, 400, 414)
        assert len(refusal.message) < 4096

    def test_a_ready_listed_field_is_visible_on_every_door_that_lists_tensors(self, door, world):
        """A READY upload is listed with its source wherever tensors are listed, and reads at the
        id listed, on a source's field (``img``) as on the scratch source, which holds no tensor
        of its own; a PENDING one is not listed."""
        for source_id, array_id in (("img", world.ready), ("scratch", world.scratch_ready)):
            self.assert_pixels(door, door.read(array_id, TOKEN), world.ready_pixels)
            if getattr(door, "listed", None) is not None:
                assert array_id in door.listed(source_id, TOKEN), (source_id, array_id)
        if getattr(door, "listed", None) is not None:
            assert world.pending not in door.listed("img", TOKEN)

    def test_the_listed_spelling_of_a_bare_id_reads(self, door, world):
        """``source_id/`` names the default tensor (how the catalog lists it beside attached ones)."""
        self.assert_pixels(door, door.read("img/", TOKEN), IMAGE)

    def test_a_stale_chunk_id_is_refused(self, door, world):
        if getattr(door, "read_chunk", None) is None:
            pytest.skip("this door does not address chunks by id")
        from tensor_server.core.chunk_id import ChunkId

        stale = ChunkId.for_extent("img", Bounds((0, 0), IMAGE.shape), (1, 1), "none", b"\x00" * 16)
        refusal = self.refused(door, door.read_chunk, stale.encode(), TOKEN)
        self.assert_class(refusal, errors.StaleChunkId)
        assert "re-plan" in refusal.message

    # ---- the taxonomy ---------------------------------------------------------------------------
    @pytest.mark.parametrize("field", sorted(RAISING))
    def test_each_error_class_has_its_status(self, door, world, field):
        cls, secret = RAISING[field]
        refusal = self.refused(door, door.read, f"raising/{field}", TOKEN)
        if issubclass(cls, errors.TensorServerError):
            self.assert_class(refusal, cls)
            assert secret in refusal.message
        else:  # not ours: INTERNAL, and nothing of its text or a traceback reaches the client
            assert refusal.code in (None, "INTERNAL") and refusal.status in (None, 500), refusal
            assert "secret" not in refusal.message and "Traceback" not in refusal.message
            assert "RuntimeError" in refusal.message

    def test_the_server_is_still_serving(self, door, world):
        self.assert_pixels(door, door.read("img", TOKEN), IMAGE)

    # ---- one read rule: rows, listings and refusals (a stranger sees nothing of a granted tensor) --
    @staticmethod
    def needs(door: Any, verb: str) -> None:
        if getattr(door, verb, None) is None:
            pytest.skip(f"this door has no {verb} verb")

    @staticmethod
    def table_ids(door: Any, table: str, token: str | None) -> set[str]:
        return {row["array_id"] for row in door.query(TABLE_IDS[table], token)}

    @pytest.mark.parametrize("token", [None, "wrong", GRANT])
    def test_sql_and_resolve_name_no_granted_tensor_to_a_non_full_caller(self, door, world, token):
        """With a server token, SQL and resolve are the control surface: a stranger (and a
        grant, which never opens it) is refused, and the refusal names nothing of the world."""
        self.needs(door, "query")
        self.needs(door, "resolve")
        for refusal in (
            self.refused(door, door.query, TABLE_IDS["sources"], token),
            self.refused(door, door.resolve, "img", token),
        ):
            self.assert_class(refusal, errors.Unauthenticated)
            assert world.granted not in refusal.message and "@fields" not in refusal.message

    def test_the_server_token_sees_every_row(self, door, world):
        self.needs(door, "query")
        self.needs(door, "resolve")
        assert {world.granted, world.ready} <= self.table_ids(door, "sources", TOKEN)
        assert {world.granted, world.ready} <= {t["array_id"] for t in door.resolve("img", TOKEN)["tensors"]}

    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_a_strangers_label_set_refusal_shows_nothing_of_a_granted_image(self, door, world, token):
        self.needs(door, "add_tensor")
        refusal = self.refused(door, door.add_tensor, f"zarr://{world.granted}/@labels/x", (3, 3), token)
        self.assert_class(refusal, errors.Unauthenticated)
        assert str(list(IMAGE.shape)) not in refusal.message and "READY" not in refusal.message
        refusal = self.refused(door, door.add_tensor, f"zarr://{world.granted}/@labels/x", (3, 3), TOKEN)
        self.assert_class(refusal, errors.InvalidArgument)  # its reader is told why
        assert str(list(IMAGE.shape)) in refusal.message

    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_a_strangers_roi_put_onto_a_granted_tensor_is_refused(self, door, world, token):
        self.needs(door, "roi_put")
        self.assert_class(self.refused(door, door.roi_put, world.granted, token), errors.Unauthenticated)

    # ---- the same in local mode, where the control surface is open and only the grant guards ----
    @pytest.mark.parametrize("token", [None, "wrong"])
    @pytest.mark.parametrize("table", sorted(TABLE_IDS))
    def test_local_sql_shows_a_stranger_no_row_of_a_granted_tensor(self, local, table, token):
        door, world = local
        self.needs(door, "query")
        ids = self.table_ids(door, table, token)
        assert world.granted not in ids
        assert ids & {"img", world.ready}, ids  # what carries no grant is listed
        assert not [r for r in door.query(f"SELECT * FROM {table}", token) if world.granted in str(r)]

    @pytest.mark.parametrize("table", sorted(TABLE_IDS))
    def test_local_sql_shows_a_grant_holder_its_own_rows(self, local, table):
        door, world = local
        self.needs(door, "query")
        assert world.granted in self.table_ids(door, table, GRANT)

    @pytest.mark.parametrize("token", [None, "wrong", GRANT])
    def test_local_resolve_lists_a_granted_tensor_to_its_holder_alone(self, local, token):
        door, world = local
        self.needs(door, "resolve")
        listed = {t["array_id"] for t in door.resolve("img", token)["tensors"]}
        assert world.ready in listed
        assert (world.granted in listed) == (token == GRANT)

    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_local_roi_put_onto_a_granted_tensor_is_its_holders_alone(self, local, token):
        door, world = local
        self.needs(door, "roi_put")
        rois = world.served.runtime.catalog.rois
        before = len(rois.list(world.granted)[0])
        refusal = self.refused(door, door.roi_put, world.granted, token)
        self.assert_class(refusal, errors.Unauthenticated)
        assert "capability token" in refusal.message  # the read refusal
        assert len(rois.list(world.granted)[0]) == before
        assert door.roi_put(world.granted, GRANT) == 1
        assert len(rois.list(world.granted)[0]) == before + 1

    @pytest.mark.parametrize("token", [None, "wrong"])
    def test_local_add_tensor_refusals_show_a_stranger_nothing_of_a_granted_tensor(self, local, token):
        """A label set of the granted image, and the granted upload's own name: the read
        refusal for a stranger (no shape, no state); the grant holder is told why."""
        door, world = local
        self.needs(door, "add_tensor")
        label_set, same_name = f"zarr://{world.granted}/@labels/x", f"cache://{world.granted}"
        for request_id in (label_set, same_name):
            refusal = self.refused(door, door.add_tensor, request_id, (3, 3), token)
            self.assert_class(refusal, errors.Unauthenticated)
            assert str(list(IMAGE.shape)) not in refusal.message and "READY" not in refusal.message, refusal
        refusal = self.refused(door, door.add_tensor, label_set, (3, 3), GRANT)
        self.assert_class(refusal, errors.InvalidArgument)
        assert str(list(IMAGE.shape)) in refusal.message
        refusal = self.refused(door, door.add_tensor, same_name, (3, 3), GRANT)
        self.assert_class(refusal, errors.AlreadyExists)
        assert "READY" in refusal.message


# ---- publication: every door that publishes an image says the same about it ---------------------
@dataclass
class PublishedWorld:
    """A server over OME-Zarr files written by ome-zarr-py (``kind`` -> the image's array id
    and its file), and their exports (``(kind, ngff)`` -> the exported image's folder)."""

    http_url: str
    ids: dict[str, str]
    files: dict[str, Path]
    exports: dict[tuple[str, str], Path]


#: the images a publication is checked on: a 2×1024² image with 3 stored levels (1024, 512,
#: 256) and a stored label pyramid of 5 (published on the image's 3), and a 24×1024² volume stored as one level (computed
#: levels down to one 512² tile) with a one-level label volume
PUBLISHED_KINDS = ("stored", "volume")
NGFF_VERSIONS = ("0.4", "0.5")


def _write_published(root: Path) -> dict[str, Path]:
    import warnings

    import zarr
    from ome_zarr.writer import write_image, write_labels

    rng = np.random.default_rng(39)
    micrometer = {"y": "micrometer", "x": "micrometer"}
    files = {"stored": root / "stored.ome.zarr", "volume": root / "volume.ome.zarr"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ome-zarr-py's own deprecations
        group = zarr.open_group(str(files["stored"]), mode="w")
        image = rng.integers(0, 4000, (2, 1024, 1024), dtype=np.uint16)
        write_image(
            image,
            group,
            axes="cyx",
            scale_factors=[2, 4],
            scale={"y": 0.5, "x": 0.5},
            axes_units=micrometer,
            storage_options={"chunks": (1, 256, 256)},
        )
        nuclei = np.zeros((1024, 1024), np.uint32)
        nuclei[100:300, 200:500], nuclei[600:900, 50:400] = 7, 9
        # ome-zarr-py's default label pyramid: 5 levels, under an image of 3
        write_labels(
            nuclei,
            group,
            name="nuclei",
            axes="yx",
            scale={"y": 0.5, "x": 0.5},
            axes_units=micrometer,
            storage_options={"chunks": (256, 256)},
        )
        group = zarr.open_group(str(files["volume"]), mode="w")
        volume = rng.integers(0, 255, (24, 1024, 1024), dtype=np.uint8)
        write_image(volume, group, axes="zyx", scale_factors=[], storage_options={"chunks": (4, 256, 256)})
        write_labels(
            (volume > 250).astype(np.uint8),
            group,
            name="cells",
            axes="zyx",
            scaler=None,
            scale_factors=[],
            storage_options={"chunks": (4, 256, 256)},
        )
    return files


def _ngff_attrs(attrs: dict[str, Any], version: str) -> dict[str, Any]:
    return dict(attrs["ome"]) if version == "0.5" else dict(attrs)


def _said(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the publications must agree on: the axes, each dataset's path and transforms,
    and whether it is a label image."""
    (ms,) = attrs["multiscales"]
    return {"axes": ms["axes"], "datasets": ms["datasets"], "image-label": attrs.get("image-label")}


class PublicationTests:
    """Subclass to run: the OME-Zarr view, IIIF, DeepZoom and an export of one image publish
    the same NGFF documents and the same levels (``core/ngff.py``, ``core/level_grid.py``)."""

    @pytest.fixture(scope="class")
    @classmethod
    def published(cls) -> Iterator[PublishedWorld]:
        from tensor_server.catalog import Catalog
        from tensor_server.export import ExportOptions, export_tensor
        from tensor_server.export.sources import open_export_source
        from tensor_server.testing.servers import serving

        with tempfile.TemporaryDirectory(prefix="publication-tests-") as tmp:
            files = _write_published(Path(tmp) / "data")
            (Path(tmp) / "exports").mkdir()
            exports = {}
            for kind, path in files.items():
                for version in NGFF_VERSIONS:
                    exports[(kind, version)] = dest = Path(tmp) / "exports" / f"{kind}-{version}.ome.zarr"
                    with open_export_source(str(path)) as source:
                        export_tensor(source.tensor, dest, ExportOptions(ngff=version), labels=source.labels)
            cat = Catalog([Path(tmp) / "data"])
            cat.scan()
            ids = {
                kind: next(
                    t.array_id
                    for rec in cat.records()
                    if rec.path is not None and rec.path.name == path.name
                    for t in rec.source.tensors.values()
                    if not t.is_labels
                )
                for kind, path in files.items()
            }
            try:
                with serving(cat, http=True) as served:
                    yield PublishedWorld(served.http_url, ids, files, exports)
            finally:
                cat.close()

    @staticmethod
    def view_attrs(world: PublishedWorld, kind: str, version: str, under: str = "") -> dict[str, Any]:
        """The attributes of the OME-Zarr view's group ``under`` the image (NGFF ``version``)."""
        import httpx

        base = f"{world.http_url}/{'zarr' if version == '0.4' else 'zarr3'}/{world.ids[kind]}/{under}"
        doc = httpx.get(base + (".zattrs" if version == "0.4" else "zarr.json"), timeout=60)
        assert doc.status_code == 200, doc.text
        return _ngff_attrs(doc.json() if version == "0.4" else doc.json()["attributes"], version)

    @staticmethod
    def export_attrs(world: PublishedWorld, kind: str, version: str, under: str = "") -> dict[str, Any]:
        import zarr

        group = zarr.open_group(str(world.exports[(kind, version)] / under), mode="r")
        return _ngff_attrs(group.attrs.asdict(), version)

    @pytest.mark.parametrize("version", NGFF_VERSIONS)
    @pytest.mark.parametrize("kind", PUBLISHED_KINDS)
    def test_the_view_and_the_export_publish_equal_ngff_documents(self, published, kind, version):
        view, export = self.view_attrs(published, kind, version), self.export_attrs(published, kind, version)
        assert _said(view) == _said(export)
        labels = self.view_attrs(published, kind, version, "labels/")["labels"]
        assert (
            labels
            == self.export_attrs(published, kind, version, "labels")["labels"]
            == [{"stored": "nuclei", "volume": "cells"}[kind]]
        )
        for name in labels:
            label_view = self.view_attrs(published, kind, version, f"labels/{name}/")
            label_export = self.export_attrs(published, kind, version, f"labels/{name}")
            assert _said(label_view) == _said(label_export) and label_view["image-label"]["source"]["image"] == "../../"
            assert [d["path"] for d in label_view["multiscales"][0]["datasets"]] == [
                d["path"] for d in view["multiscales"][0]["datasets"]
            ]

    @pytest.mark.parametrize("kind", PUBLISHED_KINDS)
    def test_every_door_advertises_the_same_levels(self, published, kind):
        """The OME-Zarr view's levels (shapes, from each level's ``.zarray``) are IIIF's
        ``sizes`` and ``scaleFactors``, DeepZoom's levels of the same factors, and the levels
        ``export --levels auto`` wrote; down to one 512² plane (the stored levels, else
        computed), so a pyramid, never one level, for both images."""
        import xml.etree.ElementTree as ET
        from urllib.parse import quote

        import httpx
        import zarr

        url, aid = published.http_url, published.ids[kind]
        paths = [d["path"] for d in self.view_attrs(published, kind, "0.4")["multiscales"][0]["datasets"]]
        shapes = [tuple(httpx.get(f"{url}/zarr/{aid}/{p}/.zarray", timeout=60).json()["shape"]) for p in paths]
        planes = [(s[-1], s[-2]) for s in shapes]  # (width, height)
        assert len(planes) == {"stored": 3, "volume": 2}[kind] and max(planes[-1]) <= 512
        assert kind == "stored" or max(planes[-2]) > 512  # computed: down to the first level that fits
        factors = [planes[0][0] // w for w, _ in planes]
        info = httpx.get(f"{url}/iiif/3/{quote(aid, safe='/')}/info.json", timeout=60).json()
        assert info["tiles"][0]["scaleFactors"] == factors
        assert [(s["width"], s["height"]) for s in info["sizes"]] == planes[::-1]
        dzi = ET.fromstring(httpx.get(f"{url}/deepzoom/{quote(aid, safe='/')}.dzi", timeout=60).text)
        size = dzi.find("{http://schemas.microsoft.com/deepzoom/2008}Size")
        width, height = int(size.get("Width")), int(size.get("Height"))
        top = max(0, (max(width, height) - 1).bit_length())
        dzi_levels = {top - k: (-(-width // 2**k), -(-height // 2**k)) for k in range(top + 1)}
        assert [dzi_levels[top - f.bit_length() + 1] for f in factors] == planes
        for version in NGFF_VERSIONS:
            group = zarr.open_group(str(published.exports[(kind, version)]), mode="r")
            assert [tuple(group[p].shape) for p in paths] == shapes and len(list(group.array_keys())) == len(paths)
