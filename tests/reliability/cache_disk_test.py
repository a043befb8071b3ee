"""A full cache disk degrades to uncached serving, at run time and at boot, and the budget
holds the folder to its size (issue 12, critical 3 and the 1 MB budget finding).

Two levels: a real server on a 1 MiB tmpfs mounted over its cache folder in a private mount
namespace (skipped where that cannot be made), and the same failure injected in process as
an ``ENOSPC`` from the segment file's write call, which always runs.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import signal
import sys
import textwrap

import numpy as np
import pytest

import tensor_server.cache.manager as manager_module
import tensor_server.cache.segment_store as segment_store
from tensor_server.cache import CacheManager
from tensor_server.cache.segment_index import index_path, read_index
from tests.reliability.cache_shutdown_test import array_id_of, read_all
from tests.reliability.server_process import TMPFS_WRAPPER, can_mount_tmpfs, serve_process


def chunk(i: int, n: int = 64) -> np.ndarray:
    return np.full((n, n), i, np.uint16)


def folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# ---- the budget counts the open segment -------------------------------------------------------
def test_a_1mb_budget_holds_the_folder_to_1mb(tmp_path):
    budget = 1_000_000
    with CacheManager(tmp_path, max_total_bytes=budget, memory_bytes=0) as c:
        for i in range(200):  # 200 chunks of 128 KiB: 26 MB offered
            c.put(b"k%d" % i, chunk(i, 256))
            assert folder_bytes(tmp_path) <= budget + 16384, f"after {i + 1} chunks"
        assert c.cache_stats()["total_bytes"] <= budget
        assert c.get(b"k199")[0, 0] == 199, "the newest chunks are kept"
        assert c.stats["evictions"] > 0


# ---- injected ENOSPC (file writes and segment_store's gathered writes) ---------------------------
class _FullDisk(io.FileIO):
    """A segment file on a disk with ``room`` bytes left: writes past it are short, then ENOSPC;
    after the ENOSPC, ``freed`` bytes become free again (as the cut-off tail is released)."""

    room = 0
    freed = 0

    def write(self, data):
        if _FullDisk.room <= 0:
            _FullDisk.room, _FullDisk.freed = _FullDisk.freed, 0
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(memoryview(data)), _FullDisk.room)
        _FullDisk.room -= n
        return super().write(memoryview(data).cast("B")[:n])


class _FullDiskOs:
    """``os`` for segment_store, whose gathered writes (``os.writev``) meet the same full disk
    as ``_FullDisk.write``: short past ``room``, then ENOSPC."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def writev(fd, views):
        if _FullDisk.room <= 0:
            _FullDisk.room, _FullDisk.freed = _FullDisk.freed, 0
            raise OSError(errno.ENOSPC, "No space left on device")
        cut, left = [], _FullDisk.room
        for v in views:
            v = memoryview(v).cast("B")[:left]
            cut.append(v)
            left -= len(v)
            if not left:
                break
        n = os.writev(fd, cut)
        _FullDisk.room -= n
        return n


@pytest.fixture()
def full_disk(monkeypatch):
    """Segment files opened from now on get ``room`` bytes (set by the test)."""
    monkeypatch.setattr(
        segment_store,
        "open",
        lambda path, mode="r", **k: _FullDisk(path, mode.replace("b", "")) if "x" in mode else open(path, mode, **k),
        raising=False,
    )
    monkeypatch.setattr(segment_store, "os", _FullDiskOs())
    monkeypatch.setattr(manager_module, "WRITE_RETRY_SECONDS", 0.0)
    return _FullDisk


def test_running_out_of_disk_mid_batch_serves_uncached_and_keeps_what_was_written(tmp_path, full_disk):
    full_disk.room = 20_000  # the schema, two 8 KiB batches, then a batch cut short
    with CacheManager(tmp_path, memory_bytes=0) as c:
        for i in range(6):
            out = c.get_or_compute(b"k%d" % i, lambda i=i: chunk(i))
            assert out[5, 5] == i, "every read succeeds"
        assert c.stats["write_errors"] >= 1
        assert [c.get(b"k%d" % i)[0, 0] for i in range(2)] == [0, 1], "whole batches stay readable"
        full_disk.room = 10**9  # space again: writing resumes
        c.put(b"later", chunk(9))
        assert c.get(b"later")[0, 0] == 9
    with CacheManager(tmp_path) as c:  # the cut segment is whole up to its last complete batch
        assert c.get(b"k0")[0, 0] == 0 and c.get(b"k1")[0, 0] == 1 and c.get(b"later")[0, 0] == 9
        assert c.get(b"k2") is None, "the batch cut short was never indexed"


def test_a_segment_cut_by_enospc_is_sealed_right_after_its_last_whole_batch(tmp_path, full_disk):
    full_disk.room, full_disk.freed = 20_000, 64  # the cut tail frees room for the seal's marker
    with CacheManager(tmp_path, memory_bytes=0) as c:
        for i in range(4):
            assert c.get_or_compute(b"k%d" % i, lambda i=i: chunk(i))[1, 1] == i
        assert c.stats["write_errors"] >= 1
    assert [p.name for p in tmp_path.glob("seg_*.arrow")] == ["seg_0000.arrow"], "no empty segment left behind"
    seg = tmp_path / "seg_0000.arrow"
    entries = read_index(seg)
    assert [e.key for e in entries] == [b"k0", b"k1"], "sealed with a sidecar despite the full disk"
    raw = seg.read_bytes()
    last = entries[-1].byte_offset + entries[-1].byte_length
    assert len(raw) == last + 8 and raw[last:] == b"\xff\xff\xff\xff\x00\x00\x00\x00", "no hole, no torn tail"
    with CacheManager(tmp_path) as c:
        assert c.stats["recovered_segments"] == 0 and c.get(b"k1")[0, 0] == 1


def test_boot_on_a_disk_that_refuses_writes(tmp_path, monkeypatch):
    with CacheManager(tmp_path, segment_bytes=1 << 20) as c:
        for i in range(3):
            c.put(b"k%d" % i, chunk(i))
    seg = next(tmp_path.glob("seg_*.arrow"))
    index_path(seg).unlink()  # as after a crash: boot must re-walk and would write a sidecar

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manager_module, "write_index", refuse)
    monkeypatch.setattr(
        segment_store,
        "open",
        lambda path, mode="r", **k: refuse() if "x" in mode else open(path, mode, **k),
        raising=False,
    )
    with CacheManager(tmp_path) as c:
        assert [c.get(b"k%d" % i)[0, 0] for i in range(3)] == [0, 1, 2]
        assert c.get_or_compute(b"new", lambda: chunk(7))[0, 0] == 7, "a miss is served uncached"
        assert c.stats["write_errors"] == 1


# ---- a real server on a full tmpfs ---------------------------------------------------------------
@pytest.fixture()
def tmpfs_ok(tmp_path):
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root); ENOSPC is injected above")


@pytest.fixture()
def root(tmp_path):
    folder = tmp_path / "root"
    folder.mkdir()
    arr = np.random.default_rng(3).integers(0, 2**32, (2048, 1536), dtype=np.uint32)  # 12 MiB
    np.save(folder / "img.npy", arr)
    return folder, arr


def test_a_server_whose_cache_disk_fills_up_keeps_serving(tmp_path, root, tmpfs_ok, monkeypatch):
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")  # the mount is private to the server
    folder, truth = root
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    with serve_process([folder], cache_dir, wrapper=TMPFS_WRAPPER + [str(cache_dir), "1m", "true"]) as server:
        for _ in range(2):
            got, stats = read_all(server, array_id_of(folder))
            np.testing.assert_array_equal(got, truth)
        assert stats["write_errors"] >= 1, "the 1 MiB disk did fill up"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.stderr[-3000:]


def test_a_server_boots_and_serves_on_a_full_cache_disk(tmp_path, root, tmpfs_ok, monkeypatch):
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    folder, truth = root
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    # inside the namespace, before the server: a crashed writer leaves an unsealed segment (its
    # sidecar must be written at boot), then something else fills the disk
    crash = tmp_path / "crash.py"
    crash.write_text(
        textwrap.dedent(f"""
        import os, numpy as np
        from tensor_server.cache import CacheManager
        c = CacheManager({str(cache_dir)!r})
        for i in range(4):
            c.put(b"k%d" % i, np.full((64, 64), i, np.uint16))
        os._exit(9)
    """)
    )
    setup = f"{shlex.quote(sys.executable)} {shlex.quote(str(crash))}; dd if=/dev/zero of={shlex.quote(str(cache_dir))}/filler bs=4k 2>/dev/null; true"
    with serve_process([folder], cache_dir, wrapper=TMPFS_WRAPPER + [str(cache_dir), "1m", setup]) as server:
        got, stats = read_all(server, array_id_of(folder))
        np.testing.assert_array_equal(got, truth)
        assert stats["total_entries"] == 4, "the crashed segment was recovered (its sidecar unwritable)"
        assert stats["write_errors"] >= 1
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.stderr[-3000:]


def test_a_server_whose_cache_folder_cannot_be_made_serves_uncached(tmp_path, root):
    folder, truth = root
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_bytes(b"a file where the cache folder should be")
    with serve_process([folder], not_a_folder) as server:
        assert "chunk cache disabled" in server.stderr
        got, stats = read_all(server, array_id_of(folder))
        np.testing.assert_array_equal(got, truth)
        assert stats == {}, "no cache: cache_stats answers nothing"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0


def test_boot_ignores_what_is_not_a_segment_and_never_blocks(tmp_path):
    """Names that look like segments or sidecars but are a directory, a FIFO, a 1 TiB sparse
    file or a symlink: boot finishes promptly, serves the real segment, counts only it. Run in
    a child with a deadline, because the failure is a boot that blocks (a FIFO) or eats memory."""
    import os
    import subprocess

    with CacheManager(tmp_path) as c:
        c.put(b"real", chunk(5))
    real = next(tmp_path.glob("seg_*.arrow"))
    (tmp_path / "seg_0100.arrow").mkdir()
    os.mkfifo(tmp_path / "seg_0101.arrow")
    with open(tmp_path / "seg_0102.arrow", "wb") as fh:  # sparse, no sidecar: would be walked
        fh.truncate(1 << 40)
    os.symlink("/etc/passwd", tmp_path / "seg_0103.arrow")
    real_idx = index_path(real)
    real_idx.unlink()
    os.mkfifo(real_idx)  # a FIFO where the real segment's sidecar should be
    script = textwrap.dedent(f"""
        import json
        from tensor_server.cache import CacheManager
        with CacheManager({str(tmp_path)!r}) as c:
            s = c.cache_stats()
            print(json.dumps([int(c.get(b"real")[0, 0]), s["total_entries"], s["pool_stats"]["file"]["segments"],
                              s["total_bytes"]]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    value, entries, segments, total = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (value, entries, segments) == (5, 1, 1)
    assert total == real.stat().st_size
    assert not (tmp_path / "seg_0102.arrow").exists(), "a segment-named file with nothing whole in it is removed"
    assert (tmp_path / "seg_0100.arrow").is_dir() and (tmp_path / "seg_0103.arrow").is_symlink(), (
        "the others are left alone"
    )
