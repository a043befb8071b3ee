"""The host rule and the faults of images by URL: what may be fetched (schemes, loopback,
private, link-local, the metadata address, allowed_hosts, redirects) and what a client hears
when the host fails (404, HTML, a stall), on the Flight and HTTP doors; a stalled host never
freezes the server."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters._url_fetch import http_request
from tensor_server.adapters.url_source import RemoteSettings, checked_addresses, open_url_source
from tensor_server.catalog import Catalog
from tensor_server.errors import InvalidArgument, PermissionDenied, RemoteUnavailable, UnreadableSource
from tensor_server.testing import serving
from tests.flight.conftest import client_for
from tests.remote.conftest import remote_config

DEFAULT = RemoteSettings()


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:9/x.zarr", "a loopback address"),
        ("http://localhost/x.zarr", "a loopback address"),
        ("http://[::1]/x.zarr", "a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "the cloud metadata address"),
        ("http://169.254.10.10/x", "a link-local address"),
        ("https://10.1.2.3/x.zarr", "a private address"),
        ("https://192.168.0.7/x.zarr", "a private address"),
    ],
)
def test_own_network_is_refused_by_default_saying_why(url, why):
    with pytest.raises(PermissionDenied) as err:
        checked_addresses(url, DEFAULT)
    assert why in str(err.value) and "must not be turned against its own network" in str(err.value)
    assert url[:20] in str(err.value)


@pytest.mark.parametrize("url", ["ftp://host/x.tif", "gopher://h/x", "smb://nas/share/x.zarr"])
def test_only_https_http_and_s3_are_taken(url):
    cat = Catalog([])
    with serving(cat) as srv, pytest.raises(flight.FlightServerError, match="https://, http:// or s3:// URL") as err:
        client_for(srv).register_local_path(url)
    assert url.partition(":")[0] + " scheme is not served" in str(err.value)
    cat.close()


def test_allowed_hosts_is_the_only_list_when_given():
    only = RemoteSettings(allowed_hosts=("data.lab.org", "*.example.org"))
    assert only.allows_listed("data.lab.org", None) and only.allows_listed("img.example.org", 443)
    assert not only.allows_listed("example.org.evil.net", None)
    with pytest.raises(PermissionDenied, match="not in \\[remote\\] allowed_hosts"):
        checked_addresses("https://evil.net/x.zarr", only)
    # a listed host may be on loopback: the operator named it
    assert checked_addresses("http://127.0.0.1:9/x", RemoteSettings(allowed_hosts=("127.0.0.1:9",))) == ["127.0.0.1"]


def test_loopback_host_refused_through_the_sdk_unless_configured(url_host, tmp_path):
    cat = Catalog([])
    with serving(cat) as srv:
        sdk = client_for(srv)
        with remote_config(tmp_path, allowed_hosts=()):
            with pytest.raises(flight.FlightError, match="loopback address.*allowed_hosts"):
                sdk.register_local_path(f"{url_host.url}/cells.ome.zarr")
        assert url_host.count() == 0  # refused before any request
        assert len(sdk.register_local_path(f"{url_host.url}/cells.ome.zarr").added) == 1  # url_host allows it
    cat.close()


def test_redirects_stay_on_the_host_unless_allowed(url_host):
    url_host.redirect["/same"] = f"{url_host.url}/notes.txt"
    url_host.redirect["/away"] = "http://127.0.0.2:9/notes.txt"
    assert http_request(f"{url_host.url}/same").body == b"not an image"
    with pytest.raises(PermissionDenied, match="redirected to another host \\(127.0.0.2\\), refused"):
        http_request(f"{url_host.url}/away")


@pytest.mark.parametrize(
    "path, error, message",
    [
        ("/missing.ome.zarr", UnreadableSource, "not found on the host \\(HTTP 404\\)"),
        ("/page.zarr", UnreadableSource, "HTML page \\(text/html\\), not image data"),
        ("/notes.txt", UnreadableSource, "neither zarr metadata .* nor a TIFF file"),
    ],
)
def test_bad_urls_are_errors_naming_the_url_and_why(url_host, path, error, message):
    url_host.html.add("/page.zarr/zarr.json")
    with pytest.raises(error, match=message) as err:
        open_url_source(f"{url_host.url}{path}", "x")
    assert url_host.url in str(err.value)


def test_bad_url_through_the_sdk_is_invalid_argument_naming_it(url_host):
    cat = Catalog([])
    with serving(cat) as srv, pytest.raises(flight.FlightServerError, match="missing.ome.zarr: not found") as err:
        client_for(srv).register_local_path(f"{url_host.url}/missing.ome.zarr")
    assert "INVALID_ARGUMENT" in str(err.value.extra_info) and not cat.records()
    cat.close()


def test_a_stalled_host_is_unavailable_after_the_deadline_and_the_server_answers_meanwhile(url_host, tmp_path):
    """The host sends headers, then nothing: the read gives up after ``timeout`` with
    UNAVAILABLE naming the URL; while it waits, the server answers other calls. Timing only
    proves "not frozen" (a generous bound)."""
    with remote_config(tmp_path / "c", timeout=1.0):
        src = open_url_source(f"{url_host.url}/vol.zarr", "vol")
        cat = Catalog([])
        cat.add_source(src)
        with serving(cat) as srv:
            sdk = client_for(srv)
            url_host.stall.add("/vol.zarr/c/0/0/0")
            errors = []

            def read():
                try:
                    sdk.get_tensor(src.tensor().array_id)[:2, :50, :60].compute()
                except flight.FlightError as exc:
                    errors.append(exc)

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(0.2)
            health = flight.FlightClient(srv.location).do_action(flight.Action("health", b""))
            assert b"protocol" in next(iter(health)).body.to_pybytes()  # answered while the read is stalled
            reader.join(20)
            assert not reader.is_alive()
        cat.close()
    (exc,) = errors
    assert isinstance(exc, flight.FlightUnavailableError), exc
    assert f"{url_host.url}/vol.zarr/c/0/0/0" in str(exc) and "did not answer within 1 s" in str(exc)


def test_a_stalled_host_is_503_on_the_http_door(url_host, tmp_path):
    import httpx

    with remote_config(tmp_path / "c", timeout=1.0):
        src = open_url_source(f"{url_host.url}/cells.ome.zarr", "cells")
        cat = Catalog([])
        cat.add_source(src)
        url_host.stall.add("/cells.ome.zarr/0/0.0.0")
        with serving(cat, http=True) as srv:
            tid = src.tensor("image").array_id
            reply = httpx.get(f"{srv.http_url}/zarr/{tid}/0/0.0.0", timeout=20)
        cat.close()
    assert reply.status_code == 503, reply.text
    assert f"{url_host.url}/cells.ome.zarr/0/0.0.0" in reply.text and "did not answer within 1 s" in reply.text


def test_remote_unavailable_is_retryable_unavailable():
    exc = RemoteUnavailable("https://h/x", "the host did not answer within 1 s")
    assert (exc.code, exc.http_status, exc.retryable) == ("UNAVAILABLE", 503, True)
    assert isinstance(exc, UnreadableSource) and not isinstance(exc, InvalidArgument)
    assert np.isfinite(exc.retry_after)


def test_add_source_of_a_stalled_host_is_unavailable_naming_the_url(url_host, tmp_path):
    url_host.stall.add("/slow.ome.zarr/zarr.json")
    cat = Catalog([])
    with remote_config(tmp_path / "c", timeout=1.0), serving(cat) as srv:
        with pytest.raises(flight.FlightUnavailableError, match="slow.ome.zarr/zarr.json: the host did not answer"):
            client_for(srv).register_local_path(f"{url_host.url}/slow.ome.zarr")
    assert not cat.records()
    cat.close()


def test_the_remote_section_of_the_config_reaches_every_remote_read(tmp_path):
    """``[remote]`` keys parse into Settings, and ``serve`` installs them (with the hosts of
    its own http(s) roots counted as listed)."""
    from tensor_server.adapters.url_source import remote_settings, set_remote_settings
    from tensor_server.cli import _install_remote
    from tensor_server.config import load_settings

    config = tmp_path / "server.toml"
    config.write_text(
        '[remote]\nallowed_hosts = ["data.lab.org"]\ntimeout = 7.5\nrevalidate_seconds = 30\n'
        f'per_host = 4\ncache_dir = "{tmp_path / "bytes"}"\ncache_max_bytes = 1000000\nmax_object_bytes = 5000\n'
    )
    settings = load_settings(config, roots=["http://10.0.0.5:8000/img.ome.zarr", "/data"])
    old = remote_settings()
    try:
        _install_remote(settings)
        got = remote_settings()
    finally:
        set_remote_settings(old)
    assert (got.allowed_hosts, got.timeout, got.revalidate_seconds, got.per_host) == (("data.lab.org",), 7.5, 30, 4)
    assert (got.cache_dir, got.cache_max_bytes, got.max_object_bytes) == (str(tmp_path / "bytes"), 1000000, 5000)
    assert got.operator_hosts == ("10.0.0.5:8000",) and got.allows_listed("10.0.0.5", 8000)
    assert not got.allows_listed("10.0.0.5", 9000)


def test_a_url_with_credentials_is_refused_without_echoing_them():
    with pytest.raises(InvalidArgument, match="with credentials") as err:
        checked_addresses("https://alice:s3cr3t@example.org/x.ome.zarr", DEFAULT)
    assert "s3cr3t" not in str(err.value) and "example.org/x.ome.zarr" in str(err.value)
