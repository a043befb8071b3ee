from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.catalog import Catalog, discover
from tensor_server.catalog.catalog import CatalogQueryError, SourceUnresolved
from tensor_server.errors import TensorNotFound


def test_discovery_claims_files_and_skips_unknown_and_hidden(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "b.npy", np.zeros(3))
    (tmp_path / "readme.txt").write_text("hi")
    (tmp_path / ".hidden").mkdir()
    np.save(tmp_path / ".hidden" / "c.npy", np.zeros(3))
    claims = sorted(c.path.name for c in discover(tmp_path))
    assert claims == ["a.npy", "b.npy"]


def test_folder_formats_are_claimed_whole(tmp_path):
    ds = tmp_path / "dataset.fake"
    ds.mkdir()
    np.save(ds / "inner.npy", np.zeros(3))
    entry = register_format(
        FormatEntry(
            name="zz-fake-folder",
            opener=lambda p: None,
            sniff=lambda p, h: p.name.endswith(".fake"),
            folders=True,
            files=False,
            priority=5,
        )
    )
    try:
        claims = list(discover(tmp_path))
        assert [(c.path.name, c.format.name) for c in claims] == [("dataset.fake", "zz-fake-folder")]
    finally:
        from tensor_server.adapters import registry

        registry._formats.pop(entry.name)


def test_scan_resolves_rows_and_keeps_unreadable_ones(tmp_path):
    np.save(tmp_path / "good.npy", np.arange(12).reshape(3, 4))
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    cat = Catalog([tmp_path])
    summary = cat.scan()
    assert summary["total"] == 2 and summary["unresolved"] == 1
    rows = {r["source_url"].rsplit("/", 1)[1]: r for r in cat.sources_table().to_pylist()}
    assert rows["good.npy"]["is_resolved"] and rows["good.npy"]["tensors"][0]["shape"] == [3, 4]
    assert rows["bad.npy"]["is_resolved"] is False
    assert rows["bad.npy"]["tensors"] == [] and "npy" in rows["bad.npy"]["unresolved_reason"]
    with pytest.raises(SourceUnresolved):
        cat.find_tensor(rows["bad.npy"]["source_id"])
    with pytest.raises(TensorNotFound):
        cat.find_tensor("missing-source")
    cat.close()


def test_an_unreadable_file_is_read_once_it_is_fixed_without_a_rescan(tmp_path):
    """A writer caught mid-file (ome-writers' overwrite, before its OME-XML) leaves a source
    unreadable; the next request after the file changed opens it again, and an unchanged
    unreadable file is not opened again."""
    bad = tmp_path / "live.npy"
    bad.write_bytes(b"\x93NUMPY garbage")
    cat = Catalog([tmp_path])
    cat.scan()
    (source_id,) = [r.source_id for r in cat.records()]
    opened = []
    real_open = cat.open_record
    cat.open_record = lambda *a, **k: opened.append(a[0]) or real_open(*a, **k)  # type: ignore[method-assign]
    with pytest.raises(SourceUnresolved):
        cat.find_tensor(source_id)
    assert opened == []  # unchanged: not opened again
    np.save(bad, np.arange(12, dtype=np.uint16).reshape(3, 4))
    tensor, _ = cat.find_tensor(source_id)
    assert tensor.shape == (3, 4) and opened == [bad]
    assert cat.find_tensor(source_id)[0] is tensor and opened == [bad]
    cat.close()


def test_rescan_adds_and_removes(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    cat = Catalog([tmp_path])
    cat.scan()
    ids_before = {r.source_id for r in cat.records()}
    np.save(tmp_path / "b.npy", np.zeros(3))
    (tmp_path / "a.npy").unlink()
    s = cat.scan()
    assert s["added"] == 1 and s["removed"] == 1
    ids_after = {r.source_id for r in cat.records()}
    assert len(ids_after) == 1 and ids_after.isdisjoint(ids_before)
    cat.close()


def test_source_ids_are_stable_across_catalogs(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    a, b = Catalog([tmp_path]), Catalog([tmp_path])
    a.scan()
    b.scan()
    assert [r.source_id for r in a.records()] == [r.source_id for r in b.records()]
    assert "/" not in a.records()[0].source_id


def test_query_is_read_only(tmp_path):
    cat = Catalog([tmp_path])
    cat.scan()
    assert cat.query("SELECT count(*) AS n FROM sources").to_pylist() == [{"n": 0}]
    for sql in ["DELETE FROM sources", "ATTACH 'x.db'", "SELECT 1; SELECT 2", "PRAGMA version", "not sql at all"]:
        with pytest.raises(CatalogQueryError):
            cat.query(sql)


def test_member_paths_suppress_duplicate_sources(tmp_path):
    """A multi-file dataset opened from one member covers the others."""
    from tensor_server.adapters.memory import ArrayAdapter
    from tensor_server.core.adapter_base import SourceAdapter

    for i in range(3):
        (tmp_path / f"part{i}.multi").write_bytes(b"MULTI")

    def opener(path):
        src = SourceAdapter(path, {"data": ArrayAdapter(np.zeros((2, 2)))}, source_type="zz-multi")
        src.member_paths |= {p.resolve() for p in path.parent.glob("*.multi")}
        return src

    entry = register_format(FormatEntry(name="zz-multi", opener=opener, sniff=lambda p, h: h.startswith(b"MULTI")))
    try:
        cat = Catalog([tmp_path])
        cat.scan()
        assert [r.path.name for r in cat.records()] == ["part0.multi"]
        cat.scan()  # a rescan keeps it that way
        assert len(cat.records()) == 1
    finally:
        from tensor_server.adapters import registry

        registry._formats.pop(entry.name)


def test_an_id_that_looks_like_a_path_gets_a_hint(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    cat = Catalog([tmp_path])
    cat.scan()
    for wrong in (str(tmp_path / "a.npy"), "image.nd2", "image.nd2/field"):
        with pytest.raises(TensorNotFound, match="looks like a path or file name, but ids are the source ids"):
            cat.find_tensor(wrong)
    with pytest.raises(TensorNotFound) as info:
        cat.find_tensor("nosuch-1a2b3c4d")
    assert str(info.value) == "unknown source 'nosuch-1a2b3c4d'"  # an id-shaped miss: no hint
    cat.close()
