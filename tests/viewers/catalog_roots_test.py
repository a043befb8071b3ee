"""The catalog starts at the served roots, never at the filesystem's root, on the page ``/``
and ``/api/catalog`` (``catalog_children`` over Flight: tests/flight/sdk_actions_test.py and
the Tensor Browser's data layer in tests/flight/sdk_tensor_browser_test.py): a single root's
sources sit at the top; several roots are named by their last path component, a repeat
numbered; each root's full path is in the folder's ``path`` and the link's tooltip, escaped;
the breadcrumb never walks a root's parents on disk."""

from __future__ import annotations

import html
import re

import httpx
import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tests.http.conftest import http_serving

TOKEN = "roots-token"
PLANE = np.arange(20 * 30, dtype=np.uint8).reshape(20, 30)
#: a parent folder whose name is markup: the tooltip must show it as text
ODD = 'b&"<i>'


def _get(http, path):
    r = httpx.get(f"{http.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _crumbs(page):
    """The breadcrumb's (text, title) pairs."""
    return [
        (html.unescape(text), html.unescape(title) if title else None)
        for title, text in re.findall(r'<a class="crumb" href="[^"]*"(?: title="([^"]*)")?>([^<]*)</a>', page)
    ]


def _folder_titles(page):
    """Each folder link's (text, title)."""
    return [
        (html.unescape(text), html.unescape(title))
        for title, text in re.findall(r'<a class="folder" href="[^"]*" title="([^"]*)">([^<]*)</a>', page)
    ]


@pytest.fixture
def one_root(tmp_path):
    import tifffile

    root = tmp_path / "deep" / "er" / "demo"
    (root / "sub").mkdir(parents=True)
    tifffile.imwrite(root / "top.tif", PLANE)
    tifffile.imwrite(root / "sub" / "inner.tif", PLANE)
    cat = Catalog([root])
    cat.scan()
    with http_serving(cat, tmp_path, token=TOKEN) as (_, http):
        yield root, http
    cat.close()


def test_a_single_roots_sources_are_at_the_top(one_root):
    root, http = one_root
    top = _get(http, "/api/catalog").json()
    assert top["path"] == str(root)
    assert [s["name"] for s in top["sources"]] == ["top.tif"] and top["sources"][0]["tensors"][0]["shape"] == [20, 30]
    assert top["folders"] == [{"name": "sub", "key": "sub", "path": str(root / "sub")}]
    page = _get(http, "/").text
    assert '<h2 class="source">top.tif' in page
    assert _crumbs(page) == [("catalog", str(root))]  # the root's path as the top's tooltip
    assert _folder_titles(page) == [("sub/", str(root / "sub"))]
    inner = _get(http, "/?folder=sub").text
    assert '<h2 class="source">inner.tif' in inner
    assert _crumbs(inner) == [("catalog", str(root)), ("sub", str(root / "sub"))]  # never deep / er / demo
    assert "deep" not in [f["name"] for f in top["folders"]]


@pytest.fixture
def two_data_roots(tmp_path):
    import tifffile

    first, second = tmp_path / "a" / "data", tmp_path / ODD / "data"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    tifffile.imwrite(first / "one.tif", PLANE)
    tifffile.imwrite(second / "two.tif", PLANE)
    (second / "more").mkdir()
    tifffile.imwrite(second / "more" / "three.tif", PLANE)
    cat = Catalog([first, second])
    cat.scan()
    with http_serving(cat, tmp_path, token=TOKEN) as (_, http):
        yield first, second, http
    cat.close()


def test_two_roots_of_one_name_are_two_folders_with_their_paths(two_data_roots):
    first, second, http = two_data_roots
    top = _get(http, "/api/catalog").json()
    assert top["path"] is None and top["sources"] == []
    assert top["folders"] == [
        {"name": "data", "key": "data", "path": str(first)},
        {"name": "data (2)", "key": "data (2)", "path": str(second)},
    ]
    page = _get(http, "/").text
    assert _folder_titles(page) == [("data/", str(first)), ("data (2)/", str(second))]
    assert f'title="{html.escape(str(second))}"' in page and ODD not in page  # the path is text, escaped
    level = _get(http, "/api/catalog?folder=data%20(2)").json()
    assert level["path"] == str(second) and [s["name"] for s in level["sources"]] == ["two.tif"]
    assert level["folders"] == [{"name": "more", "key": "data (2)/more", "path": str(second / "more")}]
    more = _get(http, "/?folder=data%20(2)/more").text
    assert '<h2 class="source">three.tif' in more
    assert _crumbs(more) == [("catalog", None), ("data (2)", str(second)), ("more", str(second / "more"))]
    assert [s["name"] for s in _get(http, "/api/catalog?folder=data").json()["sources"]] == ["one.tif"]
