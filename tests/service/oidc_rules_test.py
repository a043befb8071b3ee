"""Folder rules for sign-in tokens (issue 45, ``[[auth.rules]]``): groups in the configured
claim, or scopes, give read or write on folders of the catalog, on every door. A tensor
outside the caller's folders is refused as an id nothing serves; listings leave it out;
writes need ``write``; the verbs that change the server need ``write`` on the whole catalog.
Keys are made here."""

from __future__ import annotations

import functools
import json
import re
import time

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from tensor_server.catalog import Catalog
from tensor_server.config import load_settings
from tensor_server.errors import InvalidArgument
from tensor_server.service.access import OUTSIDE
from tensor_server.service.oidc import folder_access, parse_rules
from tensor_server.testing import serving

ISSUER, AUDIENCE, TOKEN = "https://login.lab.example/realms/lab", "tensor-server", "server-token-for-rules"
KEY = RSAKey.generate_key(2048, parameters={"kid": "lab-1"}, private=True)
RULES = [
    {"group": "lab-a", "folder": "lab-a", "access": "write"},
    {"group": "lab-b-readers", "folder": "lab-b", "access": "read"},
    {"group": "everyone", "folder": "shared", "access": "read"},
    {"group": "tensors:admin", "folder": "", "access": "write"},  # a scope
]
#: who is who: the claims of each user's token beyond iss, aud, sub and times
USERS = {
    "alice": {"roles": ["lab-a", "everyone"]},
    "bob": {"roles": ["lab-b-readers"]},
    "carol": {"scope": "openid tensors:admin"},
    "dave": {"roles": []},
    "eve": {"groups": ["lab-a"]},  # the default claim, not the one this server reads
}
#: which files each user reads
READS = {
    "alice": {"a", "c"},
    "bob": {"b"},
    "carol": {"a", "b", "c"},
    "dave": set(),
    "eve": set(),
}


def _token(sub: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600, **USERS[sub]}
    return jwt.encode({"alg": "RS256", "kid": "lab-1"}, claims, KEY)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    root = tmp / "data"
    for folder, name in (("lab-a", "a"), ("lab-b", "b"), ("shared", "c")):
        (root / folder).mkdir(parents=True)
        np.save(root / folder / f"{name}.npy", np.full((8, 6), ord(name), np.uint16))
    (root / "lab-b" / "broken.npy").write_bytes(b"not an npy file")  # an unreadable source: a name and a path
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [KEY.as_dict(private=False)]}))
    cat = Catalog([root], rois_path=str(tmp / "rois.duckdb"))
    cat.scan()
    ids = {
        rec.path.stem: next(iter(rec.source.tensors.values())).array_id
        for rec in cat.records()
        if rec.path and rec.source is not None
    }
    assert sorted(ids) == ["a", "b", "c"]
    with serving(
        cat,
        http=True,
        token=TOKEN,
        write_dir=str(tmp / "write"),
        writable=True,
        oidc_issuer=ISSUER,
        oidc_audience=AUDIENCE,
        oidc_jwks_file=str(jwks),
        oidc_groups_claim="roles",
        oidc_rules=RULES,
    ) as srv:
        srv.ids = ids
        yield srv
    cat.close()


def _without_request_id(text: str) -> str:
    return re.sub(r"\s*\[request [^\]]+\].*", "", text, flags=re.S)


def _flight_refusal(call) -> tuple[type, str]:
    with pytest.raises(flight.FlightError) as caught:
        call()
    return type(caught.value), _without_request_id(str(caught.value))


def _http(served, method, path, sub, **request):
    headers = {"Authorization": f"Bearer {_token(sub)}"}
    return httpx.request(method, f"{served.http_url}{path}", headers=headers, timeout=30, **request)


@pytest.mark.parametrize("sub", sorted(USERS))
def test_each_user_reads_its_folders_on_flight_and_http(served, sub):
    client = served.client(_token(sub))
    for name, array_id in served.ids.items():
        if name in READS[sub]:
            np.testing.assert_array_equal(client.get_array(array_id), np.full((8, 6), ord(name), np.uint16))
            assert _http(served, "GET", f"/zarr/{array_id}/.zattrs", sub).status_code == 200
        else:
            kind, message = _flight_refusal(functools.partial(client.get_array, array_id))
            assert kind is flight.FlightUnauthorizedError and message == OUTSIDE, message
            refused = _http(served, "GET", f"/zarr/{array_id}/.zattrs", sub)
            assert refused.status_code == 403 and OUTSIDE in refused.text


@pytest.mark.parametrize("sub", ["alice", "dave"])
def test_a_tensor_outside_the_folders_is_refused_as_an_unknown_id_is(served, sub):
    """An existence is a read: ``b`` (there, outside) and ``nope`` (nowhere) get one answer."""
    client = served.client(_token(sub))
    outside = _flight_refusal(lambda: client.get_array(served.ids["b"]))
    assert _flight_refusal(lambda: client.get_array("nope")) == outside
    pages = [_http(served, "GET", f"/zarr/{aid}/.zattrs", sub) for aid in (served.ids["b"], "nope")]
    assert [p.status_code for p in pages] == [403, 403]
    assert _without_request_id(pages[0].text) == _without_request_id(pages[1].text)


def test_listings_show_only_the_readable_tensors(served):
    sql = "SELECT unnest(tensors).array_id AS array_id FROM sources"
    for sub in USERS:
        rows = served.client(_token(sub)).query(sql, format="records")
        assert {r["array_id"] for r in rows} == {served.ids[n] for n in READS[sub]}, sub
        top = _http(served, "GET", "/api/catalog", sub).json()
        assert {f["name"] for f in top["folders"]} == {
            {"a": "lab-a", "b": "lab-b", "c": "shared"}[n] for n in READS[sub]
        }, sub
    folders = {"alice": {"lab-a", "shared"}, "bob": {"lab-b"}, "carol": {"lab-a", "lab-b", "shared"}, "dave": set()}
    for sub, seen in folders.items():  # no name or path of another folder's file, readable or not
        rows = served.client(_token(sub)).query("SELECT source_url FROM sources", format="records")
        assert {r["source_url"].split("/")[-2] for r in rows if r["source_url"].startswith("file:")} == seen, sub
    broken = served.client(_token("bob")).query("SELECT source_id FROM sources WHERE NOT is_resolved")
    assert len(broken) == 1  # lab-b's reader sees why its file does not open
    with flight.FlightClient(served.location) as c:
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {_token('alice')}".encode())])
        (answer,) = c.do_action(flight.Action("catalog_children", b'{"key": ""}'), options)
    assert sorted(f["name"] for f in json.loads(answer.body.to_pybytes())["folders"]) == ["lab-a", "shared"]


def _point():
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    roi = ROI()
    roi.point.x, roi.point.y = 2, 3
    return RoiAnnotation(roi=roi, label="rules")


def test_writes_need_a_write_rule_on_the_folder(served):
    alice = served.client(_token("alice"))
    assert len(alice.put_rois(served.ids["a"], [_point()]).stored) == 1
    kind, message = _flight_refusal(lambda: alice.put_rois(served.ids["c"], [_point()]))
    assert kind is flight.FlightUnauthorizedError and "read but do not write" in message
    kind, message = _flight_refusal(lambda: served.client(_token("bob")).put_rois(served.ids["b"], [_point()]))
    assert "read but do not write" in message
    geojson = json.dumps({"type": "FeatureCollection", "features": []})
    assert _http(served, "PUT", f"/rois/{served.ids['a']}.geojson", "alice", content=geojson).status_code == 200
    refused = _http(served, "PUT", f"/rois/{served.ids['c']}.geojson", "alice", content=geojson)
    assert refused.status_code == 403 and "read but do not write" in refused.text
    refused = _http(served, "PUT", f"/rois/{served.ids['b']}.geojson", "alice", content=geojson)
    assert refused.status_code == 403 and OUTSIDE in refused.text


def test_share_links_and_uploads_need_write_too(served):
    made = _http(served, "POST", "/api/share", "alice", json={"array_id": served.ids["a"]})
    assert made.status_code == 200 and made.json()["array_id"] == served.ids["a"]
    refused = _http(served, "POST", "/api/share", "alice", json={"array_id": served.ids["c"]})
    assert refused.status_code == 403 and "read but do not write" in refused.text
    a_source, c_source = (served.ids[n].split("/")[0] for n in ("a", "c"))
    alice = served.client(_token("alice"))
    result = np.zeros((4, 4), np.uint8)
    up = alice.setup_array_upload(f"cache://{a_source}/@fields/result", result)
    assert up.array_id == f"{a_source}/@fields/result"
    kind, message = _flight_refusal(lambda: alice.setup_array_upload(f"cache://{c_source}/@fields/result", result))
    assert "read but do not write" in message
    assert served.runtime.uploads.get(f"{c_source}/@fields/result") is None  # nothing half-made


def test_an_export_needs_write_on_the_tensors_folder(served):
    headers = [(b"authorization", f"Bearer {_token('alice')}".encode())]
    with flight.FlightClient(served.location) as c:
        options = flight.FlightCallOptions(headers=headers)
        for name, allowed in (("a", True), ("c", False)):
            body = json.dumps({"array_id": served.ids[name], "dest": f"export-{name}.ome.zarr"}).encode()
            call = functools.partial(lambda b: list(c.do_action(flight.Action("export", b), options)), body)
            if allowed:
                assert json.loads(call()[-1].body.to_pybytes())["event"] == "done"
            else:
                kind, message = _flight_refusal(call)
                assert kind is flight.FlightUnauthorizedError and "read but do not write" in message


@pytest.mark.parametrize("sub, allowed", [("alice", False), ("carol", True)])
def test_changing_the_server_needs_write_on_the_whole_catalog(served, sub, allowed):
    headers = [(b"authorization", f"Bearer {_token(sub)}".encode())]
    from biopb.image.annotation_pb2 import RoiPruneRequest

    body = RoiPruneRequest(unseen_days=30).SerializeToString()
    with flight.FlightClient(served.location) as c:
        call = lambda: list(c.do_action(flight.Action("roi_prune", body), flight.FlightCallOptions(headers=headers)))  # noqa: E731
        if allowed:
            assert len(call()) == 1
        else:
            kind, message = _flight_refusal(call)
            assert kind is flight.FlightUnauthorizedError and 'folder = ""' in message


def test_rules_are_checked_when_the_server_starts():
    assert parse_rules(RULES)[0].folder == ("lab-a",)
    for bad, says in (
        ([{"group": "x", "folder": "a"}], "exactly group, folder and access"),
        ([{"group": "x", "folder": "a", "access": "admin"}], "'read' or 'write'"),
        ([{"group": "", "folder": "a", "access": "read"}], "non-empty"),
        ({"group": "x"}, "a list"),
    ):
        with pytest.raises(InvalidArgument, match=says):
            parse_rules(bad)


def test_a_folder_rule_covers_its_folder_component_by_component():
    rules = parse_rules([{"group": "g", "folder": "lab-a/", "access": "read"}])
    assert folder_access(rules, frozenset({"g"}), ("lab-a", "x.npy")) == "read"
    assert folder_access(rules, frozenset({"g"}), ("lab-a", "deep", "x.npy")) == "read"
    assert folder_access(rules, frozenset({"g"}), ("lab-ab", "x.npy")) is None
    assert folder_access(rules, frozenset({"h"}), ("lab-a", "x.npy")) is None


def test_the_config_file_takes_rules(tmp_path):
    config = tmp_path / "server.toml"
    config.write_text(
        '[auth]\noidc_issuer = "https://login"\noidc_groups_claim = "roles"\n'
        '[[auth.rules]]\ngroup = "lab-a"\nfolder = "lab-a"\naccess = "write"\n'
        '[[auth.rules]]\ngroup = "all"\nfolder = ""\naccess = "read"\n'
    )
    settings = load_settings(config)
    assert settings.oidc_groups_claim == "roles"
    assert [(r.group, r.folder, r.access) for r in parse_rules(settings.oidc_rules)] == [
        ("lab-a", ("lab-a",), "write"),
        ("all", (), "read"),
    ]


def test_the_catalog_page_offers_share_where_the_user_writes(served):
    def buttons(folder, sub):
        page = _http(served, "GET", f"/?folder={folder}", sub)
        assert page.status_code == 200, page.text
        return re.findall(r'<button class="share" data-endpoint="[^"]+" data-array-id="([^"]+)">', page.text)

    assert buttons("lab-a", "alice") == [served.ids["a"]]
    assert buttons("shared", "alice") == []  # read, not write
    assert buttons("shared", "carol") == [served.ids["c"]]


def test_a_source_without_a_path_outside_the_folders_is_not_told_apart_from_none(served):
    """A source with no path sits at the top under its id: the catalog JSON of that key is
    the same empty level as of a key nothing has, to a sign-in whose rules do not reach it."""
    from tensor_server.adapters.memory import ArrayAdapter, MemorySource

    cat = served.runtime.catalog
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((4, 4), np.uint8), "yx"), source_id="memo"))
    try:
        levels = [_http(served, "GET", f"/api/catalog?folder={key}", "alice") for key in ("memo", "nothing-here")]
        assert [page.status_code for page in levels] == [200, 200]
        assert [page.json()["sources"] for page in levels] == [[], []]
        carols = _http(served, "GET", "/api/catalog?folder=memo", "carol").json()["sources"]
        assert [s["source_id"] for s in carols] == ["memo"]  # the whole catalog's rule reaches it
    finally:
        cat.remove_records(["memo"])
