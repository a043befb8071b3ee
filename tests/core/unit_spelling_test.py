"""One unit spelling on every door (issue 40): a tensor whose data says ``micrometer`` (an
OME-Zarr axis, an in-memory tensor) is ``µm`` on the Flight descriptor, in the catalog page
and its JSON, while the NGFF documents the server writes name it ``micrometer`` as the spec
requires; an image without a unit shows no empty unit or size on the page."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.demo import _write_ome_zarr
from tests.flight.conftest import client_for
from tests.http.conftest import http_serving

TOKEN = "units-token"


@pytest.fixture(scope="module")
def unit_server(tmp_path_factory):
    import tifffile

    root = tmp_path_factory.mktemp("units-root")
    _write_ome_zarr(root / "cells.ome.zarr", np.zeros((2, 64, 64), np.uint16), np.zeros((64, 64), np.uint32))
    tifffile.imwrite(root / "plain.tif", np.zeros((12, 12), np.uint8))  # no resolution: no unit
    cat = Catalog([root])
    cat.scan()
    plane = np.zeros((12, 16), np.uint8)
    cat.add_source(
        MemorySource(
            ArrayAdapter(plane, "yx", physical_scale=(0.5, 0.25), physical_unit=("micrometer", "micrometer")),
            source_id="mem",
        )
    )
    cat.add_source(MemorySource(ArrayAdapter(plane, "yx", physical_scale=(1.0, 1.0)), source_id="bare"))
    with http_serving(cat, tmp_path_factory.mktemp("units-cache"), token=TOKEN) as (srv, http):
        yield cat, srv, http
    cat.close()


def _get(http, path):
    r = httpx.get(f"{http.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _array_id(client, name):
    rows = client.query(
        f"SELECT unnest(tensors).array_id AS a FROM sources WHERE source_url LIKE '%{name}' ORDER BY a",
        format="records",
    )
    return rows[0]["a"]


def test_micrometer_is_spelled_um_on_the_descriptor_and_in_sql(unit_server):
    _, srv, _ = unit_server
    client = client_for(srv, token=TOKEN)
    zarr_id = _array_id(client, "cells.ome.zarr")
    assert client.get_physical_scale(zarr_id) == ([0.0, 0.65, 0.65], ["", "µm", "µm"])
    assert client.get_physical_scale("mem") == ([0.5, 0.25], ["µm", "µm"])
    assert list(client.get_descriptor("mem").physical_unit) == ["µm", "µm"]
    # the sources table has no unit column; nothing in its rows spells the unit another way
    rows = client.query("SELECT source_url, metadata_json FROM sources", format="records")
    assert len(rows) == 4 and not any("micrometer" in (r["metadata_json"] or "") for r in rows)


def test_the_catalog_page_and_its_json_spell_um(unit_server):
    _, _, http = unit_server
    page = _get(http, "/").text
    assert "y: 0.5 µm/px (6 µm)<br>x: 0.25 µm/px (4 µm)" in page
    assert "micrometer" not in page
    top = _get(http, "/api/catalog").json()
    mem = next(s for s in top["sources"] if s["source_id"] == "mem")
    assert mem["tensors"][0]["physical_unit"] == ["µm", "µm"]


def test_ngff_documents_name_the_unit_micrometer(unit_server):
    _, srv, http = unit_server
    for path in ("/zarr/mem/.zattrs", "/zarr3/mem/zarr.json"):
        doc = _get(http, path).json()
        attrs = doc.get("attributes", {}).get("ome", doc)
        (ms,) = attrs["multiscales"]
        assert [a.get("unit") for a in ms["axes"]] == ["micrometer", "micrometer"], path


def test_a_unitless_image_shows_no_empty_unit_or_size(unit_server):
    _, _, http = unit_server
    page = _get(http, "/").text
    assert re.search(r"/px \(\S* ?\)", page) is None  # no "1 /px (12 )"
    assert " /px" not in page
    bare = re.search(r"<tr[^>]*>(?:(?!</tr>).)*\bbare\b(?:(?!</tr>).)*</tr>", page, re.S)
    assert bare is not None and "/px" not in bare.group(0)


@pytest.mark.parametrize("ngff", ["0.4", "0.5"])
def test_an_exported_image_names_the_unit_micrometer(tmp_path, ngff):
    """The export writes NGFF, so the same ``µm`` tensor's axes say ``micrometer`` on disk."""
    import json

    from tensor_server.export import ExportOptions, export_tensor

    t = ArrayAdapter(np.zeros((32, 32), np.uint8), "yx", physical_scale=(0.5, 0.5), physical_unit=("µm", "um"))
    assert t.physical_unit == ("µm", "µm")
    export_tensor(t, tmp_path / "img.zarr", ExportOptions(levels=1, ngff=ngff))
    if ngff == "0.4":
        attrs = json.loads((tmp_path / "img.zarr" / ".zattrs").read_text())
    else:
        attrs = json.loads((tmp_path / "img.zarr" / "zarr.json").read_text())["attributes"]["ome"]
    (ms,) = attrs["multiscales"]
    assert [a.get("unit") for a in ms["axes"]][-2:] == ["micrometer", "micrometer"]
