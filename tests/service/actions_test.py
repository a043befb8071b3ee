"""The action registry is the one list: Flight lists exactly it, the docs table is it, and
write verbs on a server that takes no writes say how to turn them on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.errors import ReadOnly, Unimplemented
from tensor_server.service import Caller
from tensor_server.service.actions import ACTIONS, actions_table
from tensor_server.testing import serving

DOCS = Path(__file__).resolve().parents[2] / "docs" / "service.md"


@pytest.fixture
def catalog():
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((4, 4), np.uint8), "yx"), source_id="img"))
    cat.first_scan_done.set()
    yield cat
    cat.close()


def test_the_docs_table_is_the_registry():
    text = DOCS.read_text()
    table = re.search(r"<!-- actions:start -->\n(.*?)\n<!-- actions:end -->", text, re.S).group(1)
    assert table == actions_table()


def test_flight_lists_the_registry_and_nothing_else(catalog, tmp_path):
    from tensor_server.cache import CacheManager

    with (
        CacheManager(tmp_path / "c") as cache,
        serving(catalog, cache=cache, write_dir=str(tmp_path / "w"), writable=True) as srv,
    ):
        listed = [(a.type, a.description) for a in flight.FlightClient(srv.location).list_actions()]
    assert listed == [(a.name, a.description) for a in ACTIONS]


def test_a_read_only_server_lists_no_write_verbs_and_refuses_them_by_flag(catalog):
    with serving(catalog) as srv:
        names = [a.type for a in flight.FlightClient(srv.location).list_actions()]
        assert "add_tensor" not in names and "chunk_locate" not in names
        with pytest.raises(ReadOnly, match="start it with --write-dir"):
            srv.runtime.do_action("add_tensor", b"", Caller())
        with pytest.raises(Unimplemented, match="Unknown action: chunk_locate"):
            srv.runtime.do_action("chunk_locate", b"", Caller())


def test_the_open_action_needs_no_token_and_the_others_do(catalog):
    with serving(catalog, token="t") as srv:
        health = json.loads(b"".join(srv.runtime.do_action("health", b"", Caller())))
        assert health["protocol"] == 3 and health["status"] == "SERVING"
        with pytest.raises(Exception, match="unauthenticated"):
            list(srv.runtime.do_action("server_stats", b"", Caller()))
        stats = json.loads(b"".join(srv.runtime.do_action("server_stats", b"", Caller(token="t"))))
        assert stats["calls"]["in-process"]["action:health"] == 1
        assert stats["zarr_decoder"].startswith("libblosc2 (the blosc2 wheel's")  # the one zarr decoder field
        assert "numcodecs on the server's read pool" in stats["zarr_decoder"]
