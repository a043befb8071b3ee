"""Fixtures of the TLS and browser-safety tests: a self-signed certificate minted once per
module in a tmp home, and a pin store (the SDK's TOFU ``known hosts``) per test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server_cert(tmp_path_factory):
    from tensor_server.service.tls import server_tls

    return server_tls(tmp_path_factory.mktemp("tls-home"))


@pytest.fixture
def pin_store(tmp_path, monkeypatch):
    """A fresh TOFU pin store and an empty SDK memo, so each test pins from scratch."""
    from biopb.tensor._tls import clear_pin_cache

    monkeypatch.setenv("BIOPB_STATE_HOME", str(tmp_path / "biopb-state"))
    clear_pin_cache()
    yield tmp_path / "biopb-state" / "biopb" / "tls-known-hosts.json"
    clear_pin_cache()
