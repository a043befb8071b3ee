"""``export --server URL ARRAY_ID``: a running server's tensor (and its listed label images)
read through the biopb SDK, one pass, into the same OME-Zarr a local export writes: every
level equal to the engine's scaled read of the local source, the labels beside it; a token
is passed with ``--token``, and a wrong one or an unknown id is a one-line error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from tensor_server.adapters.registry import open_source
from tensor_server.catalog import Catalog
from tensor_server.core.engine import ReadEngine
from tensor_server.testing import serving
from tests.export.helpers import run_cli, write_cells

TOKEN = "export-token"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "cells.ome.zarr"
    write_cells(path)
    cat = Catalog([])
    with open_source(path) as src:
        cat.add_source(src)
        cat.first_scan_done.set()
        with serving(cat, token=TOKEN) as srv:
            yield srv, src
    cat.close()


def test_a_served_tensor_exports_with_its_labels(served, tmp_path):
    srv, src = served
    image = src.tensors["image"]
    dest = tmp_path / "out.zarr"
    done = run_cli(
        image.array_id,
        str(dest),
        "--server",
        srv.location,
        "--token",
        TOKEN,
        "--levels",
        "3",
        "--chunks",
        "1,128,128",
        "--shards",
        "1,256,256",
        "--progress",
        "json",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records[0]["labels"] == ["cells"] and records[-1]["event"] == "done"
    group = zarr.open_group(str(dest), mode="r")
    engine = ReadEngine()
    for k in range(3):
        np.testing.assert_array_equal(
            group[str(k)][...], engine.read(image, None, (1, 2**k, 2**k), "area"), err_msg=f"level {k}"
        )
        np.testing.assert_array_equal(
            group[f"labels/cells/{k}"][...], engine.read(src.tensors["image/@labels/cells"], None, (2**k, 2**k), "mode")
        )
    assert group["0"].shards == (1, 256, 256)
    ms = group.attrs["ome"]["multiscales"][0]
    assert ms["datasets"][1]["coordinateTransformations"][0]["scale"] == pytest.approx([1.0, 1.3, 1.3])


def test_a_wrong_token_or_an_unknown_id_is_a_clear_error(served, tmp_path):
    srv, src = served
    image = src.tensors["image"]
    bad = run_cli(image.array_id, str(tmp_path / "a.zarr"), "--server", srv.location, "--token", "wrong")
    assert bad.returncode == 2 and srv.location in bad.stderr and "\n" == bad.stderr[-1] and bad.stderr.count("\n") == 1
    missing = run_cli("no-such-source/x", str(tmp_path / "b.zarr"), "--server", srv.location, "--token", TOKEN)
    assert missing.returncode == 2 and "no-such-source" in missing.stderr, missing.stderr
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr.partial").exists()
