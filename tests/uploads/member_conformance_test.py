"""The readers of uploaded tensors keep the adapter contract (tensor_server.testing)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import MemorySource
from tensor_server.catalog import Catalog
from tensor_server.core.bounds import Bounds
from tensor_server.testing import AdapterTests
from tensor_server.uploads import UploadManager


def mint(tensor, bounds, scale, method):
    """The chunk id a plan of ``tensor`` mints for ``bounds``."""
    from tensor_server.core.chunk_id import ChunkId

    return ChunkId.for_extent(tensor.array_id, bounds, scale, method, tensor.content_version)


def _filled(tmp_path, scheme, arrays):
    """READY members holding ``arrays`` (name -> (array, grid)), every other grid cell of the
    cache:// ones left unwritten (they read as zeros); returns (source, expected arrays)."""
    cat = Catalog([])
    m = UploadManager(cat, tmp_path / "write")
    tensors, expected = {}, {}
    for name, (arr, grid) in arrays.items():
        up = m.add_tensor(
            f"{scheme}://scratch/@fields/{name}",
            arr.shape,
            arr.dtype,
            chunk_shape=grid,
            dim_labels="zyx"[3 - arr.ndim :],
        )
        want = np.zeros_like(arr)
        g = up.tensor.chunk_shape
        for i, cell in enumerate(np.ndindex(*[-(-n // c) for n, c in zip(arr.shape, g)])):
            if scheme == "cache" and i % 2:
                continue
            start = tuple(k * c for k, c in zip(cell, g))
            b = Bounds(start, tuple(min(s + c, n) for s, c, n in zip(start, g, arr.shape)))
            m.write_chunk(mint(up.tensor, b, (1,) * arr.ndim, "none"), arr[b.to_slices()])
            want[b.to_slices()] = arr[b.to_slices()]
        m.set_ready(up.array_id)
        tensors[name], expected[name] = up.tensor, want
    return MemorySource(tensors, source_id="members"), expected, m, cat


class _MemberTests(AdapterTests):
    scheme = ""

    @pytest.fixture
    def source(self, tmp_path):
        rng = np.random.default_rng(4)
        arrays = {
            "vol": (rng.integers(0, 4000, (5, 70, 90), dtype=np.uint16), (2, 32, 40)),
            "plane": (rng.standard_normal((61, 47)).astype(np.float32), (16, 16)),
        }
        src, self.expected, m, cat = _filled(tmp_path, self.scheme, arrays)
        yield src
        m.close()
        cat.close()

    def reference_array(self, source, field):
        return self.expected[field]


class TestCacheMember(_MemberTests):
    scheme = "cache"


class TestZarrMember(_MemberTests):
    scheme = "zarr"
