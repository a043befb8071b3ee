"""The chunk cache: tiers, budget, crash safety, recovery, concurrency (cache-sourced scaled
reads are the engine's: tests/core/engine_cache_test.py)."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tensor_server.cache import CacheLocked, CacheManager
from tensor_server.cache.segment_index import index_path

CHUNK = 64 * 64 * 2  # bytes of a (64, 64) uint16 chunk


def chunk(i: int) -> np.ndarray:
    return np.full((64, 64), i, np.uint16)


def test_hit_miss_and_read_only_entries(tmp_path):
    with CacheManager(tmp_path) as c:
        calls = []
        a = c.get_or_compute(b"k", lambda: calls.append(1) or chunk(7))
        b = c.get_or_compute(b"k", lambda: calls.append(1) or chunk(8))
        assert calls == [1] and a[0, 0] == b[0, 0] == 7 and not b.flags.writeable
        assert c.stats["misses"] == 1 and c.stats["hits"] == 1
        assert c.get(b"absent") is None


def test_file_tier_hits_after_memory_is_dropped(tmp_path):
    with CacheManager(tmp_path, memory_bytes=0) as c:
        for i in range(5):
            c.put(b"k%d" % i, chunk(i))
        for i in range(5):
            assert c.get(b"k%d" % i)[3, 3] == i
        assert c.stats["file_hits"] == 5 and c.stats["memory_hits"] == 0


def test_budget_evicts_whole_lru_segments(tmp_path):
    seg = 4 * CHUNK
    budget = 10 * CHUNK
    with CacheManager(tmp_path, max_total_bytes=budget, segment_bytes=seg, memory_bytes=0) as c:
        for i in range(40):
            c.put(b"k%d" % i, chunk(i))
            c.get(b"k0")  # keep the first segment recently used
            assert c.file_bytes <= budget + seg + 4096, "never more than one segment over budget"
        assert c.stats["evictions"] > 0
        assert c.get(b"k0") is not None, "recently used segment survived"
        assert c.get(b"k5") is None, "an old, unused segment was evicted"
        files = sorted(p.name for p in tmp_path.glob("seg_*.arrow"))
        assert len(files) == len(c._segments)


def test_oversized_chunk_is_skipped(tmp_path):
    with CacheManager(tmp_path, max_total_bytes=CHUNK // 2) as c:
        out = c.get_or_compute(b"big", lambda: chunk(1))
        assert out[0, 0] == 1 and c.stats["oversized_skips"] == 1 and len(c) == 0


def test_reboot_trusts_sidecars_and_recovers_without_them(tmp_path):
    with CacheManager(tmp_path, segment_bytes=3 * CHUNK) as c:
        for i in range(10):
            c.put(b"k%d" % i, chunk(i))
    segs = sorted(tmp_path.glob("seg_*.arrow"))
    assert all(index_path(s).exists() for s in segs)
    index_path(segs[0]).unlink()  # missing sidecar
    index_path(segs[1]).write_bytes(b"garbage")  # unreadable sidecar
    with CacheManager(tmp_path) as c:
        assert c.stats["recovered_segments"] == 2
        assert [int(c.get(b"k%d" % i)[0, 0]) for i in range(10)] == list(range(10))


def test_stale_sidecar_size_mismatch_is_rewalked(tmp_path):
    with CacheManager(tmp_path, segment_bytes=100 * CHUNK) as c:
        for i in range(4):
            c.put(b"k%d" % i, chunk(i))
    seg = next(tmp_path.glob("seg_*.arrow"))
    with open(seg, "ab") as fh:  # the file no longer has the size the sidecar recorded
        fh.write(b"\x00" * 16)
    with CacheManager(tmp_path) as c:
        assert c.stats["recovered_segments"] == 1 and len(c) == 4


def test_crash_mid_segment_keeps_sealed_entries_and_drops_the_tail(tmp_path):
    script = textwrap.dedent(f"""
        import os, numpy as np
        from tensor_server.cache import CacheManager
        c = CacheManager({str(tmp_path)!r}, segment_bytes={4 * CHUNK})
        for i in range(10):   # two sealed segments of 4, then 2 entries in an open one
            c.put(b"k%d" % i, np.full((64, 64), i, np.uint16))
        w = c._writer
        w._fh.write(b"\\xff\\xff\\xff\\xff\\x10\\x00\\x00\\x00partial")  # a torn batch
        w._fh.flush()
        os._exit(9)   # killed: no seal, no close
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with CacheManager(tmp_path) as c:
        for i in range(8):
            assert c.get(b"k%d" % i)[0, 0] == i, "sealed entries survive"
        # the open segment's complete batches are salvaged, the torn tail is not
        assert c.get(b"k8")[0, 0] == 8 and c.get(b"k9")[0, 0] == 9
        assert c.stats["recovered_segments"] == 1
        c.put(b"new", chunk(42))  # writes go to a new segment, never into the recovered one
        assert c.get(b"new")[0, 0] == 42


def test_one_server_per_folder(tmp_path):
    with CacheManager(tmp_path):
        with pytest.raises(CacheLocked, match="another tensor-server"):
            CacheManager(tmp_path)
    CacheManager(tmp_path).close()  # released on close


def test_concurrent_readers_and_a_writer(tmp_path):
    with CacheManager(tmp_path, segment_bytes=8 * CHUNK, memory_bytes=CHUNK * 4) as c:
        for i in range(50):
            c.put(b"k%d" % i, chunk(i))

        def reader(seed):
            rng = np.random.default_rng(seed)
            for _ in range(300):
                i = int(rng.integers(0, 50))
                v = c.get(b"k%d" % i)
                assert v is not None and v[10, 10] == i

        def writer():
            for i in range(50, 150):
                c.put(b"k%d" % i, chunk(i))

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(reader, s) for s in range(4)] + [pool.submit(writer)]
            for f in futures:
                f.result()
        assert all(c.get(b"k%d" % i)[0, 0] == i for i in range(150))


def test_concurrent_misses_compute_once(tmp_path):
    import threading

    gate = threading.Event()
    calls = []

    def slow():
        calls.append(1)
        gate.wait(5)
        return chunk(3)

    with CacheManager(tmp_path) as c:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(c.get_or_compute, b"k", slow) for _ in range(4)]
            import time

            time.sleep(0.2)
            gate.set()
            assert all(f.result()[0, 0] == 3 for f in futures)
        assert calls == [1] and c.stats["pending_waits"] >= 1


def test_boot_with_ten_thousand_entries(tmp_path):
    with CacheManager(tmp_path, segment_bytes=1 << 20) as c:
        small = np.zeros(16, np.uint8)
        for i in range(10_000):
            c.put(b"key-%05d" % i, small)
    with CacheManager(tmp_path) as c:
        assert len(c) == 10_000 and c.stats["recovered_segments"] == 0
        assert c.get(b"key-09999") is not None
        # boot time is measured by the benchmark (not asserted here)


def test_a_segments_fsync_holds_no_other_reader_or_writer(tmp_path, monkeypatch):
    """A full segment's fsync (23 ms for 64 MiB here) runs outside the cache's lock: while it
    is stuck, other threads read and write the cache; once done, the segment is sealed with
    its index, and everything reads back after a restart."""
    import threading

    from tensor_server.cache import segment_store

    entered, release = threading.Event(), threading.Event()
    real_fsync = segment_store.os.fsync

    def stuck_fsync(fd: int) -> None:
        entered.set()
        assert release.wait(30), "the test never let the fsync go"
        real_fsync(fd)

    with CacheManager(tmp_path, segment_bytes=3 * CHUNK, memory_bytes=0) as c:
        c.put(b"k0", chunk(0))
        c.put(b"k1", chunk(1))
        monkeypatch.setattr(segment_store.os, "fsync", stuck_fsync)
        sealer = threading.Thread(target=c.put, args=(b"k2", chunk(2)))  # no room left: seals the first
        sealer.start()
        assert entered.wait(30)
        others = threading.Thread(target=lambda: (c.put(b"k3", chunk(3)), c.get(b"k0"), c.locate(b"k1")))
        others.start()
        others.join(30)
        went_on = not others.is_alive()  # with the fsync under the lock, it waited for it
        monkeypatch.setattr(segment_store.os, "fsync", real_fsync)
        release.set()
        sealer.join(30)
        others.join(30)
        assert went_on and int(c.get(b"k0")[0, 0]) == 0 and int(c.get(b"k3")[0, 0]) == 3
        first = c._segments[min(c._segments)]
        assert first.sealed and index_path(first.path).exists()
    with CacheManager(tmp_path) as c:
        assert [int(c.get(b"k%d" % i)[0, 0]) for i in range(4)] == [0, 1, 2, 3]
        assert c.stats["recovered_segments"] == 0


@pytest.mark.parametrize("size", [1, 64 << 10, (64 << 10) + 1, 512 << 10, (1 << 20) + 3])
def test_a_message_digest_is_xxh3_however_it_is_taken(size):
    import pyarrow as pa
    import xxhash

    from tensor_server.cache.manager import _message_digest

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert _message_digest(pa.py_buffer(data)) == xxhash.xxh3_64_intdigest(data)


def test_an_offered_message_is_digested_without_giving_the_interpreter_lock_up():
    """The fast path re-hashes an offered chunk's message on every offer; xxhash gives the
    lock up for a large input, and the handler then queued behind every other one to take it
    back. With a long switch interval, a thread waiting for the lock runs only if it is given
    up: its counter does not move while a 512 KiB message is digested."""
    import sys
    import threading
    import time

    import pyarrow as pa

    from tensor_server.cache.manager import _message_digest

    message = pa.py_buffer(np.random.default_rng(0).integers(0, 256, 512 << 10, dtype=np.uint8).tobytes())
    counter, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(2.0)
    spinner = threading.Thread(target=spin, daemon=True)
    try:
        spinner.start()
        time.sleep(0.01)  # the spinner runs; this thread then holds the lock a full interval
        before = counter[0]
        _message_digest(message)
        assert counter[0] == before, "the digest gave the interpreter lock up"
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join()
