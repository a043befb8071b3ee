"""The segment sidecar index (tensor_server/cache/segment_index.py): entries round-trip, and
neither writing nor reading one imports pandas (pyarrow's ``pa.array``/``to_numpy`` do, 1.2-2 s
on this machine, which landed on the read whose put sealed a server's first segment)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tensor_server.cache.segment_index import index_path, read_index, write_index
from tensor_server.cache.segment_store import SegmentEntry


@pytest.mark.parametrize("count", [0, 1, 5])
def test_entries_round_trip(tmp_path, count):
    segment = tmp_path / "seg_0000.arrow"
    segment.write_bytes(b"\0" * 1000)
    entries = [SegmentEntry(b"key-%d" % i * (i + 1), 100 * i, 90 + i, 4096 * i) for i in range(count)]
    write_index(segment, entries, 1000)
    assert read_index(segment) == entries
    segment.write_bytes(b"\0" * 999)  # the segment no longer has the size the index names
    assert read_index(segment) is None
    assert index_path(segment).exists()


_SEAL_AND_REOPEN = """
import json, sys
import numpy as np
from tensor_server.cache import CacheManager
cache = CacheManager(sys.argv[1])
for i in range(3):
    cache.put(b"k%d" % i, np.full((64, 64), i, np.uint16))
cache.close()
cache = CacheManager(sys.argv[1])
value = int(cache.get(b"k2")[0, 0])
cache.close()
print(json.dumps([value, "pandas" in sys.modules]))
"""


def test_sealing_and_reopening_a_cache_does_not_import_pandas(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _SEAL_AND_REOPEN, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [2, False]
    assert list(tmp_path.rglob("*.idx")), "the cache wrote no sidecar index: the check saw nothing"
