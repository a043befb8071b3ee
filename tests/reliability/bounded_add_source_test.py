"""Issue 23 findings 3 and 4, issue 24's allow-list: what add_source may add and walk.

Driven through ``DroppedPaths.add_events`` (the generator a door streams)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.catalog.dropped import AddLimits, AddProgress, AddTally, DroppedPaths
from tensor_server.errors import PermissionDenied, ReadCancelled


def _tiff(path, value=1):
    import tifffile

    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, np.full((8, 8), value, np.uint8), photometric="minisblack")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def served(tmp_path, home):
    root = home / "data" / "root"
    _tiff(root / "a.tif")
    _tiff(root / "b.tif")
    cat = Catalog([root])
    cat.scan()
    yield cat, root
    cat.close()


@pytest.mark.parametrize("path", ["/", "/proc", "/proc/self/root", "/sys/kernel", "/dev", "/etc"])
def test_system_paths_are_refused_naming_the_rule(served, path):
    cat, _ = served
    with pytest.raises(PermissionDenied, match="the whole filesystem|holds no data"):
        DroppedPaths(cat, allowed_paths=["/"]).add(path)


def test_a_path_outside_the_allowed_folders_is_refused(served, tmp_path):
    cat, _ = served
    _tiff(tmp_path / "elsewhere" / "x.tif")
    with pytest.raises(PermissionDenied, match="not under an allowed folder"):
        DroppedPaths(cat).add(str(tmp_path / "elsewhere"))
    assert len(cat) == 2


def test_a_link_in_home_to_a_refused_place_is_refused(served, home, tmp_path):
    cat, _ = served
    _tiff(tmp_path / "elsewhere" / "x.tif")
    (home / "sneaky").symlink_to(tmp_path / "elsewhere")
    (home / "etc").symlink_to("/etc")
    with pytest.raises(PermissionDenied, match="not under an allowed folder"):
        DroppedPaths(cat).add(str(home / "sneaky"))
    with pytest.raises(PermissionDenied, match="under /etc"):
        DroppedPaths(cat, allowed_paths=["/"]).add(str(home / "etc"))


def test_the_write_dir_and_the_cache_are_refused(served, home):
    cat, _ = served
    write_dir, cache = home / "write", home / "cache"
    _tiff(write_dir / "fields" / "x.tif")
    _tiff(cache / "y.tif")
    cat.excluded.append(write_dir)
    drops = DroppedPaths(cat, refused_paths=[cache])
    for p in (write_dir / "fields", cache):
        with pytest.raises(PermissionDenied, match="server's own storage"):
            drops.add(str(p))


def test_a_link_out_of_the_added_path_is_not_followed(served, home, tmp_path):
    cat, _ = served
    drop = home / "exp"
    _tiff(drop / "in.tif")
    _tiff(tmp_path / "outside" / "secret.tif")
    (drop / "link.tif").symlink_to(tmp_path / "outside" / "secret.tif")
    (drop / "linkdir").symlink_to(tmp_path / "outside")
    tally = DroppedPaths(cat).add(str(drop))
    paths = sorted(str(r.path) for r in cat.records() if r.url.startswith("dnd://"))
    assert paths == [str(drop / "in.tif")]
    assert len(tally.added) == 1


def test_progress_is_yielded_while_the_walk_goes_on_and_cancel_stops_it(served, home):
    cat, _ = served
    drop = home / "many"
    for i in range(30):
        _tiff(drop / f"f{i:02d}.tif", i)
    stop = {"now": False}
    events = DroppedPaths(cat).add_events(str(drop), cancelled=lambda: stop["now"])
    first = next(events)
    assert isinstance(first, AddProgress) and first.added_count == 1  # before the walk ended
    stop["now"] = True
    with pytest.raises(ReadCancelled, match="client went away"):
        list(events)
    assert sum(r.url.startswith("dnd://") for r in cat.records()) < 30


def test_the_walk_stops_at_its_entry_budget_and_says_so(served, home):
    cat, _ = served
    drop = home / "big"
    for i in range(40):
        (drop / f"d{i:02d}").mkdir(parents=True)
    _tiff(drop / "zz.tif")
    tally = DroppedPaths(cat, limits=AddLimits(max_entries=10)).add(str(drop))
    assert isinstance(tally, AddTally)
    assert any("looked at 10 entries" in why for _, why in tally.failed)
    assert tally.added == []


def test_a_parent_of_a_served_root_cannot_take_the_roots_sources_away(served, home):
    cat, root = served
    before = sorted((r.source_id, r.url) for r in cat.records())
    drops = DroppedPaths(cat)
    tally = drops.add(str(root.parent))  # home/data holds the served root
    assert sorted(tally.already_present) == sorted(sid for sid, _ in before)
    assert sorted((r.source_id, r.url) for r in cat.records()) == before  # never relabelled dnd://
    drops.remove("dnd://data")
    assert sorted((r.source_id, r.url) for r in cat.records()) == before


def test_an_allowed_path_still_adds_and_removes(served, home):
    cat, _ = served
    _tiff(home / "exp" / "x.tif")
    drops = DroppedPaths(cat)
    tally = drops.add(str(home / "exp"))
    assert len(tally.added) == 1 and not tally.failed
    assert drops.remove("dnd://exp") == tally.added
