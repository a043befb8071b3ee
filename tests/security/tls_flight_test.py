"""The real biopb 0.13.0 SDK over ``grpcs://``: trust on first use, ``tls_fingerprint=``, a
wrong or changed certificate refused, and reads, an upload and the chunk_locate fast path
over TLS."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

ARR = np.random.default_rng(3).integers(0, 60000, (256, 256), dtype=np.uint16)


@pytest.fixture(scope="module")
def tls_catalog():
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(ARR, chunk_shape=(64, 64)), source_id="img"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


@contextmanager
def tls_server(catalog, tls, tmp_path, **config):
    from tensor_server.cache import CacheManager

    cache = CacheManager(tmp_path / "cache")
    try:
        with serving(catalog, cache=cache, tls=tls, **config) as srv:
            yield srv
    finally:
        cache.close()


def calls_made(srv) -> int:
    """Every call any door of ``srv`` answered (the metrics' count)."""
    return sum(sum(door.values()) for door in srv.runtime.metrics.calls().values())


def grpcs(srv) -> str:
    assert srv.location.startswith("grpc+tls://127.0.0.1:")
    return "grpcs://" + srv.location.split("://", 1)[1]


def test_tofu_pins_the_certificate_and_reads(tls_catalog, server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient

    with tls_server(tls_catalog, server_cert, tmp_path) as srv:
        client = TensorFlightClient(grpcs(srv))
        np.testing.assert_array_equal(client.get_array("img"), ARR)
        region = client.get_array("img", slice_hint=(slice(10, 90), slice(200, 256)))
        np.testing.assert_array_equal(region, ARR[10:90, 200:256])
        pins = json.loads(pin_store.read_text())
        assert list(pins) == [f"127.0.0.1:{srv.flight.port}"]
        from tensor_server.service.tls import fingerprint

        assert fingerprint(pins[f"127.0.0.1:{srv.flight.port}"].encode()) == server_cert.fingerprint
        health = client.health_check()
        assert health["tls"] is True and health["tls_fingerprint"] == server_cert.fingerprint


def test_a_configured_fingerprint_is_checked_in_both_spellings(tls_catalog, server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient

    from tensor_server.service.tls import format_fingerprint

    with tls_server(tls_catalog, server_cert, tmp_path) as srv:
        for spelling in (server_cert.fingerprint, format_fingerprint(server_cert.fingerprint)):
            client = TensorFlightClient(grpcs(srv), tls_fingerprint=spelling)
            np.testing.assert_array_equal(client.get_array("img")[:64, :64], ARR[:64, :64])
        assert not pin_store.exists(), "a configured fingerprint writes no pin"


def test_a_wrong_fingerprint_is_refused_before_any_call(tls_catalog, server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient
    from biopb.tensor._tls import TlsPinMismatchError

    with tls_server(tls_catalog, server_cert, tmp_path) as srv:
        before = calls_made(srv)
        with pytest.raises(TlsPinMismatchError, match="does not match the configured fingerprint"):
            TensorFlightClient(grpcs(srv), tls_fingerprint="ab" * 32)
        assert calls_made(srv) == before


def test_a_changed_certificate_is_refused_after_the_pin(tls_catalog, server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient
    from biopb.tensor._tls import TlsPinMismatchError, clear_pin_cache

    from tensor_server.service.tls import server_tls

    with tls_server(tls_catalog, server_cert, tmp_path / "a") as srv:
        port = srv.flight.port
        TensorFlightClient(grpcs(srv)).get_array("img")
    clear_pin_cache()  # a new process: only the pin store remembers
    impostor = server_tls(tmp_path / "impostor-home")
    with tls_server(tls_catalog, impostor, tmp_path / "b", port=port) as srv:
        with pytest.raises(TlsPinMismatchError, match="does not match the pinned one"):
            TensorFlightClient(grpcs(srv))


def test_a_plaintext_client_gets_nothing_from_a_tls_server(tls_catalog, server_cert, tmp_path):
    with tls_server(tls_catalog, server_cert, tmp_path) as srv:
        plain = flight.FlightClient(f"grpc://127.0.0.1:{srv.flight.port}")
        with pytest.raises(flight.FlightUnavailableError):
            list(plain.do_action(flight.Action("health", b""), flight.FlightCallOptions(timeout=5)))
        assert sum(door["action:health"] for door in srv.runtime.metrics.calls().values()) == 0


def test_an_upload_over_tls(server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient

    from tests.uploads.conftest import make_catalog

    (tmp_path / "root").mkdir()
    cat = make_catalog(tmp_path / "root")
    try:
        with tls_server(cat, server_cert, tmp_path, write_dir=str(tmp_path / "write"), writable=True) as srv:
            client = TensorFlightClient(grpcs(srv))
            result = np.random.default_rng(1).integers(0, 4096, (96, 80), dtype=np.uint16)
            desc = client.setup_array_upload("cache://scratch/@fields/tls-result", result, chunk_shape=(32, 32))
            assert client.upload_array(desc, result)["state"] == "READY"
            np.testing.assert_array_equal(client.get_array(desc.array_id), result)
            assert srv.runtime.metrics.calls()["flight"]["DoPut"] >= 9  # 3 x 3 chunks went up over TLS
    finally:
        cat.close()


def test_the_chunk_locate_fast_path_over_tls(tls_catalog, server_cert, pin_store, tmp_path):
    from biopb.tensor import TensorFlightClient

    with tls_server(tls_catalog, server_cert, tmp_path) as srv:
        np.testing.assert_array_equal(TensorFlightClient(grpcs(srv)).get_array("img"), ARR)  # fills the cache
        before = srv.runtime.metrics.calls()["flight"]["DoGet"]
        fresh = TensorFlightClient(grpcs(srv), tls_fingerprint=server_cert.fingerprint)
        np.testing.assert_array_equal(fresh.get_array("img"), ARR)
        assert srv.runtime.metrics.calls()["flight"]["DoGet"] == before, "every chunk came through chunk_locate + mmap"
        assert srv.runtime.metrics.calls()["flight"]["action:chunk_locate"] >= 16
