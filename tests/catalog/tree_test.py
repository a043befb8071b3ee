"""The catalog tree's placing rule (``catalog/tree.py``) on the cases the doors' tests do not
reach: nested roots, a root that is itself a source, a root reached through a link, paths
under no root, and a top folder name two claimants want."""

from __future__ import annotations

from pathlib import Path

from tensor_server.catalog.tree import CatalogTree, root_names, root_top_names


def _top(tree):
    level = tree.children("")
    return [(f["name"], f["path"]) for f in level["folders"]], [s["name"] for s in level["sources"]]


def test_roots_are_named_by_their_last_component_a_repeat_numbered():
    assert root_names(["/x/data", "/y/data", "/z/data/", "/w/other"]) == [
        ("data", "/x/data"),
        ("data (2)", "/y/data"),
        ("data (3)", "/z/data"),
        ("other", "/w/other"),
    ]


def test_a_source_belongs_to_the_deepest_root_that_holds_it():
    rows = [("o", "file:///r/o.tif", True), ("i", "file:///r/in/i.tif", True)]
    tree = CatalogTree(rows, ["/r", "/r/in"])
    assert _top(tree) == ([("in", "/r/in"), ("r", "/r")], [])
    assert [s["source_id"] for s in tree.children("in")["sources"]] == ["i"]
    assert [s["source_id"] for s in tree.children("r")["sources"]] == ["o"]


def test_a_root_that_is_one_source_is_listed_by_its_name():
    tree = CatalogTree([("z", "file:///x/plate.zarr", True)], ["/x/plate.zarr"])
    assert _top(tree) == ([], ["plate.zarr"])


def test_a_root_reached_through_a_link_places_its_resolved_urls(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    rows = [("s", (real / "sub" / "s.tif").as_uri(), True), ("t", (real / "t.tif").as_uri(), True)]
    tree = CatalogTree(rows, [tmp_path / "link"])
    assert _top(tree) == ([("sub", str(tmp_path / "link" / "sub"))], ["t.tif"])
    assert tree.children("")["path"] == str(tmp_path / "link")  # the root as the user spelled it


def test_sources_under_no_root_keep_their_place_and_never_share_a_roots_folder():
    rows = [
        ("r", "file:///srv/data/p/r.tif", True),
        ("d", "dnd://p/d.tif", True),  # an added path whose label is a folder of the root
        ("f", "file:///tmp/x/f.tif", True),
        ("mem", "", True),
        ("hidden", "file:///srv/data/p/h.tif", False),
    ]
    tree = CatalogTree(rows, ["/srv/data"])
    assert _top(tree) == ([("p", "/srv/data/p"), ("p (2)", None), ("tmp/x", "/tmp/x")], ["mem"])
    assert [s["source_id"] for s in tree.children("p")["sources"]] == ["r"]
    assert [s["source_id"] for s in tree.children("p (2)")["sources"]] == ["d"]


def test_an_added_paths_label_avoids_the_roots_top_folders(tmp_path):
    (tmp_path / "one" / "p").mkdir(parents=True)
    assert root_top_names([tmp_path / "one"]) == {"p"}
    assert root_top_names([tmp_path / "one", Path("/elsewhere/one")]) == {"one", "one (2)"}
    assert root_top_names([tmp_path / "gone"]) == set()
