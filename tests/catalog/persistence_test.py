"""The catalog kept across restarts (catalog/store.py): a restart lists every row at once
and reopens no unchanged source; a rescan of an unchanged tree only stats."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.catalog.catalog import SourceUnresolved


def _tree(root, n=12):
    root.mkdir()
    for i in range(n):
        np.save(root / f"img{i:02d}.npy", np.full((3, 4 + i), i, np.uint16))
    (root / "sub").mkdir()
    np.save(root / "sub" / "deep.npy", np.arange(6, dtype=np.float32))
    (root / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    return n + 2  # readable ones, plus the broken one


def _rows(cat):
    return sorted(cat.sources_table().to_pylist(), key=lambda r: r["source_id"])


def test_restart_lists_every_row_with_zero_reopens(tmp_path):
    readable = _tree(tmp_path / "data") - 1
    store = str(tmp_path / "home" / "catalog.duckdb")
    first = Catalog([tmp_path / "data"], store_path=store)
    first.scan()
    assert first.opens == readable + 1 and len(first) == readable + 1
    before = _rows(first)
    first.close()

    again = Catalog([tmp_path / "data"], store_path=store)
    assert again.restored == readable + 1 and again.opens == 0
    assert _rows(again) == before  # listed, metadata and reasons included, before any scan
    summary = again.scan()
    assert (summary["added"], summary["changed"], summary["removed"]) == (0, 0, 0)
    progress = again.discovery_progress()
    assert again.opens == 0 and progress["files_unchanged"] == readable + 1 and progress["files_opened"] == 0
    assert progress["restored"] == readable + 1 and progress["pending_open"] == readable
    assert _rows(again) == before
    count = again.query("SELECT count(*) AS n FROM sources WHERE is_resolved").column("n").to_pylist()
    assert count == [readable]

    img3 = next(r for r in before if r["source_url"].endswith("/img03.npy"))
    tensor, _ = again.find_tensor(img3["source_id"])  # first use opens that one source only
    assert again.opens == 1 and again.discovery_progress()["pending_open"] == readable - 1
    np.testing.assert_array_equal(tensor.get_data(), np.full((3, 7), 3, np.uint16))
    broken = next(r for r in before if r["source_url"].endswith("/broken.npy"))
    with pytest.raises(SourceUnresolved, match="npy"):
        again.find_tensor(broken["source_id"])
    assert again.opens == 1  # an unreadable row is not retried until its file changes
    again.close()


def test_a_rescan_of_an_unchanged_tree_only_stats(tmp_path, monkeypatch):
    _tree(tmp_path / "data")
    cat = Catalog([tmp_path / "data"])
    cat.scan()
    opens = cat.opens
    import tensor_server.catalog.discovery as discovery

    sniffed = []
    real = discovery.claim_format
    monkeypatch.setattr(discovery, "claim_format", lambda p, *a: sniffed.append(p.name) or real(p, *a))
    summary = cat.scan()
    assert summary["changed"] == summary["added"] == 0 and cat.opens == opens
    assert sniffed == ["data", "sub"]  # the folders that are no source are looked at again; no file is read


def test_a_file_changed_while_stopped_is_reopened_once(tmp_path):
    _tree(tmp_path / "data")
    store = str(tmp_path / "catalog.duckdb")
    cat = Catalog([tmp_path / "data"], store_path=store)
    cat.scan()
    cat.close()
    target = tmp_path / "data" / "img01.npy"
    np.save(target, np.zeros((9, 9), np.uint8))
    os.utime(target, ns=(1, 1))  # a different mtime even on a coarse clock

    cat = Catalog([tmp_path / "data"], store_path=store)
    sid = next(r.source_id for r in cat.records() if r.path.name == "img01.npy")
    assert cat.sources_table([cat.get_record(sid)]).to_pylist()[0]["tensors"][0]["shape"] == [
        3,
        5,
    ]  # the row, as stored
    summary = cat.scan()
    assert summary["changed"] == 1 and cat.opens == 1
    assert cat.find_tensor(sid)[0].shape == (9, 9)
    cat.close()
    cat = Catalog([tmp_path / "data"], store_path=store)  # the new row was written back
    assert cat.sources_table([cat.get_record(sid)]).to_pylist()[0]["tensors"][0]["shape"] == [9, 9]
    cat.close()


def test_vanished_files_and_removed_roots_leave_the_store(tmp_path):
    total = _tree(tmp_path / "data")
    _tree(tmp_path / "other", n=2)
    store = str(tmp_path / "catalog.duckdb")
    cat = Catalog([tmp_path / "data", tmp_path / "other"], store_path=store)
    cat.scan()
    assert len(cat) == total + 4
    cat.close()
    (tmp_path / "data" / "img00.npy").unlink()

    cat = Catalog([tmp_path / "data"], store_path=store)  # "other" left the config
    assert cat.restored == total
    assert cat.scan()["removed"] == 1 and cat.opens == 0
    cat.close()
    cat = Catalog([tmp_path / "data"], store_path=store)
    assert cat.restored == total - 1 == len(cat)
    cat.close()


def test_a_restored_row_whose_file_broke_fails_on_first_use(tmp_path):
    _tree(tmp_path / "data", n=2)
    store = str(tmp_path / "catalog.duckdb")
    cat = Catalog([tmp_path / "data"], store_path=store)
    cat.scan()
    cat.close()
    target = tmp_path / "data" / "img00.npy"
    st = target.stat()
    target.write_bytes(b"\x93NUMPY" + b"\0" * (st.st_size - 6))  # same size, same mtime: looks unchanged
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))

    cat = Catalog([tmp_path / "data"], store_path=store)
    sid = next(r.source_id for r in cat.records() if r.path.name == "img00.npy")
    assert cat.get_record(sid).is_resolved  # as stored, until opened
    with pytest.raises(SourceUnresolved, match="npy"):
        cat.find_tensor(sid)
    row = cat.sources_table([cat.get_record(sid)]).to_pylist()[0]
    assert row["is_resolved"] is False and row["tensors"] == []
    cat.close()
    cat = Catalog([tmp_path / "data"], store_path=store)
    assert cat.get_record(sid).is_resolved is False  # the failure was written back
    cat.close()


def test_an_unusable_store_keeps_the_catalog_in_memory(tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING)  # a command-line test earlier in this worker may have set the root to ERROR
    _tree(tmp_path / "data", n=1)
    bad = tmp_path / "catalog.duckdb"
    bad.write_bytes(b"not a duckdb file" * 100)
    cat = Catalog([tmp_path / "data"], store_path=str(bad))
    assert "kept in memory only" in caplog.text
    assert cat.scan()["total"] == 3 and cat.restored == 0
    cat.close()
