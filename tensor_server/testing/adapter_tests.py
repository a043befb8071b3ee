"""AdapterTests: the contract every TensorAdapter must keep, as a reusable pytest class.

Subclass it in an adapter's test module and provide two things::

    class TestMyFormat(AdapterTests):
        @pytest.fixture
        def source(self, tmp_path):            # -> SourceAdapter (yield it; it is closed after)
            ...
        def reference_array(self, source, field):   # the format library's own read
            return mylib.read(source.path)[...]      # whole tensor, in the adapter's axis order

Optional knobs: ``scales`` (per-test scale factors), ``methods``, ``max_tensors``,
``random_reads``, ``exact`` (False for lossy codecs compared elsewhere with tolerance).

What it pins: shape/dtype/labels consistency; ``get_data`` equals the library's read on
random and ragged off-origin bounds; results are owned; scaled reads through the read engine
(the seam the server uses) equal the NumPy oracle over ``get_data`` for every method, with
and without a chunk cache; decimated reads equal ``get_data(...)[::step]`` where offered
(and are None where not declared); bad bounds raise InvalidBounds; 8 threads reading random
chunks through the engine get the same bytes as serial reads.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.methods import CANONICAL_METHODS
from tensor_server.core.plan import plan_read
from tensor_server.errors import InvalidBounds

__all__ = ["AdapterTests", "random_bounds"]


def random_bounds(shape: tuple[int, ...], rng: np.random.Generator, max_extent: int = 96) -> Bounds:
    """A random non-empty box, usually off-origin and ragged against any grid."""
    start, stop = [], []
    for n in shape:
        a = int(rng.integers(0, n))
        b = int(rng.integers(a + 1, min(n, a + max_extent) + 1))
        start.append(a)
        stop.append(b)
    return Bounds(tuple(start), tuple(stop))


class AdapterTests:
    """Base conformance suite (see module docstring)."""

    methods: ClassVar[tuple[str, ...]] = CANONICAL_METHODS
    max_tensors: ClassVar[int] = 4
    random_reads: ClassVar[int] = 6
    exact: ClassVar[bool] = True
    threads: ClassVar[int] = 8
    thread_reads: ClassVar[int] = 48

    # ---- to provide ------------------------------------------------------------------------
    @pytest.fixture
    def source(self, tmp_path: Any) -> Iterator[SourceAdapter]:  # pragma: no cover - abstract
        raise NotImplementedError("subclasses provide a `source` fixture")

    def reference_array(self, source: SourceAdapter, field: str) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError("subclasses read the whole tensor with the format library")

    # ---- helpers ---------------------------------------------------------------------------
    def tensors(self, source: SourceAdapter) -> list[tuple[str, TensorAdapter]]:
        return list(source.tensors.items())[: self.max_tensors]

    def scales_for(self, tensor: TensorAdapter) -> list[tuple[int, ...]]:
        """Scales to try: 2 and a non-dyadic 3 on the plane axes, plus one on every axis."""
        sp = [i for i, d in enumerate(tensor.dim_labels) if d in ("y", "x")] or list(range(tensor.ndim))[-2:]
        out = []
        for f in (2, 3):
            out.append(tuple(f if i in sp else 1 for i in range(tensor.ndim)))
        out.append(tuple(2 if n > 1 else 1 for n in tensor.shape))
        return out

    @staticmethod
    def engine(store: Any | None = None) -> ReadEngine:
        """The read engine the server runs (with ``store`` as its chunk cache)."""
        return ReadEngine(store, workers=2)

    def assert_same(self, got: np.ndarray, want: np.ndarray) -> None:
        assert got.shape == want.shape, (got.shape, want.shape)
        if self.exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=8)

    # ---- the suite -------------------------------------------------------------------------
    def test_metadata_is_consistent(self, source: SourceAdapter) -> None:
        assert source.tensors, "a source has at least one tensor"
        assert "/" not in source.source_id
        for field, t in self.tensors(source):
            assert t.array_id in (source.source_id, f"{source.source_id}/{field}")
            assert len(t.shape) == len(t.dim_labels) == t.ndim >= 1
            assert all(n >= 1 for n in t.shape)
            assert t.dtype.byteorder in ("=", "|"), "served dtype is native byte order"
            assert len(t.chunk_shape) == t.ndim and all(1 <= c <= n for c, n in zip(t.chunk_shape, t.shape))
            rb = t.read_block_shape
            assert rb is None or (len(rb) == t.ndim and all(b >= 1 for b in rb))
            if t.physical_scale is not None:
                assert len(t.physical_scale) == t.ndim
            assert isinstance(t.content_version, bytes) and t.content_version
            corner = t.get_data(Bounds((0,) * t.ndim, (1,) * t.ndim))
            assert corner.dtype == t.dtype and corner.shape == (1,) * t.ndim

    def test_full_read_matches_library(self, source: SourceAdapter) -> None:
        for field, t in self.tensors(source):
            self.assert_same(t.get_data(), np.asarray(self.reference_array(source, field)))

    def test_random_reads_match_library(self, source: SourceAdapter) -> None:
        rng = np.random.default_rng(1234)
        for field, t in self.tensors(source):
            ref = np.asarray(self.reference_array(source, field))
            for _ in range(self.random_reads):
                b = random_bounds(t.shape, rng)
                self.assert_same(t.get_data(b), ref[b.to_slices()])

    def test_results_are_owned(self, source: SourceAdapter) -> None:
        for _field, t in self.tensors(source):
            b = Bounds.full(t.shape)
            a = t.get_data(b)
            assert a.flags.writeable and a.flags.c_contiguous and a.flags.owndata
            before = a.copy()
            a[...] = 0 if a.dtype != bool else False
            self.assert_same(t.get_data(b), before)
            scale = self.scales_for(t)[0]
            for method in ("nearest", "area"):
                s = self.engine().read(t, b, scale, method)
                assert s.flags.writeable and s.flags.owndata

    def test_scaled_reads_equal_oracle(self, source: SourceAdapter) -> None:
        from tensor_server_kernels import reference

        rng = np.random.default_rng(99)
        for field, t in self.tensors(source):
            for scale in self.scales_for(t):
                b = random_bounds(t.shape, rng, max_extent=128)
                data = t.get_data(b)
                for method in self.methods:
                    if data.dtype.kind == "c" and method != "nearest":
                        continue
                    got = self.engine().read(t, b, scale, method)
                    want = reference.downsample(data, scale, method)
                    assert got.dtype == t.dtype
                    np.testing.assert_array_equal(got, want, err_msg=f"{field} {method} {scale} {b}")

    def test_decimated_read(self, source: SourceAdapter) -> None:
        """Not declared: always None. Declared: equal to ``get_data(...)[::step]`` whenever it
        answers, and it answers for some plane-axis step on an extent that is a whole
        multiple of the step (a format's own reduced read, e.g. CZI's zoom, may decline
        other requests)."""
        rng = np.random.default_rng(5)
        for _field, t in self.tensors(source):
            served = 0
            for scale in self.scales_for(t):
                aligned = Bounds((0,) * t.ndim, tuple((n // s) * s if n >= s else n for n, s in zip(t.shape, scale)))
                for b in (random_bounds(t.shape, rng), aligned):
                    dec = t.get_decimated_data(b, scale)
                    if not t.decimates:
                        assert dec is None, f"{type(t).__name__} does not declare decimates but returned data"
                        continue
                    if dec is None:
                        continue
                    served += 1
                    want = t.get_data(b)[tuple(slice(None, None, s) for s in scale)]
                    self.assert_same(np.asarray(dec), want)
            if t.decimates:
                assert served, f"{type(t).__name__} declares decimates but declined every read"

    def test_read_into_equals_get_data(self, source: SourceAdapter) -> None:
        """``read_region_into`` (declared or the default copy) writes exactly ``get_data``,
        into a C-contiguous buffer and into a strided view, touching nothing around it."""
        rng = np.random.default_rng(8)
        for _field, t in self.tensors(source):
            for b in (random_bounds(t.shape, rng), random_bounds(t.shape, rng), Bounds.full(t.shape)):
                want = t.get_data(b)
                buf = np.empty(b.shape, t.dtype)
                t.read_region_into(b, buf)
                self.assert_same(buf, want)
                wide = np.zeros(tuple(2 * n for n in b.shape), t.dtype)
                t.read_region_into(b, wide[tuple(slice(None, None, 2) for _ in b.shape)])
                self.assert_same(wide[tuple(slice(None, None, 2) for _ in b.shape)], want)
                assert not wide[tuple(slice(1, None, 2) for _ in b.shape)].any()

    def test_uniform_blocks_hold_their_value(self, source: SourceAdapter) -> None:
        """Not declared: no blocks. Declared: every reported block decodes to its value
        (bitwise), blocks lie inside the tensor, and reads with the closed-form path equal
        reads without it."""
        for field, t in self.tensors(source):
            full = Bounds.full(t.shape)
            blocks = t.uniform_blocks(full)
            if not t.reports_uniform_blocks:
                assert blocks == [], f"{type(t).__name__} does not declare reports_uniform_blocks but named blocks"
                continue
            for box, value in blocks[:16]:
                box.validate(t.shape)
                pixels = t.get_data(box)
                assert pixels.tobytes() == np.full(box.shape, value, dtype=t.dtype).tobytes(), f"{field} {box}"
            scale = self.scales_for(t)[0]
            on, off = ReadEngine(workers=2), ReadEngine(workers=2, special_chunks=False)
            for method in ("area", "max"):
                if t.dtype.kind == "c":
                    continue
                self.assert_same(on.read(t, full, scale, method), off.read(t, full, scale, method))

    def test_bad_bounds_raise(self, source: SourceAdapter) -> None:
        for _field, t in self.tensors(source):
            with pytest.raises(InvalidBounds):
                t.get_data(Bounds((0,) * t.ndim, tuple(n + 1 for n in t.shape)))
            with pytest.raises(InvalidBounds):
                t.get_data(Bounds((0,) * (t.ndim + 1), (1,) * (t.ndim + 1)))
            with pytest.raises(InvalidBounds):
                t.get_data(Bounds((-1,) + (0,) * (t.ndim - 1), (1,) * t.ndim))

    def test_plan_assembles_to_library_read(self, source: SourceAdapter) -> None:
        engine = self.engine()
        for field, t in self.tensors(source):
            plan = plan_read(t)
            out = np.empty(plan.shape, t.dtype)
            for pc in plan.chunks:
                out[pc.out_bounds.to_slices()] = engine.chunk(pc.chunk_id.encode(), t)[1]
            self.assert_same(out, np.asarray(self.reference_array(source, field)))

    def test_cached_reads_equal_uncached(self, source: SourceAdapter, tmp_path: Any) -> None:
        """Through a chunk cache, as the server reads: full resolution first (which fills the
        cache), then a zoomed-out plan (whose units may be assembled from those entries)
        must equal the uncached engine's read."""
        from tensor_server.cache import CacheManager

        with CacheManager(tmp_path / "adapter-tests-cache") as cache:
            cached, plain = self.engine(cache), self.engine()
            for field, t in self.tensors(source)[:2]:
                for pc in plan_read(t).chunks[:64]:
                    cached.chunk(pc.chunk_id, t)
                scale = self.scales_for(t)[0]
                for method in ("nearest", "area"):
                    for pc in plan_read(t, None, scale, method).chunks[:16]:
                        got = cached.chunk(pc.chunk_id, t)[1]
                        want = plain.read(t, pc.chunk_id.bounds, scale, pc.chunk_id.method)
                        np.testing.assert_array_equal(got, want, err_msg=f"{field} {method} {pc.chunk_id.bounds}")

    def test_concurrent_reads_match_serial(self, source: SourceAdapter) -> None:
        rng = np.random.default_rng(7)
        jobs = []
        for _field, t in self.tensors(source):
            for scale in [(1,) * t.ndim] + self.scales_for(t)[:1]:
                method = "area" if any(s > 1 for s in scale) else None
                for pc in plan_read(t, None, scale, method).chunks:
                    jobs.append((t, pc.chunk_id))
        picks = [jobs[int(i)] for i in rng.integers(0, len(jobs), self.thread_reads)]
        engine = self.engine()
        serial = [engine.chunk(cid, t)[1] for t, cid in picks]
        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            parallel = list(pool.map(lambda job: engine.chunk(job[1], job[0])[1], picks))
        for a, b in zip(serial, parallel):
            np.testing.assert_array_equal(a, b)
