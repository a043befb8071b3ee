"""Browser safety on the HTTP door: the Host / Origin / token matrix, DNS rebinding, the cookie
a token-bearing URL sets, CORS and Private Network Access preflights; and the printed URL."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.http.security import HttpSecurity, cookie_name
from tests.http.conftest import http_serving

TOKEN = "per-run-token"
GOOD = "http://viewer.good"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cat = Catalog([])
    cat.add_source(
        MemorySource(
            ArrayAdapter(np.arange(64 * 48, dtype=np.uint16).reshape(64, 48), "yx", chunk_shape=(32, 32)),
            source_id="img",
        )
    )
    cat.first_scan_done.set()
    security = HttpSecurity.build(tokens=[TOKEN], allowed_hosts=["tensors.lab"], cors_origins=[GOOD])
    with http_serving(cat, tmp_path_factory.mktemp("door"), security=security) as (srv, _):
        yield srv
    cat.close()


@pytest.fixture
def door(served):
    """The HTTP door of ``served``."""
    return served.http


def get(http, path="/zarr/img/.zattrs", method="GET", **headers):
    import httpx

    return httpx.request(method, f"{http.url}{path}", headers=headers)


def test_host_must_be_loopback_or_configured(served, door):
    port = door.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "tensors.lab", f"Tensors.Lab:{port}"):
        assert get(door, Host=host, Authorization=f"Bearer {TOKEN}").status_code == 200, host
    rebinding = get(door, Host=f"evil.example:{port}", Authorization=f"Bearer {TOKEN}")  # a rebinding page
    assert rebinding.status_code == 403
    assert "DNS rebinding" in rebinding.text and "evil.example" in rebinding.text and "--san" in rebinding.text
    assert get(door, "/healthz", Host="evil.example").status_code == 403  # even the open path
    assert served.runtime.metrics.refusals()["http"]["bad_host"] >= 2


def test_the_token_is_required_even_on_loopback(door):
    assert get(door, "/healthz").text == "ok"  # the one open path
    missing = get(door)
    assert missing.status_code == 401 and "access token" in missing.text
    assert get(door, Authorization="Bearer wrong").status_code == 401
    assert get(door, "/zarr/img/.zattrs?token=wrong").status_code == 401
    assert get(door, "/t/wrong/zarr/img/.zattrs").status_code == 401
    ok = get(door, Authorization=f"Bearer {TOKEN}")
    assert ok.status_code == 200 and ok.json()["multiscales"][0]["datasets"][0]["path"] == "0"
    assert "set-cookie" not in ok.headers  # a header token is not a URL the browser opened
    assert get(door, f"/zarr/img/.zattrs?token={TOKEN}").status_code == 200
    chunk = get(door, f"/t/{TOKEN}/zarr/img/0/1.1")
    assert chunk.status_code == 200 and len(chunk.content) == 32 * 32 * 2


def test_a_token_bearing_url_sets_the_cookie_that_admits_sub_requests(door):
    opened = get(door, f"/t/{TOKEN}/zarr/img/")
    assert opened.status_code == 200
    cookie = opened.headers["set-cookie"]
    name = cookie_name(door.port)
    assert cookie.startswith(f"{name}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP; tls_http_test.py checks the HTTPS flag
    assert get(door, "/zarr/img/0/.zarray", Cookie=f"{name}={TOKEN}").status_code == 200
    same_origin = get(door, "/zarr/img/0/.zarray", Cookie=f"{name}={TOKEN}", Origin=door.url)
    assert same_origin.status_code == 200
    assert get(door, Cookie=f"{cookie_name(door.port + 1)}={TOKEN}").status_code == 401  # another port's
    assert get(door, Cookie=f"{name}=wrong").status_code == 401
    assert get(door, Cookie='garbage;;==; "unterminated').status_code == 401


def test_cross_origin_reads_need_the_token_or_a_configured_origin(door):
    refused = get(door, Origin=EVIL)
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    assert "--cors-origin" in refused.text
    name = cookie_name(door.port)
    ambient = get(door, Origin=EVIL, Cookie=f"{name}={TOKEN}")  # the cookie is ambient: never enough
    assert ambient.status_code == 403 and "access-control-allow-origin" not in ambient.headers
    for path, headers in (
        (f"/t/{TOKEN}/zarr/img/.zattrs", {}),
        (f"/zarr/img/.zattrs?token={TOKEN}", {}),
        ("/zarr/img/.zattrs", {"Authorization": f"Bearer {TOKEN}"}),
    ):
        r = get(door, path, Origin=EVIL, **headers)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == EVIL, path
        assert "etag" in r.headers["access-control-expose-headers"].lower()
        assert "set-cookie" not in r.headers  # no cookie for another origin's fetch
    configured = get(door, Origin=GOOD, Authorization=f"Bearer {TOKEN}")
    assert configured.status_code == 200 and configured.headers["access-control-allow-origin"] == GOOD
    assert get(door, Origin=GOOD).status_code == 401  # a configured origin still brings the token


def test_preflights_and_private_network_access(door):
    def preflight(path="/zarr/img/0/0.0", **headers):
        return get(door, path, "OPTIONS", **{"Access-Control-Request-Method": "GET", **headers})

    pna = {"Access-Control-Request-Private-Network": "true"}
    good = preflight(Origin=GOOD, **pna)
    assert good.status_code == 204 and good.headers["access-control-allow-origin"] == GOOD
    assert good.headers["access-control-allow-private-network"] == "true"
    evil = preflight(Origin=EVIL, **pna)
    assert evil.status_code == 403 and "access-control-allow-private-network" not in evil.headers
    assert "access-control-allow-origin" not in evil.headers
    with_token = preflight(f"/t/{TOKEN}/zarr/img/0/0.0", Origin=EVIL, **pna)
    assert with_token.status_code == 204 and with_token.headers["access-control-allow-private-network"] == "true"
    assert preflight("/t/wrong/zarr/img/0/0.0", Origin=EVIL).status_code == 403
    header_auth = preflight(Origin=EVIL, **{"Access-Control-Request-Headers": "authorization, range"})
    assert header_auth.status_code == 204  # the actual request's header token is checked when it comes
    assert "authorization" in header_auth.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-private-network" not in header_auth.headers  # not asked


def test_without_a_token_only_configured_origins_read(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((8, 8), np.uint8), "yx"), source_id="z"))
    with http_serving(cat, tmp_path, security=HttpSecurity.build(cors_origins=[GOOD])) as (srv, http):
        assert get(http, "/zarr/z/.zattrs").status_code == 200  # --no-http-token: no token asked
        assert get(http, "/zarr/z/.zattrs", Origin=GOOD).headers["access-control-allow-origin"] == GOOD
        assert get(http, "/zarr/z/.zattrs", Origin=EVIL).status_code == 403  # but no page may read
    cat.close()


def test_url_prints_the_running_servers_token(tmp_path, monkeypatch, capsys):
    from tensor_server.cli import main
    from tensor_server.http.access_url import read_url_file, write_url_file

    monkeypatch.setenv("TENSOR_SERVER_HOME", str(tmp_path))
    path = write_url_file(tmp_path, 18816, "https://127.0.0.1:18816", "tok123")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert read_url_file(tmp_path, 18816)["token"] == "tok123"
    assert main(["url", "img/a", "--http-port", "18816"]) == 0
    assert capsys.readouterr().out.strip() == "https://127.0.0.1:18816/t/tok123/zarr/img/a/"
    assert main(["url", "img/a", "--http-port", "18817", "--ngff", "0.5"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "http://127.0.0.1:18817/zarr3/img/a/"
    assert f"no server with the home {tmp_path} is serving HTTP on port 18817" in out.err and "make url" in out.err


def test_the_door_takes_both_tokens_and_this_hosts_names():
    import socket

    from tensor_server.catalog import Catalog
    from tensor_server.config import Settings
    from tensor_server.http.access_url import door_security, mint_access_token
    from tensor_server.service import ServingRuntime

    access = mint_access_token()
    runtime = ServingRuntime(Catalog([]), Settings(token="server-tok"), access_tokens=[access])
    security = door_security(
        runtime,
        access_token=access,
        bind_host="0.0.0.0",
        sans=["Viewer.Lab"],
        allowed_hosts=["tensors.lab"],
        cors_origins=[GOOD + "/"],
    )
    assert len(access) == 32 and security.valid(access) and security.valid("server-tok")
    assert not security.valid("guess") and not security.valid(None)
    for host in (socket.gethostname(), "viewer.lab:8816", "tensors.lab", "127.0.0.1:8816", "[::1]:8816"):
        assert security.host_allowed(host), host
    assert not security.host_allowed("evil.example") and not security.host_allowed("0.0.0.0")
    assert security.cors_origins == frozenset({GOOD})
    opted_out = door_security(ServingRuntime(Catalog([]), Settings()), access_token=None, bind_host="127.0.0.1")
    assert opted_out.tokens == ()
