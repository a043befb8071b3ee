"""The HTTP door's pages in a browser (issue 38): a credential is never HTML or script, a grant
is no door credential, and every response carries the headers that keep pages unframed and
unsniffed.

One local-mode server (no server token) with the door's per-run token and READY private uploads
whose read grants are script-injection payloads (a local producer may give its upload any grant;
the holder fills it through the SDK with that token as its owner), driven through
the real door with httpx, and the viewer in headless Chromium (skips without it, like
tests/http/neuroglancer_test.py): it loads its tiles through the cookie alone, with the page's
Content-Security-Policy in force.
"""

from __future__ import annotations

import html
import time
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from biopb.tensor import TensorFlightClient

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.http.catalog_page import osd_dir, script_json
from tensor_server.http.security import DATA_POLICY, PAGE_POLICY, HttpSecurity, cookie_name
from tests.http.conftest import http_serving

TOKEN = "door-token-of-this-run"
#: grants a local producer may give an upload: each would run script if a page echoed it raw
PAYLOADS = (
    "</script><script>window.pwned='script'</script>",
    '"><img src=x onerror="window.pwned=\'attr\'">',
    "'-alert(1)-'</script><!--<script>",
)
EVIL = "http://evil.example"
ARR = np.arange(64 * 48, dtype=np.uint16).reshape(64, 48)


def _catalog() -> Catalog:
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, "yx", chunk_shape=(32, 32)), source_id="img"))
    cat.first_scan_done.set()
    return cat


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """(HTTP front end, {payload grant: its upload's id}) in local mode, the door asking its token."""
    from tensor_server.service.access import grant_digest

    tmp = tmp_path_factory.mktemp("pages")
    cat = _catalog()
    security = HttpSecurity.build(tokens=[TOKEN])
    with http_serving(cat, tmp, security=security, write_dir=str(tmp / "w"), writable=True) as (srv, http):
        granted = {}
        for i, grant in enumerate(PAYLOADS):
            digest = grant_digest(grant)
            up = srv.runtime.uploads.add_tensor(
                f"cache://img/@fields/mine{i}", ARR.shape, ARR.dtype, chunk_shape=(32, 32), owner=digest, grant=digest
            )
            owner = TensorFlightClient(srv.location, token=grant)
            assert owner.upload_array(owner.get_descriptor(up.array_id), ARR)["state"] == "READY"
            granted[grant] = up.array_id
        yield http, granted
    cat.close()


def get(http, path, *, cookie=None, **headers):
    cookies = {} if cookie is None else {cookie_name(http.port): cookie}
    with httpx.Client(cookies=cookies) as client:
        return client.get(f"{http.url}{path}", headers=headers)


def _no_payload_in(text: str) -> None:
    """None of the payloads as markup (escaped text of them is harmless)."""
    for payload in PAYLOADS:
        for markup in (payload, "<script>window", "<img src=x", "<!--", "'-alert"):
            assert markup not in text, (markup, text[:400])


def test_a_payload_token_never_reaches_a_page(door):
    http, granted = door
    for grant, array_id in granted.items():
        aid = quote(array_id, safe="/")
        page = get(http, f"/view/{aid}?token={quote(grant)}")  # the grant opens its own tensor's viewer
        assert page.status_code == 200 and 'id="viewer-options"' in page.text, page.text[:300]
        _no_payload_in(page.text)
        assert "pwned" not in page.text and "alert" not in page.text  # the viewer names no credential
        assert "set-cookie" not in page.headers  # a grant is no door credential
        assert "token" not in page.text.split('id="viewer-options"')[1]  # no credential in the script at all
        with_cookie = get(http, f"/view/{aid}?token={quote(grant)}x", cookie=TOKEN)  # not a credential
        assert with_cookie.status_code == 401 and "not valid" in with_cookie.text
        _no_payload_in(with_cookie.text)
    page = get(http, "/view/img", cookie=TOKEN)
    options = page.text.split('<script type="application/json" id="viewer-options">')[1].split("</script>")[0]
    assert '"tileSources": "/iiif/3/img/info.json"' in options and "ajaxHeaders" not in options


def test_the_catalog_page_links_carry_no_token_and_its_snippet_is_escaped(tmp_path):
    """Without a door token the page hands on what was presented: the SDK snippet shows it,
    as escaped text; the links never carry it."""
    cat = _catalog()
    try:
        with http_serving(cat, tmp_path, security=HttpSecurity.build()) as (_, http):
            for payload in PAYLOADS:
                page = get(http, f"/?token={quote(payload)}")
                assert page.status_code == 200 and "img" in page.text
                _no_payload_in(page.text)
                assert html.escape(repr(payload)) in page.text  # the snippet, for the user to copy
                assert "token=" not in page.text.replace(f"token={html.escape(repr(payload))}", "")
            options = get(http, "/view/img").text.split('id="viewer-options">')[1].split("</script>")[0]
            assert "token" not in options
    finally:
        cat.close()


def test_script_json_escapes_what_html_would_read():
    text = script_json({"a": "</script><!--&\u2028\u2029'\""})
    assert not {"<", ">", "&", "\u2028", "\u2029"} & set(text)
    assert "\\u003c/script\\u003e" in text and "\\u2028" in text
    import json

    assert json.loads(text) == {"a": "</script><!--&\u2028\u2029'\""}


def test_a_grant_reads_its_tensor_and_nothing_else(door):
    http, granted = door
    grant, array_id = next(iter(granted.items()))
    aid = quote(array_id, safe="/")
    bearer = {"Authorization": f"Bearer {grant}"}
    assert get(http, f"/zarr/{aid}/.zattrs", **bearer).json()["multiscales"][0]["datasets"][0]["path"] == "0"
    chunk = get(http, f"/zarr/{aid}/0/0.0", **bearer)
    assert chunk.status_code == 200 and np.frombuffer(chunk.content, "<u2")[1] == ARR[0, 1]
    assert get(http, f"/iiif/3/{aid}/info.json", **bearer).json()["width"] == 48
    for path in (
        "/zarr/img/.zattrs",
        "/zarr/img/0/0.0",
        "/iiif/3/img/info.json",
        "/deepzoom/img.dzi",
        "/view/img",
        "/",
        "/zarr/nothing-here/.zattrs",
        f"/zarr/{quote(granted[PAYLOADS[1]], safe='/')}/.zattrs",
    ):
        refused = get(http, path, **bearer)
        assert refused.status_code == 401, (path, refused.status_code, refused.text[:200])
        assert get(http, f"{path}{'&' if '?' in path else '?'}token={quote(grant)}").status_code == 401, path
    full = get(http, "/zarr/img/.zattrs", Authorization=f"Bearer {TOKEN}")
    assert full.status_code == 200  # the door's token reads everything, grants included
    assert get(http, f"/zarr/{aid}/.zattrs", Authorization=f"Bearer {TOKEN}").status_code == 200
    for path in ("/zarr/img/.zattrs", f"/zarr/{aid}/.zattrs"):  # a foreign page holding a grant gets no CORS
        foreign = get(http, path, Origin=EVIL, **bearer)
        assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers, path
    opened = get(http, f"/zarr/{aid}/.zattrs?token={quote(grant)}")
    assert opened.status_code == 200 and "set-cookie" not in opened.headers  # no cookie for the door


def test_a_presented_credential_must_be_valid_even_beside_a_good_cookie(door):
    http, granted = door
    assert get(http, "/zarr/img/.zattrs", cookie=TOKEN).status_code == 200
    for path, headers in (
        ("/zarr/img/.zattrs?token=wrong", {}),
        ("/t/wrong/zarr/img/.zattrs", {}),
        ("/zarr/img/.zattrs", {"Authorization": "Bearer wrong"}),
        (f"/zarr/img/.zattrs?token={TOKEN}", {"Authorization": "Bearer wrong"}),
    ):
        refused = get(http, path, cookie=TOKEN, **headers)
        assert refused.status_code == 401 and "not valid" in refused.text, path
    grant = PAYLOADS[0]  # a valid grant beside the cookie: the grant is what the runtime judges
    assert get(http, "/zarr/img/.zattrs", cookie=TOKEN, Authorization=f"Bearer {grant}").status_code == 401
    assert (
        get(
            http, f"/zarr/{quote(granted[grant], safe='/')}/.zattrs", cookie=TOKEN, Authorization=f"Bearer {grant}"
        ).status_code
        == 200
    )


def test_every_response_carries_the_browser_headers(door):
    http, _ = door
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pages = [get(http, "/", **auth), get(http, "/view/img", **auth)]
    data = [
        get(http, "/zarr/img/.zattrs", **auth),
        get(http, "/zarr/img/0/0.0", **auth),
        get(http, "/iiif/3/img/full/max/0/default.png", **auth),
        get(http, "/zarr/img/.zattrs"),
        get(http, "/healthz"),
        get(http, "/healthz", Host="evil.example"),
        get(http, "/healthz", Host="a:1:2"),
        get(http, "/assets/page/pages.js", **auth),
    ]
    assert [r.status_code for r in pages + data] == [200, 200, 200, 200, 200, 401, 200, 403, 400, 200]
    for r in pages + data:
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer" and r.headers["x-frame-options"] == "DENY"
    for r in pages:
        assert r.headers["content-type"].startswith("text/html")
        assert r.headers["content-security-policy"] == PAGE_POLICY
    assert "frame-ancestors 'none'" in PAGE_POLICY and "script-src 'self';" in PAGE_POLICY
    for r in data:
        assert r.headers["content-security-policy"] == DATA_POLICY
    assert data[-1].headers["content-type"].startswith("text/javascript")


def test_the_cookie_admits_only_requests_from_this_origin(door):
    http, _ = door
    for site in ("cross-site", "same-site"):  # another site, or another port of this host
        refused = get(http, "/zarr/img/.zattrs", cookie=TOKEN, **{"Sec-Fetch-Site": site})
        assert refused.status_code == 403 and "Sec-Fetch-Site" in refused.text, site
        assert "access-control-allow-origin" not in refused.headers
    for site in ("same-origin", "none"):  # the server's own page; a typed or bookmarked URL
        assert get(http, "/zarr/img/.zattrs", cookie=TOKEN, **{"Sec-Fetch-Site": site}).status_code == 200, site
    explicit = get(http, f"/zarr/img/.zattrs?token={TOKEN}", **{"Sec-Fetch-Site": "cross-site"})
    assert explicit.status_code == 200  # a page that has the token may use it


def _raw_status(port: int, host: str | None) -> tuple[int, str]:
    """The status and body of ``GET /healthz`` sent with exactly this Host line (None: none)."""
    import socket

    line = "" if host is None else f"Host: {host}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /healthz HTTP/1.1\r\n{line}Connection: close\r\n\r\n".encode("latin-1"))
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


def test_the_host_header_is_parsed_strictly(door):
    http, _ = door
    port = http.port
    for host in (f"localhost:{port}", "localhost", f"127.0.0.1:{port}", f"[::1]:{port}", "[::1]", "a.localhost:1"):
        assert _raw_status(port, host) == (200, "ok"), host
    for host in (
        "localhost:80@evil.example",
        "user@localhost",
        f"localhost:{port}:{port}",
        "localhost:abc",
        "localhost:",
        "localhost:65536",
        "local host",
        "",
        "[::1",
        "[::1]x",
        "[::1]:x",
        "[127.0.0.1]",
        "-x.localhost",
        "localhost/x",
        "localhost\\x",
        "[fe80::1%25eth0]",
        "a" * 400,
    ):
        status, body = _raw_status(port, host)
        assert status == 400, (host, status, body[:200])
        assert "is not a host name or IP address" in body, host
    assert _raw_status(port, None)[0] == 400
    assert _raw_status(port, "evil.example:80")[0] == 403


def _why_not_loaded(browser) -> str:
    """What the page fetched (with statuses), its CSP violations and its console, in full."""
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.responseStatus + ' ' + e.name)"
    )
    console = [f"{e.get('level')} {e.get('message')}" for e in browser.get_log("browser")]
    state = browser.execute_script("return [!!window.viewer, window.viewer && viewer.world.getItemCount()]")
    return "\n".join(
        [
            "OpenSeadragon did not load its tiles; viewer, items: " + str(state),
            "fetched:",
            *fetched,
            "violations: " + str(browser.execute_script("return window.violations")),
            "console:",
            *console,
        ]
    )


def test_the_viewer_loads_its_tiles_through_the_cookie_under_its_policy(door):
    from tests.http.neuroglancer_test import _browser

    if not (osd_dir() / "openseadragon.min.js").is_file():
        pytest.skip("OpenSeadragon is not installed (`make viewer-assets` installs it from npm)")
    http, granted = door
    browser = _browser()  # skips without Chromium
    try:
        browser.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument",
            {
                "source": (
                    "window.violations = []; document.addEventListener('securitypolicyviolation',"
                    " e => window.violations.push(e.violatedDirective + ' ' + e.blockedURI));"
                )
            },
        )
        browser.get(f"{http.url}/view/img?token={TOKEN}")  # the URL sets the cookie; the page has no token
        deadline = time.monotonic() + 180  # a hang guard: the full suite on 2 cores shares them with Chromium
        while not browser.execute_script(
            "return !!(window.viewer && viewer.world.getItemCount() && viewer.world.getItemAt(0).getFullyLoaded())"
        ):
            assert time.monotonic() < deadline, _why_not_loaded(browser)
            time.sleep(0.2)
        assert browser.execute_script("return viewer.world.getItemAt(0).source.width") == 48
        fetched = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => [new URL(e.name).pathname, e.responseStatus])"
        )
        tiles = [status for path, status in fetched if path.startswith("/iiif/3/img/") and "/default." in path]
        assert tiles and set(tiles) == {200}, fetched  # each tile admitted by the cookie alone
        assert browser.execute_script("return window.violations") == []
        for grant, array_id in granted.items():  # a payload in the URL runs nothing
            browser.get(f"{http.url}/view/{quote(array_id, safe='/')}?token={quote(grant)}")
            browser.execute_script("return 1")  # an alert would raise here
            assert browser.execute_script("return window.pwned === undefined && !!window.viewer")
            assert browser.execute_script("return window.violations") == []
    finally:
        browser.quit()
