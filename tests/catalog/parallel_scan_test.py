"""Discovery opens files on a bounded pool: a slow or hostile file holds one worker and
never delays the others, which are listed while it is still opening."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tensor_server.adapters import registry
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.catalog import Catalog

WAIT = 60.0  # a synchronisation bound (a hung test fails), never a measured time


@pytest.fixture
def slow_format():
    """Files ``*.slow`` whose opener blocks until the test releases it."""
    started, release = threading.Event(), threading.Event()

    def opener(path):
        started.set()
        release.wait(WAIT)
        raise ValueError("the slow file was given up by the test")

    entry = register_format(FormatEntry(name="zz-slow", opener=opener, extensions=(".slow",), priority=1))
    yield started, release
    release.set()
    registry._formats.pop(entry.name)


def _wait_for(condition) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT * 20)):
        if condition():
            return True
        done.wait(0.05)
    return False


def test_a_slow_file_does_not_delay_the_others(tmp_path, slow_format):
    started, release = slow_format
    (tmp_path / "a.slow").write_bytes(b"x")  # discovered first (names are walked in order)
    for i in range(10):
        np.save(tmp_path / f"b{i}.npy", np.full((2, 2), i))
    cat = Catalog([tmp_path], open_workers=3, open_timeout_seconds=WAIT)
    scan = threading.Thread(target=cat.scan)
    scan.start()
    try:
        assert started.wait(WAIT)
        assert _wait_for(lambda: len(cat) == 10)  # every other file listed while the slow one is open
        progress = cat.discovery_progress()
        assert not release.is_set() and progress["scan_in_progress"] is True
        assert (progress["files_seen"], progress["files_opened"], progress["files_failed"]) == (11, 10, 0)
        assert progress["last_full_scan_finished_at"] is None
        np.testing.assert_array_equal(cat.find_tensor(cat.records()[3].source_id)[0].get_data(), np.full((2, 2), 3))
    finally:
        release.set()
        scan.join(WAIT)
    progress = cat.discovery_progress()
    assert progress["scan_in_progress"] is False and progress["files_failed"] == 1
    assert progress["last_full_scan_finished_at"] is not None and cat.opens == 11
    slow = next(r for r in cat.records() if r.path.name == "a.slow")
    assert not slow.is_resolved and "given up by the test" in slow.unresolved_reason
    cat.close()


def test_a_file_past_the_deadline_is_an_unreadable_row(tmp_path, slow_format):
    (tmp_path / "a.slow").write_bytes(b"x")
    np.save(tmp_path / "b.npy", np.zeros(3))
    cat = Catalog([tmp_path], open_workers=2, open_timeout_seconds=0.2)
    summary = cat.scan()
    assert (summary["total"], summary["unresolved"]) == (2, 1)
    slow = next(r for r in cat.records() if r.path.name == "a.slow")
    assert "gave up opening after 0.2 s" in slow.unresolved_reason
    cat.close()


def _mixed_tree(root):
    """Files of four formats, one broken, one no format claims; returns {name: array}."""
    import h5py
    import tifffile

    root.mkdir()
    arrays = {}
    for i in range(3):
        arrays[f"a{i}.npy"] = np.arange(12, dtype=np.int16).reshape(3, 4) + i
        np.save(root / f"a{i}.npy", arrays[f"a{i}.npy"])
    arrays["b.tif"] = np.arange(30, dtype=np.uint8).reshape(5, 6)
    tifffile.imwrite(root / "b.tif", arrays["b.tif"])
    arrays["c.h5"] = np.linspace(0, 1, 20, dtype=np.float32).reshape(4, 5)
    with h5py.File(root / "c.h5", "w") as f:
        f["data"] = arrays["c.h5"]
    (root / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    (root / "notes.txt").write_text("not a source")
    return arrays


def test_a_big_scan_opens_on_worker_processes_and_lists_the_same_rows(tmp_path, monkeypatch):
    from tensor_server.catalog import _opening

    arrays = _mixed_tree(tmp_path / "data")
    on_threads = Catalog([tmp_path / "data"], open_processes=0)
    on_threads.scan()
    expected = on_threads.sources_table().to_pylist()
    on_threads.close()

    monkeypatch.setattr(_opening, "PROCESSES_AFTER", 0)  # every open on a worker process
    unclaimed = []
    cat = Catalog([tmp_path / "data"], open_workers=2, open_processes=2, store_path=str(tmp_path / "c.duckdb"))
    summary = cat.scan(on_unclaimed=unclaimed.append)
    assert (summary["total"], summary["unresolved"]) == (len(arrays) + 1, 1)
    assert [p.name for p in unclaimed] == ["notes.txt"]
    progress = cat.discovery_progress()
    assert (progress["files_seen"], progress["files_opened"], progress["files_failed"]) == (
        len(arrays) + 1,
        len(arrays),
        1,
    )
    assert progress["pending_open"] == len(arrays) and cat.opens == len(arrays) + 1
    assert cat.sources_table().to_pylist() == expected  # listed from the workers' rows
    broken = next(r for r in cat.records() if r.path.name == "broken.npy")
    assert not broken.is_resolved and "npy" in broken.unresolved_reason
    for rec in cat.records():
        if rec.is_resolved:  # opened here on first use, read bit-identical
            np.testing.assert_array_equal(cat.find_tensor(rec.source_id)[0].get_data(), arrays[rec.path.name])
    assert cat.opens == 2 * len(arrays) + 1
    cat.close()


def test_a_plugin_format_keeps_every_open_on_threads(tmp_path, monkeypatch, slow_format):
    from tensor_server.catalog import _opening

    started, release = slow_format
    release.set()
    (tmp_path / "a.slow").write_bytes(b"x")
    np.save(tmp_path / "b.npy", np.zeros(3))
    monkeypatch.setattr(_opening, "PROCESSES_AFTER", 0)
    cat = Catalog([tmp_path], open_workers=2, open_processes=2)
    summary = cat.scan()  # a worker process would not know zz-slow: "unknown format"
    assert (summary["total"], summary["unresolved"]) == (2, 1)
    slow = next(r for r in cat.records() if r.path.name == "a.slow")
    assert "given up by the test" in slow.unresolved_reason
    plain = next(r for r in cat.records() if r.path.name == "b.npy")
    assert plain.opened() is not None and not plain.is_open_pending()  # opened here, on a thread
    cat.close()


class _CrashingPool:
    """Stands in for the worker processes: runs a task here, except that opening a file named
    ``crash*`` breaks the pool, as a reader that kills its process does."""

    def __init__(self, started: list) -> None:
        started.append(self)

    def submit(self, fn, path, *args):
        import concurrent.futures as cf
        from concurrent.futures.process import BrokenProcessPool

        fut = cf.Future()
        if path.rsplit("/", 1)[-1].startswith("crash"):
            fut.set_exception(BrokenProcessPool("a worker died"))
        else:
            fut.set_result(fn(path, *args))
        return fut

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_a_reader_that_kills_its_worker_costs_only_its_own_file(tmp_path, monkeypatch):
    from tensor_server.catalog import _opening

    for i in range(4):
        np.save(tmp_path / f"a{i}.npy", np.full((2, 3), i, np.int32))
    np.save(tmp_path / "crash.npy", np.zeros(2))
    started: list = []
    monkeypatch.setattr(_opening, "PROCESSES_AFTER", 0)
    monkeypatch.setattr(_opening.Opening, "_start_processes", lambda self: _CrashingPool(started))
    cat = Catalog([tmp_path], open_workers=2, open_processes=2)
    summary = cat.scan()
    assert (summary["total"], summary["unresolved"]) == (5, 1)
    assert len(started) == 3  # the first pool, a fresh one for the retries, another after the crash again
    crashed = next(r for r in cat.records() if r.path.name == "crash.npy")
    assert crashed.unresolved_reason == "the reader crashed the process opening this file"
    for rec in cat.records():
        if rec.path.name != "crash.npy":
            np.testing.assert_array_equal(
                cat.find_tensor(rec.source_id)[0].get_data(), np.full((2, 3), int(rec.path.stem[1]), np.int32)
            )
    cat.close()


def test_a_worker_process_builds_montages_with_the_catalogs_gap(tmp_path, monkeypatch):
    """The montage gap reaches the opens on worker processes: a 4-scene CZI listed from a
    worker's row under ``montage_gap=0`` has the gapless layout, as its open here has."""
    pyczi = pytest.importorskip("pylibCZIrw.czi")
    from tensor_server.catalog import _opening

    (tmp_path / "data").mkdir()
    with pyczi.create_czi(str(tmp_path / "data" / "scenes.czi"), exist_ok=True) as w:
        for s in range(4):
            w.write(np.full((8, 12), s + 1, np.uint8), plane={"T": 0, "C": 0, "Z": 0}, scene=s, location=(100 * s, 0))
    monkeypatch.setattr(_opening, "PROCESSES_AFTER", 0)  # every open on a worker process
    cat = Catalog([tmp_path / "data"], open_workers=2, open_processes=2, montage_gap=0)
    try:
        cat.scan()
        (rec,) = cat.records()
        listed = {row["array_id"]: row["shape"] for row in rec.tensor_rows()}  # the worker's row, not opened here
        assert cat.opens == 1 and listed[f"{rec.source_id}/positions"][-2:] == [16, 24]  # 2 x 2 cells, no gap
        montage = cat.find_tensor(f"{rec.source_id}/positions")[0]
        layout = montage.metadata["montage"]
        assert layout["gap"] == [0, 0] and [p["box"] for p in layout["positions"]][3] == [[8, 12], [16, 24]]
        np.testing.assert_array_equal(
            montage.get_data()[0, 0, 0], np.block([[1, 2], [3, 4]]).repeat(8, 0).repeat(12, 1)
        )
    finally:
        cat.close()
