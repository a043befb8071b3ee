"""A read of a remote sharded zarr array fetches its inner chunks at once: the chunks of one
shard whose byte ranges are adjacent (or within the gap) in one request after the index, the
pixels equal to zarr-python reading the same URL; a shard read whole is zarr's one request."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters import _remote_bytes, _url_shards
from tensor_server.adapters._remote_bytes import _runs
from tensor_server.adapters.url_source import open_url_source
from tensor_server.core.bounds import Bounds
from tests.remote.url_source_test import _zarr_direct

SHARD = "/vol.zarr/c/0/0/0"  # vol.zarr: (6, 200, 180) uint8, inner chunks (2, 50, 60), shards (6, 100, 120)


def _index(folder) -> np.ndarray:
    """Offsets and lengths of shard (0, 0, 0)'s 12 inner chunks, read from the written file
    (the default index: at the end, 16 bytes a chunk and a crc32c)."""
    raw = (folder / "vol.zarr" / "c" / "0" / "0" / "0").read_bytes()
    return np.frombuffer(raw[-(12 * 16 + 4) : -4], "<u8").reshape(12, 2)


def _shard_requests(host) -> list[str]:
    return [r for m, p, r in host.requests if p == SHARD]


def test_runs_merge_adjacent_and_near_ranges_up_to_the_bound(monkeypatch):
    ranges = [(0, 10), (10, 20), (25, 30), (100, 110)]
    assert _runs(ranges, 0) == [[(0, 10), (10, 20)], [(25, 30)], [(100, 110)]]
    assert _runs(ranges, 5) == [[(0, 10), (10, 20), (25, 30)], [(100, 110)]]
    assert _runs(ranges, 70) == [ranges]
    monkeypatch.setattr(_remote_bytes, "MAX_RUN", 25)
    assert _runs(ranges, 70) == [[(0, 10), (10, 20)], [(25, 30)], [(100, 110)]]


def test_the_inner_chunks_of_a_shard_are_one_request_after_the_index(url_host):
    """Six of the shard's twelve inner chunks: the index, then one range from the first of
    them to the end of the last (the shard is ~40 KB, well within the gap), where zarr alone
    asks for each chunk in turn."""
    t = open_url_source(f"{url_host.url}/vol.zarr", "vol").tensor()
    url_host.reset()
    got = t.read_region(Bounds((0, 0, 0), (6, 50, 120)))
    index = _index(url_host.root)
    touched = [np.ravel_multi_index((z, 0, x), (3, 2, 2)) for z in range(3) for x in range(2)]
    first = int(min(index[i, 0] for i in touched))
    last = int(max(index[i, 0] + index[i, 1] for i in touched))
    assert _shard_requests(url_host) == [f"bytes=-{12 * 16 + 4}", f"bytes={first}-{last - 1}"]
    np.testing.assert_array_equal(got, _zarr_direct(f"{url_host.url}/vol.zarr", "")[:, :50, :120])
    np.testing.assert_array_equal(got, url_host.written["sharded"][:, :50, :120])


def test_without_a_gap_only_adjacent_chunks_share_a_request(url_host, monkeypatch):
    """GAP 0: one request per run of chunks whose bytes follow each other in the shard (as
    the index says), each chunk's bytes once."""
    monkeypatch.setattr(_url_shards, "GAP", 0)
    t = open_url_source(f"{url_host.url}/vol.zarr", "vol").tensor()
    url_host.reset()
    got = t.read_region(Bounds((0, 0, 0), (4, 50, 120)))
    index = _index(url_host.root)
    touched = sorted(
        (int(index[i, 0]), int(index[i, 0] + index[i, 1]))
        for i in (np.ravel_multi_index((z, 0, x), (3, 2, 2)) for z in range(2) for x in range(2))
    )
    runs = _runs(touched, 0)
    assert len(runs) == 2 and len(touched) == 4, runs  # zarr's morton order puts them side by side in pairs
    want = [f"bytes={run[0][0]}-{run[-1][1] - 1}" for run in runs]
    assert sorted(_shard_requests(url_host)[1:]) == sorted(want)
    np.testing.assert_array_equal(got, url_host.written["sharded"][:4, :50, :120])


def test_a_shard_read_whole_is_one_request(url_host):
    t = open_url_source(f"{url_host.url}/vol.zarr", "vol").tensor()
    url_host.reset()
    got = t.read_region(Bounds((0, 0, 0), (6, 100, 120)))
    assert _shard_requests(url_host) == [""]  # zarr's own GET of the whole shard: no index, no ranges
    np.testing.assert_array_equal(got, url_host.written["sharded"][:, :100, :120])


@pytest.mark.parametrize("bounds", [((0, 0, 0), (6, 200, 180)), ((1, 30, 50), (5, 170, 130))])
def test_reads_across_shards_equal_zarr_python(url_host, bounds):
    t = open_url_source(f"{url_host.url}/vol.zarr", "vol").tensor()
    got = t.read_region(Bounds(*bounds))
    sl = tuple(slice(a, b) for a, b in zip(*bounds))
    np.testing.assert_array_equal(got, _zarr_direct(f"{url_host.url}/vol.zarr", "")[sl])
