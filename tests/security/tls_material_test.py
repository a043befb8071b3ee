"""service/tls.py: the certificate a server presents, and the rule for serving without one."""

from __future__ import annotations

import datetime
import socket
import stat

import pytest

from tensor_server.errors import FailedPrecondition, InvalidArgument
from tensor_server.service.tls import (
    EXPIRY_WARN_DAYS,
    VALIDITY_DAYS,
    canonical_name,
    expiry_warning,
    format_fingerprint,
    require_safe_transport,
    server_tls,
)


def test_minted_certificate_names_every_address_and_lasts(tmp_path):
    from biopb._security.tls_material import fingerprint as sdk_fingerprint

    tls = server_tls(tmp_path, sans=["Viewer.Lab", "10.9.8.7"])
    assert tls.minted and tls.cert_path == tmp_path / "tls" / "server-cert.pem"
    assert {"localhost", socket.gethostname(), "viewer.lab"} <= set(tls.dns_names)
    assert {"127.0.0.1", "::1", "10.9.8.7"} <= set(tls.ip_addresses)
    assert tls.fingerprint == sdk_fingerprint(tls.cert_pem)  # what the SDK pins and compares
    left = tls.not_after - datetime.datetime.now(datetime.UTC)
    assert VALIDITY_DAYS - 2 <= left.days <= VALIDITY_DAYS
    assert stat.S_IMODE(tls.key_path.stat().st_mode) == 0o600
    assert expiry_warning(tls.not_after) is None
    assert tls.health() == {
        "tls": True,
        "tls_fingerprint": tls.fingerprint,
        "tls_not_after": tls.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert format_fingerprint(tls.fingerprint) in tls.startup_lines()[0]


def test_the_stored_certificate_is_reused_until_a_new_san_is_asked_for(tmp_path):
    first = server_tls(tmp_path, sans=["a.lab"])
    again = server_tls(tmp_path, sans=["a.lab"])
    assert again.fingerprint == first.fingerprint and again.cert_pem == first.cert_pem  # pins stay valid
    assert server_tls(tmp_path).fingerprint == first.fingerprint
    wider = server_tls(tmp_path, sans=["b.lab"])
    assert wider.fingerprint != first.fingerprint and "b.lab" in wider.dns_names


def test_every_spelling_of_a_san_the_certificate_holds_reuses_it(tmp_path):
    first = server_tls(tmp_path, sans=["[::1]"])
    again = server_tls(tmp_path, sans=["[::1]"])  # the second start with the same flag
    assert again.fingerprint == first.fingerprint
    spellings = ["::1", "0:0::1", "[0:0:0:0:0:0:0:1]", "LOCALHOST", "localhost.", " 127.0.0.1 ", "::1%lo", ""]
    for san in spellings:
        assert server_tls(tmp_path, sans=[san]).fingerprint == first.fingerprint, san
    wider = server_tls(tmp_path, sans=["[fd00::7]", "Viewer.Lab."])  # names it lacks: minted anew
    assert wider.fingerprint != first.fingerprint
    assert "fd00::7" in wider.ip_addresses and "viewer.lab" in wider.dns_names
    assert server_tls(tmp_path, sans=["FD00:0::7", "viewer.lab"]).fingerprint == wider.fingerprint
    assert canonical_name("[::FFFF:10.0.0.1]") == ("::ffff:a00:1", True)
    assert canonical_name("Host.Example.") == ("host.example", False)


def test_a_key_file_open_to_other_users_is_served_with_a_warning(tmp_path):
    minted = server_tls(tmp_path)
    assert stat.S_IMODE(minted.cert_path.stat().st_mode) == 0o600  # the home is private: the cert too
    assert not any("WARNING" in line for line in minted.startup_lines())
    minted.key_path.chmod(0o644)  # as an older server, a copy or an archive left it
    reused = server_tls(tmp_path)
    assert reused.fingerprint == minted.fingerprint  # still served
    [warning] = [line for line in reused.startup_lines() if "WARNING" in line]
    assert str(minted.key_path) in warning and "mode 0644" in warning
    assert warning.endswith(f"Fix: chmod 600 {minted.key_path}")
    operator = tmp_path / "operator-key.pem"
    operator.write_bytes(minted.key_pem)
    operator.chmod(0o640)
    given = server_tls(tmp_path / "unused", cert=str(minted.cert_path), key=str(operator))
    assert any(f"chmod 600 {operator}" in line for line in given.startup_lines())


def test_an_operator_pair_is_loaded_and_checked(tmp_path):
    minted = server_tls(tmp_path / "one")
    other = server_tls(tmp_path / "two")
    given = server_tls(tmp_path / "unused", cert=str(minted.cert_path), key=str(minted.key_path))
    assert not given.minted and given.fingerprint == minted.fingerprint
    assert not (tmp_path / "unused" / "tls").exists()
    with pytest.raises(InvalidArgument, match="not the private key"):
        server_tls(tmp_path, cert=str(minted.cert_path), key=str(other.key_path))
    with pytest.raises(InvalidArgument, match="go together"):
        server_tls(tmp_path, cert=str(minted.cert_path))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(InvalidArgument, match="not a PEM certificate"):
        server_tls(tmp_path, cert=str(tmp_path / "junk.pem"), key=str(minted.key_path))
    with pytest.raises(InvalidArgument, match="cannot read"):
        server_tls(tmp_path, cert=str(tmp_path / "absent.pem"), key=str(minted.key_path))


def test_expiry_is_warned_ahead():
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert expiry_warning(now + datetime.timedelta(days=EXPIRY_WARN_DAYS + 5), now) is None
    soon = expiry_warning(now + datetime.timedelta(days=10), now)
    assert soon is not None and "expires on 2030-01-11 (10 days)" in soon and "re-pin" in soon
    gone = expiry_warning(now - datetime.timedelta(days=1), now)
    assert gone is not None and "expired on 2029-12-31" in gone


def test_off_loopback_needs_a_token_and_tls_or_insecure():
    from tensor_server.config import Settings
    from tensor_server.errors import InvalidArgument

    for host in ("127.0.0.1", "localhost", "::1"):
        require_safe_transport(host, Settings(), None)  # loopback: plaintext and no token are fine
    with pytest.raises(InvalidArgument, match="needs --token"):
        require_safe_transport("0.0.0.0", Settings(), object())
    with pytest.raises(FailedPrecondition, match="cleartext") as err:
        require_safe_transport("0.0.0.0", Settings(token="t"), None)
    assert "--tls" in str(err.value) and "--insecure" in str(err.value)
    require_safe_transport("0.0.0.0", Settings(token="t"), object())
    require_safe_transport("0.0.0.0", Settings(token="t", insecure=True), None)


def test_tls_and_http_settings_from_config_and_flags(tmp_path):
    from tensor_server.cli import _settings
    from tensor_server.cli_parser import build_parser
    from tensor_server.config import load_settings

    cfg = tmp_path / "server.toml"
    cfg.write_text(
        '[tls]\nenabled = true\nsans = ["a.lab"]\ninsecure = false\n'
        '[http]\ntoken = false\ncors_origins = ["https://v.example"]\nallowed_hosts = ["t.lab"]\n'
    )
    s = load_settings(cfg)
    assert (s.tls, s.sans, s.insecure, s.http_token) == (True, ["a.lab"], False, False)
    assert (s.cors_origins, s.http_allowed_hosts) == (["https://v.example"], ["t.lab"])
    args = build_parser().parse_args(
        [
            "serve",
            "/data",
            "--config",
            str(cfg),
            "--san",
            "b.lab",
            "--san",
            "10.0.0.9",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--cors-origin",
            "http://w",
        ]
    )
    s = _settings(args)
    assert (s.sans, s.tls_cert, s.tls_key, s.cors_origins) == (["b.lab", "10.0.0.9"], "c.pem", "k.pem", ["http://w"])
    assert s.http_token is False  # the file's, no flag given
    defaults = _settings(build_parser().parse_args(["serve", "/data", "--no-http-token", "--insecure"]))
    assert (defaults.tls, defaults.http_token, defaults.insecure, defaults.sans) == (False, False, True, [])
