"""Issue 23 findings 3 and 4 as the biopb SDK meets them, on a running server (the door's
translation of the rules in ``catalog/dropped.py``)."""

from __future__ import annotations

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.flight.conftest import client_for


@pytest.fixture
def served(tmp_path, monkeypatch):
    import tifffile

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    root = home / "lab" / "root"
    root.mkdir(parents=True)
    for name in ("a.tif", "b.tif"):
        tifffile.imwrite(root / name, np.ones((8, 8), np.uint8), photometric="minisblack")
    cat = Catalog([root])
    cat.scan()
    with serving(cat) as srv:
        yield client_for(srv), root
    cat.close()


def _sources(client):
    return sorted(
        (r["source_id"], r["source_url"])
        for r in client.query("SELECT source_id, source_url FROM sources", format="records")
    )


@pytest.mark.parametrize(
    "path, why",
    [
        ("/", "whole filesystem"),
        ("/proc", "under /proc"),
        ("/proc/self/root", "whole filesystem"),
        ("/etc", "under /etc"),
    ],
)
def test_system_paths_are_refused_at_once(served, path, why):
    client, _ = served
    with pytest.raises(flight.FlightError, match=why):
        client.register_local_path(path)


def test_the_parent_of_a_served_root_cannot_deregister_its_sources(served):
    client, root = served
    before = _sources(client)
    assert len(before) == 2
    result = client.register_local_path(str(root.parent))
    assert sorted(result.already_present) == [sid for sid, _ in before] and not result.added
    client.deregister_local_path("dnd://lab")
    assert _sources(client) == before
