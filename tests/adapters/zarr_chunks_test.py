"""The server's own zarr chunk reader (adapters/_zarr_chunks.py): every read it serves equals
zarr-python's own read of the same selection (aligned, ragged, off-origin and strided, every
codec and layout it takes on), what it does not take on goes through zarr, a corrupt chunk is
a clear error, and a shard's index is read once per shard file until the file changes."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tensor_server_kernels import reference

import tensor_server
from tensor_server.adapters._zarr_chunks import LocalChunks, ShardIndexes
from tensor_server.core.bounds import Bounds
from tensor_server.errors import UnreadableSource

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec  # noqa: E402

RNG = np.random.default_rng(25)
#: (bounds, step) in a 70 x 50 array with 32 x 25 chunks: one whole chunk, ragged edges,
#: off-origin extents crossing chunk edges, strides smaller and larger than a chunk
READS = [
    (((0, 0), (32, 25)), (1, 1)),
    (((32, 25), (64, 50)), (1, 1)),
    (((64, 25), (70, 50)), (1, 1)),
    (((5, 3), (69, 47)), (1, 1)),
    (((0, 0), (70, 50)), (1, 1)),
    (((1, 2), (70, 50)), (3, 4)),
    (((7, 0), (66, 49)), (40, 30)),
    (((0, 0), (70, 50)), (16, 16)),
    (((33, 26), (34, 27)), (1, 1)),
]


def _check(path, data):
    with tensor_server.open(path) as src:
        t = src.tensor()
        assert t._chunks is not None, "the server's reader should take this array on"
        for (start, stop), step in READS:
            b = Bounds(start, stop)
            want = data[b.to_slices()][tuple(slice(None, None, s) for s in step)]
            got = t.get_decimated_data(b, step) if step != (1, 1) else t.get_data(b)
            np.testing.assert_array_equal(got, want, err_msg=f"{b} {step}")
            assert got.dtype == want.dtype.newbyteorder("=")
            into = np.empty(b.shape, t.dtype)
            t.read_region_into(b, into)
            np.testing.assert_array_equal(into, data[b.to_slices()])


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<f4", "int8"])
@pytest.mark.parametrize(
    "compressor", [numcodecs.Blosc("zstd", 3, numcodecs.Blosc.SHUFFLE), numcodecs.Zlib(1), numcodecs.Zstd(1), None]
)
@pytest.mark.parametrize("order", ["C", "F"])
def test_v2_reads_equal_zarr(tmp_path, dtype, compressor, order):
    data = (RNG.random((70, 50)) * 100).astype(dtype)
    z = zarr.open_array(
        str(tmp_path / "a.zarr"),
        mode="w",
        shape=data.shape,
        chunks=(32, 25),
        dtype=dtype,
        zarr_format=2,
        compressor=compressor,
        order=order,
    )
    z[...] = data
    _check(tmp_path / "a.zarr", np.asarray(z[...]))


@pytest.mark.parametrize(
    "serializer,compressors",
    [
        (BytesCodec(), [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")]),
        (BytesCodec(endian="big"), [ZstdCodec(level=1)]),
        (BytesCodec(), [GzipCodec(level=1), Crc32cCodec()]),
        (BytesCodec(), None),
    ],
)
def test_v3_reads_equal_zarr(tmp_path, serializer, compressors):
    data = RNG.integers(0, 60000, (70, 50), dtype=np.uint16)
    z = zarr.create_array(
        str(tmp_path / "a.zarr"),
        shape=data.shape,
        chunks=(32, 25),
        dtype="u2",
        zarr_format=3,
        serializer=serializer,
        compressors=compressors,
    )
    z[...] = data
    _check(tmp_path / "a.zarr", data)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("index_codecs", [[BytesCodec(), Crc32cCodec()], [BytesCodec()]])
def test_sharded_reads_equal_zarr(tmp_path, location, index_codecs):
    data = RNG.integers(0, 60000, (70, 50), dtype=np.uint16)
    codec = ShardingCodec(
        chunk_shape=(32, 25),
        codecs=[BytesCodec(), BloscCodec(cname="lz4")],
        index_codecs=index_codecs,
        index_location=location,
    )
    z = zarr.create_array(
        str(tmp_path / "a.zarr"),
        shape=data.shape,
        chunks=(64, 50),
        dtype="u2",
        zarr_format=3,
        serializer=codec,
        compressors=None,
        fill_value=3,
    )
    z[...] = data
    z[32:64, 25:50] = 3  # an inner chunk equal to the fill value: an empty index slot
    data[32:64, 25:50] = 3
    _check(tmp_path / "a.zarr", data)


def test_absent_chunks_and_shards_read_as_zarr_fills_them(tmp_path):
    data = RNG.integers(0, 100, (70, 50), dtype=np.uint16)
    z = zarr.open_array(
        str(tmp_path / "v2.zarr"),
        mode="w",
        shape=data.shape,
        chunks=(32, 25),
        dtype="u2",
        zarr_format=2,
        compressor=numcodecs.Zlib(1),
        fill_value=7,
    )
    z[...] = data
    os.remove(tmp_path / "v2.zarr" / "1.1")
    data2 = data.copy()
    data2[32:64, 25:50] = 7
    _check(tmp_path / "v2.zarr", data2)
    z = zarr.create_array(
        str(tmp_path / "s.zarr"),
        shape=data.shape,
        chunks=(32, 25),
        shards=(64, 50),
        dtype="u2",
        zarr_format=3,
        fill_value=9,
    )
    z[...] = data
    os.remove(tmp_path / "s.zarr" / "c" / "1" / "0")  # rows 64:70
    data3 = data.copy()
    data3[64:] = 9
    _check(tmp_path / "s.zarr", data3)


def test_what_the_reader_does_not_take_on_goes_through_zarr(tmp_path):
    from zarr.codecs import TransposeCodec

    data = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    cases = {
        "filters.zarr": dict(zarr_format=2, compressors=numcodecs.Zlib(1), filters=[numcodecs.Delta("<u2")]),
        "transpose.zarr": dict(zarr_format=3, filters=[TransposeCodec(order=(1, 0))]),
    }
    for name, kw in cases.items():
        z = zarr.create_array(str(tmp_path / name), shape=data.shape, chunks=(32, 32), dtype="u2", **kw)
        z[...] = data
        with tensor_server.open(tmp_path / name) as src:
            t = src.tensor()
            assert t._chunks is None and not t.decimates and not t.reads_into
            np.testing.assert_array_equal(t.get_data(Bounds((3, 5), (60, 61))), data[3:60, 5:61])
            np.testing.assert_array_equal(t.get_scaled_data(None, (4, 4), "nearest"), data[::4, ::4])


@pytest.mark.parametrize("sharded", [False, True])
def test_corrupt_or_truncated_chunk_is_a_clear_error(tmp_path, sharded):
    data = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    kw = {"shards": (64, 64)} if sharded else {}
    z = zarr.create_array(str(tmp_path / "c.zarr"), shape=data.shape, chunks=(32, 32), dtype="u2", zarr_format=3, **kw)
    z[...] = data
    f = tmp_path / "c.zarr" / "c" / "0" / ("0" if sharded else "1")
    raw = bytearray(f.read_bytes())
    raw[0:8] = b"garbage!"  # the frame header of the (first inner) chunk
    f.write_bytes(bytes(raw))
    with tensor_server.open(tmp_path / "c.zarr") as src:
        t = src.tensor()
        with pytest.raises(UnreadableSource, match=r"c\.zarr.*chunk 'c/0/"):
            t.get_data(Bounds((0, 32), (32, 64)) if not sharded else Bounds((0, 0), (32, 32)))
        f.write_bytes(bytes(raw[:7]))
        with pytest.raises(UnreadableSource, match=r"c\.zarr"):
            t.get_decimated_data(Bounds((0, 0), (64, 64)), (2, 2))


def test_a_shard_index_is_read_once_per_shard_until_the_file_changes(tmp_path, monkeypatch):
    data = RNG.integers(0, 60000, (128, 128), dtype=np.uint16)
    z = zarr.create_array(
        str(tmp_path / "s.zarr"), shape=data.shape, chunks=(16, 16), shards=(64, 64), dtype="u2", zarr_format=3
    )
    z[...] = data
    reads = []
    real = os.pread

    def counting(fd, n, offset):
        reads.append(n)
        return real(fd, n, offset)

    with tensor_server.open(tmp_path / "s.zarr") as src:
        t = src.tensor()
        monkeypatch.setattr(os, "pread", counting)
        index_bytes = 16 * 16 + 4
        want = reference.downsample(data, (4, 4), "area")
        for _ in range(3):
            np.testing.assert_array_equal(t.get_scaled_data(None, (4, 4), "area"), want)
        assert reads.count(index_bytes) == 4  # four shards, each index read once over three reads
        np.testing.assert_array_equal(t.get_data(), data)
        z[:64, :64] = data[:64, :64][::-1]  # rewrite one shard file
        reads.clear()
        np.testing.assert_array_equal(t.get_data(Bounds((0, 0), (64, 64))), data[:64, :64][::-1])
        assert reads.count(index_bytes) == 1


def test_a_run_of_a_shard_s_chunks_is_one_read_in_file_order(tmp_path, monkeypatch):
    """zarr-python stores inner chunks in Morton order: a row of 16 of a 16 x 16 shard spans
    86 chunks of the file. Runs are taken in file order, so each run is one ``pread``."""
    data = RNG.integers(0, 60000, (256, 256), dtype=np.uint16)
    z = zarr.create_array(
        str(tmp_path / "m.zarr"), shape=data.shape, chunks=(16, 16), shards=(256, 256), dtype="u2", zarr_format=3
    )
    z[...] = data
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # runs of 16 chunks on any machine
    with tensor_server.open(tmp_path / "m.zarr") as src:
        lc = src.tensor()._chunks
        whole = Bounds((0, 0), data.shape)
        lc.read(whole, (1, 1), None, parallel=False)  # the index, read once
        jobs = lc._shard_jobs(list(lc._pieces(whole, (1, 1))))
        reads = []
        real = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, n, offset: reads.append(n) or real(fd, n, offset))
        np.testing.assert_array_equal(lc.read(whole, (1, 1), None, parallel=False), data)
    assert len(reads) == len(jobs) < 256, (len(reads), len(jobs))


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(
    not hasattr(os, "posix_fadvise") or not os.path.isdir("/proc/self/fd"),
    reason="posix_fadvise and /proc/self/fd are Linux's",
)
def test_chunk_files_are_advised_ahead_and_every_descriptor_closed(tmp_path, monkeypatch):
    """A read's first ``_AHEAD_FILES`` stored chunk files are opened and advised WILLNEED
    before any is decoded (an absent chunk is skipped); each is read through that descriptor,
    and none is left open, also when a chunk turns out corrupt."""
    from tensor_server.adapters import _zarr_chunks

    data = RNG.integers(0, 60000, (64, 96), dtype=np.uint16)
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(16, 16), dtype="u2", zarr_format=3)
    z[...] = data
    (tmp_path / "a.zarr" / "c" / "0" / "1").unlink()  # one absent chunk: zarr fills it
    data[0:16, 16:32] = 0
    monkeypatch.setattr(_zarr_chunks, "_AHEAD_FILES", 10)
    advised, opened = [], []
    real_advise, real_open = os.posix_fadvise, os.open
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, o, n, a: advised.append((fd, a)) or real_advise(fd, o, n, a))
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    with tensor_server.open(tmp_path / "a.zarr") as src:
        lc = src.tensor()._chunks
        before = _open_fds()

        def zeros(s):
            return np.zeros(tuple(len(range(x.start, x.stop, x.step)) for x in s), np.uint16)

        np.testing.assert_array_equal(lc.read(Bounds((0, 0), data.shape), (1, 1), zeros), data)
        assert _open_fds() == before
        assert len(advised) == 9 and {a for _, a in advised} == {os.POSIX_FADV_WILLNEED}  # 10 pieces, 1 absent
        chunk_opens = [p for p in opened if "/c/" in p]
        assert len(chunk_opens) == len(set(chunk_opens)) == 4 * 6  # each chunk file looked up once
        f = tmp_path / "a.zarr" / "c" / "0" / "2"
        f.write_bytes(b"garbage!" + f.read_bytes()[8:])
        with pytest.raises(ValueError, match="chunk 'c/0/2'"):
            lc.read(Bounds((0, 0), data.shape), (1, 1), zeros)
        assert _open_fds() == before


def test_sharding_with_unsupported_inner_codecs_keeps_zarr(tmp_path):
    from zarr.codecs import TransposeCodec

    data = RNG.integers(0, 60000, (64, 64), dtype=np.uint16)
    codec = ShardingCodec(chunk_shape=(32, 32), codecs=[TransposeCodec(order=(1, 0)), BytesCodec()])
    z = zarr.create_array(
        str(tmp_path / "s.zarr"),
        shape=data.shape,
        chunks=(64, 64),
        dtype="u2",
        zarr_format=3,
        serializer=codec,
        compressors=None,
    )
    z[...] = data
    assert LocalChunks.of(z, tmp_path / "s.zarr", ShardIndexes(z, tmp_path / "s.zarr")) is None
    with tensor_server.open(tmp_path / "s.zarr") as src:
        np.testing.assert_array_equal(src.tensor().get_data(), data)


@pytest.mark.parametrize("method", ["area", "nearest"])
def test_peak_memory_is_output_plus_workers_plus_one_units(tmp_path, method):
    """tracemalloc: a scaled read of a 4096² plane (sixteen 1024² chunks, each a unit: a reader
    that reads into a buffer is streamed by its block) through the server's reader allocates
    at most the output plus (workers + 1) units above baseline, area (units read into reused
    buffers) and nearest (each chunk strided into the output as decoded); reading the plane
    whole (what the bound forbids) exceeds it."""
    import tracemalloc

    from tensor_server.core.downsample import downsample_block, warm_up
    from tensor_server.core.engine import ReadEngine

    data = RNG.integers(0, 60000, (4096, 4096), dtype=np.uint16)
    z = zarr.open_array(
        str(tmp_path / "p.zarr"),
        mode="w",
        shape=data.shape,
        chunks=(1024, 1024),
        dtype="u2",
        zarr_format=2,
        compressor=numcodecs.Blosc("lz4", 1),
    )
    z[...] = data
    workers, scale = 2, (4, 4)
    engine = ReadEngine(workers=workers)
    with tensor_server.open(tmp_path / "p.zarr") as src:
        t = src.tensor()
        b = Bounds.full(t.shape)
        assert t.chunk_shape == (2048, 2048) and t.read_block_shape == (1024, 1024)
        warm_up()
        want = engine.read(t, b, scale, method)  # compiles, and fills the reused buffers
        np.testing.assert_array_equal(want, reference.downsample(data, scale, method))
        out_bytes, unit_bytes = want.nbytes, 1024 * 1024 * 2
        bound = out_bytes + (workers + 1) * unit_bytes + (64 << 10)
        tracemalloc.start()
        try:
            # tracemalloc counts every thread of the process: under the parallel suite a thread
            # another test left finishing (a server's precache, a pool helper) can allocate during
            # one read, so the least of three is the read's own peak (a read over the bound is over
            # it every time)
            peaks = []
            for _ in range(3):
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                got = engine.read(t, b, scale, method)
                peaks.append(tracemalloc.get_traced_memory()[1] - base)
                np.testing.assert_array_equal(got, want)
                del got
            peak = min(peaks)
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            downsample_block(t.get_data(b), scale, method)
            whole = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    assert peak <= bound, f"peak {(peak - out_bytes) / unit_bytes:.2f} units above the output"
    assert whole > bound
