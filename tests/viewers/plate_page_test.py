"""The catalog page shows an HCS plate as one image (``http/catalog_page.py``): one row with
the plate image's thumbnail, its wells in a list whose field links open each field's viewer
(a field's label image beside it), no row per field; the list is paged
(``/wells/<plate id>?start=N``), so a 1536-well plate of 9 fields adds a bounded amount to
the page; a well path that is markup shows as text.

The plate is written with ome-zarr-py's writer (``write_plate_metadata``, ``write_well_metadata``,
``write_image``, ``write_labels``); ome-zarr-py refuses names that are not alphanumeric, so the
markup well is renamed on disk afterwards, as another writer could have named it.
"""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, quote, urljoin, urlsplit

import httpx
import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.http import catalog_page
from tensor_server.service import plates
from tests.http.conftest import http_serving

zarr = pytest.importorskip("zarr")
ome_writer = pytest.importorskip("ome_zarr.writer")
ome_format = pytest.importorskip("ome_zarr.format")

TOKEN = "plate-token"
#: a well's path as a hostile writer could name it: the page must show it as text
MARKUP = 'B/<i>2"&'


def write_plate(
    path: Path,
    rows: list[str],
    columns: list[str],
    wells: dict[str, list[np.ndarray]],
    *,
    listed: tuple[str, ...] = (),
    labels: tuple[str, ...] = (),
) -> Path:
    """An NGFF 0.5 plate through ome-zarr-py's writer: ``wells`` (well -> its fields' ``yx``
    pixels, each with a stored level at factor 2), ``listed`` wells only named in the plate
    (missing), ``labels`` fields (``<well>/<field>``) given a label image ``cells``."""
    fmt = ome_format.FormatV05()
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    ome_writer.write_plate_metadata(root, rows, columns, [*wells, *listed], fmt=fmt)
    for well, fields in wells.items():
        group = root.require_group(well)
        ome_writer.write_well_metadata(group, [str(i) for i in range(len(fields))], fmt=fmt)
        for i, pixels in enumerate(fields):
            image = group.require_group(str(i))
            ome_writer.write_image(pixels, image, scale_factors=(2,), axes="yx", fmt=fmt)
            if f"{well}/{i}" in labels:
                cells = (pixels > pixels.mean()).astype(np.uint8)
                ome_writer.write_labels(cells, image, name="cells", axes="yx", fmt=fmt, scale_factors=(2,))
    return path


def _rename_well(plate: Path, old: str, new: str) -> None:
    """``old``'s folder and its entry in the plate's wells list renamed ``new`` (same row and
    column indices)."""
    (plate / old).rename(plate / new)
    meta = json.loads((plate / "zarr.json").read_text())
    for well in meta["attributes"]["ome"]["plate"]["wells"]:
        if well["path"] == old:
            well["path"] = new
    (plate / "zarr.json").write_text(json.dumps(meta))


class _Page(HTMLParser):
    """What the tests read of a page: thumbnails, tensor rows' names, wells, field links and
    the more-wells link, as parsed HTML (text unescaped by the parser)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.thumbs: list[str] = []
        self.tags: set[str] = set()
        self.wells: list[tuple[str, list[tuple[str, str]]]] = []  # (path, [(text, href)])
        self.more: list[tuple[str, str]] = []
        self._open: tuple[str, dict[str, str]] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "img" and a.get("class") == "thumb":
            self.thumbs.append(a["src"])
        if a.get("class") in ("well", "field", "more-wells"):
            self._open = (a["class"], a)

    def handle_data(self, data):
        if self._open is None:
            return
        kind, a = self._open
        if kind == "well":
            self.wells.append((data, []))
        elif kind == "field":
            self.wells[-1][1].append((data, a.get("href", "")))
        else:
            self.more.append((data, a["href"]))
        self._open = None


@pytest.fixture(scope="module")
def plate_server(tmp_path_factory):
    """A 2 × 3 plate (A/1 two fields, the first with a label image; B/2 renamed MARKUP; B/3;
    A/3 listed, never written) under a token."""
    root = tmp_path_factory.mktemp("plate-root")
    rng = np.random.default_rng(7)
    field = lambda: rng.integers(1, 250, (48, 64), dtype=np.uint8)  # noqa: E731 - a fresh field each call
    wells = {"A/1": [field(), field()], "B/2": [field()], "B/3": [field()]}
    plate = write_plate(
        root / "screen.ome.zarr", ["A", "B"], ["1", "2", "3"], wells, listed=("A/3",), labels=("A/1/0",)
    )
    _rename_well(plate, "B/2", MARKUP)
    cat = Catalog([root])
    cat.scan()
    (rec,) = cat.records()
    with http_serving(cat, tmp_path_factory.mktemp("plate-cache"), token=TOKEN) as (srv, http):
        yield rec.source, http
    cat.close()


def test_the_plate_is_one_thumbnail_with_its_wells_listed(plate_server):
    src, http = plate_server
    plate = src.tensor("plate")
    page = httpx.get(f"{http.url}/?token={TOKEN}")
    assert page.status_code == 200
    parsed = _Page(page.text)
    assert parsed.thumbs == [f"/iiif/3/{plate.array_id}/full/!160,160/0/default.jpg"]
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        thumb = client.get(urljoin(http.url, parsed.thumbs[0]))
    from PIL import Image

    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    image = np.asarray(Image.open(io.BytesIO(thumb.content)).convert("L"))
    h, w = plate.shape
    assert image.shape[1] == 160 and abs(image.shape[0] - 160 * h / w) < 1  # the plate, fitted in 160²
    assert image.mean() > 20  # the fields are drawn

    assert "i" not in parsed.tags  # MARKUP is text: parsed.wells holds it below
    fields = {p: src.tensor(p).array_id for p in ("A/1/0", "A/1/0/@labels/cells", "A/1/1", f"{MARKUP}/0", "B/3/0")}
    link = f"/t/{TOKEN}/view/{{}}"
    assert parsed.wells == [
        (
            "A/1",
            [
                ("0", link.format(quote(fields["A/1/0"], safe="/"))),
                ("0/@labels/cells", link.format(quote(fields["A/1/0/@labels/cells"], safe="/"))),
                ("1", link.format(quote(fields["A/1/1"], safe="/"))),
            ],
        ),
        (MARKUP, [("0", link.format(quote(fields[f"{MARKUP}/0"], safe="/")))]),
        ("B/3", [("0", link.format(quote(fields["B/3/0"], safe="/")))]),
    ]
    assert parsed.more == []  # 5 links: one page
    with httpx.Client() as client:  # the links carry the token: pasted elsewhere, they work
        for _well, links in parsed.wells:
            for _text, href in links:
                r = client.get(urljoin(http.url, href))
                assert r.status_code == 200, f"{href}: {r.status_code} {r.text[:200]}"


def test_the_wells_list_pages(plate_server, monkeypatch):
    """Two links a page: A/1 (3 links) alone, then MARKUP with B/3; the last page links none."""
    src, http = plate_server
    monkeypatch.setattr(plates, "WELL_LINKS_PER_PAGE", 2)
    plate_id = src.tensor("plate").array_id
    auth = {"Authorization": f"Bearer {TOKEN}"}
    first = _Page(httpx.get(f"{http.url}/", headers=auth).text)
    assert [w for w, _ in first.wells] == ["A/1"]
    assert first.more == [("2 more wells", f"/t/{TOKEN}/wells/{plate_id}?start=1")]  # a header's token: in the path
    second = _Page(httpx.get(urljoin(http.url, first.more[0][1]), headers=auth).text)
    assert [w for w, _ in second.wells] == [MARKUP, "B/3"] and second.more == []
    assert second.wells[1][1] == [("0", f"/t/{TOKEN}/view/{quote(src.tensor('B/3/0').array_id, safe='/')}")]


def test_the_wells_page_refuses_what_is_not_a_plate_page(plate_server):
    src, http = plate_server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    plate_id, field_id = src.tensor("plate").array_id, src.tensor("B/3/0").array_id
    cases = {
        f"/wells/{plate_id}?start=3": (400, "start 3 is not a well"),
        f"/wells/{plate_id}?start=-1": (400, "whole number"),
        f"/wells/{field_id}": (400, "not a plate image"),
        "/wells/nothing/here": (404, "nothing"),
    }
    for path, (status, words) in cases.items():
        r = httpx.get(f"{http.url}{path}", headers=auth)
        assert (r.status_code, words in r.text) == (status, True), f"{path}: {r.status_code} {r.text[:200]}"
    assert httpx.get(f"{http.url}/wells/{plate_id}").status_code == 401


def _fake_plate(n_wells: int, n_fields: int) -> list[SimpleNamespace]:
    """A source's served tensors as ``plates.split_plates`` reads them: the fields of an
    ``n_wells`` plate of ``n_fields`` each, then the plate image with its layout."""
    paths = [f"R{row}/{column}" for row in range(32) for column in range(1, 49)][:n_wells]
    served = [
        SimpleNamespace(
            tensor=SimpleNamespace(ndim=3, array_id=f"s/{p}/{f}", metadata={}), field=f"{p}/{f}", listed_id=f"s/{p}/{f}"
        )
        for p in paths
        for f in range(n_fields)
    ]
    layout = {"wells": [{"path": p, "fields": [{"path": str(f)} for f in range(n_fields)]} for p in paths]}
    plate = SimpleNamespace(
        tensor=SimpleNamespace(ndim=3, array_id="s/plate", metadata={"montage": layout}),
        field="plate",
        listed_id="s/plate",
    )
    return [*served, plate]


def test_a_1536_well_plate_adds_a_bounded_list():
    """1536 wells of 9 fields: one row, the catalog page's list 96 wells (864 links), then 15
    more pages that together list every well once."""
    ((plate, fields),) = plates.split_plates(_fake_plate(1536, 9))
    first = catalog_page.wells_list(plate, plates.wells_page(plate, fields, 0), "")
    parsed = _Page(first)
    assert len(parsed.wells) == 96 and sum(len(links) for _w, links in parsed.wells) == 864
    assert parsed.more == [("1440 more wells", "/wells/s/plate?start=96")]
    assert len(first) < 100_000
    seen, pages, page = [w for w, _ in parsed.wells], 1, parsed
    while page.more:
        start = int(parse_qs(urlsplit(page.more[0][1]).query)["start"][0])
        page = _Page(catalog_page.wells_list(plate, plates.wells_page(plate, fields, start), ""))
        seen += [w for w, _ in page.wells]
        pages += 1
    assert pages == 16 and seen == [w["path"] for w in plate.tensor.metadata["montage"]["wells"]]


def test_the_json_catalog_lists_the_plate_as_one_entry_with_its_wells(plate_server):
    """``/api/catalog``: the plate image is the source's one entry (no entry per field), with
    the first page of its wells: each field's id and its label images' ids."""
    src, http = plate_server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(f"{http.url}/api/catalog", headers=auth).json()
    (source,) = [s for s in doc["sources"] if s["source_id"] == src.source_id]
    (entry,) = source["tensors"]
    plate = src.tensor("plate")
    assert entry["array_id"] == plate.array_id and entry["shape"] == list(plate.shape)
    ids = {p: src.tensor(p).array_id for p in ("A/1/0", "A/1/0/@labels/cells", "A/1/1", f"{MARKUP}/0", "B/3/0")}
    assert entry["wells"] == {
        "count": 3,
        "fields": 4,
        "start": 0,
        "wells": [
            {
                "path": "A/1",
                "fields": [
                    {"path": "0", "array_id": ids["A/1/0"], "labels": [ids["A/1/0/@labels/cells"]]},
                    {"path": "1", "array_id": ids["A/1/1"], "labels": []},
                ],
            },
            {"path": MARKUP, "fields": [{"path": "0", "array_id": ids[f"{MARKUP}/0"], "labels": []}]},
            {"path": "B/3", "fields": [{"path": "0", "array_id": ids["B/3/0"], "labels": []}]},
        ],
        "next": None,
    }


def test_the_json_wells_list_pages(plate_server, monkeypatch):
    """Two entries a page, as the page's list: A/1 alone, then ``next`` (carrying the token in
    the path) lists MARKUP and B/3 and links nothing further; a bad page is refused."""
    src, http = plate_server
    monkeypatch.setattr(plates, "WELL_LINKS_PER_PAGE", 2)
    plate_id, field_id = src.tensor("plate").array_id, src.tensor("B/3/0").array_id
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(f"{http.url}/api/catalog", headers=auth).json()
    (wells,) = [t["wells"] for s in doc["sources"] for t in s["tensors"] if "wells" in t]
    assert [w["path"] for w in wells["wells"]] == ["A/1"]
    assert wells["next"] == f"/t/{TOKEN}/api/wells/{plate_id}?start=1"
    second = httpx.get(urljoin(http.url, wells["next"])).json()
    assert second["array_id"] == plate_id and second["start"] == 1 and second["next"] is None
    assert [w["path"] for w in second["wells"]] == [MARKUP, "B/3"]
    for path, (status, words) in {
        f"/api/wells/{plate_id}?start=3": (400, "start 3 is not a well"),
        f"/api/wells/{field_id}": (400, "not a plate image"),
    }.items():
        r = httpx.get(f"{http.url}{path}", headers=auth)
        assert (r.status_code, words in r.text) == (status, True), f"{path}: {r.status_code} {r.text[:200]}"
    assert httpx.get(f"{http.url}/api/wells/{plate_id}").status_code == 401


def test_a_1536_well_plate_adds_a_bounded_json_entry():
    """1536 wells of 9 fields in ``/api/catalog``: the plate's entry lists the first 96 wells
    (864 fields), then ``next``; following it lists every well once, in 16 pages."""
    ((plate, fields),) = plates.split_plates(_fake_plate(1536, 9))
    first = catalog_page.wells_json(plate, plates.wells_page(plate, fields, 0), "")
    assert (first["count"], first["fields"], len(first["wells"])) == (1536, 13824, 96)
    assert first["wells"][0]["fields"][8] == {"path": "8", "array_id": "s/R0/1/8", "labels": []}
    assert first["next"] == "/api/wells/s/plate?start=96" and len(json.dumps(first)) < 100_000
    seen, pages, page = [w["path"] for w in first["wells"]], 1, first
    while page["next"]:
        start = int(parse_qs(urlsplit(page["next"]).query)["start"][0])
        page = catalog_page.wells_json(plate, plates.wells_page(plate, fields, start), "")
        seen += [w["path"] for w in page["wells"]]
        pages += 1
    assert pages == 16 and seen == [w["path"] for w in plate.tensor.metadata["montage"]["wells"]]
