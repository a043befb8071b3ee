"""Chunk cache: a hit, a miss+store, boot of 10 000 entries, and a cache-sourced scaled read."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.core import Bounds, plan_read
from tensor_server.core.downsample import warm_up
from tensor_server.core.engine import ReadEngine


class CacheHit:
    def setup(self):
        self.dir = tempfile.mkdtemp()
        self.cache = CacheManager(self.dir, memory_bytes=0)
        self.arr = np.zeros((2048, 2048), np.uint16)  # one 8 MiB transfer chunk
        self.cache.put(b"k", self.arr)

    def teardown(self):
        self.cache.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_file_tier_hit(self):
        self.cache.get(b"k")

    def time_put_8mib(self):
        self.cache.put(np.random.bytes(16), self.arr)


class CacheBoot:
    timeout = 300

    def setup(self):
        self.dir = tempfile.mkdtemp()
        with CacheManager(self.dir, segment_bytes=1 << 20) as c:
            small = np.zeros(64, np.uint8)
            for i in range(10_000):
                c.put(b"key-%05d" % i, small)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_boot_10k_entries(self):
        CacheManager(self.dir).close()


class CacheSourcedScaledRead:
    params = (["nearest", "area"],)
    param_names = ["method"]
    timeout = 300

    def setup(self, method):
        warm_up()
        self.dir = tempfile.mkdtemp()
        arr = np.random.default_rng(0).integers(0, 4000, (4096, 4096), dtype=np.uint16)
        self.t = ArrayAdapter(arr, chunk_shape=(1024, 1024))
        MemorySource(self.t, source_id="bench")
        self.cache = CacheManager(self.dir)
        self.cached, self.source = ReadEngine(self.cache), ReadEngine()
        for pc in plan_read(self.t).chunks:
            self.cached.chunk(pc.chunk_id, self.t)
        self.b = Bounds.full(arr.shape)
        self.cached.read(self.t, self.b, (16, 16), method)

    def teardown(self, method):
        self.cache.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_cache_sourced(self, method):
        self.cached.read(self.t, self.b, (16, 16), method)

    def time_source(self, method):
        self.source.read(self.t, self.b, (16, 16), method)
