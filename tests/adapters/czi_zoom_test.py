"""The CZI zoom= path: nearest served by get_decimated_data through libCZI's zoom (design §5).

TestZoomServesNearest pins: bit-identity with downsample_block(get_data(bounds), scale,
"nearest") across factors 2-8 (3 and 5 included) on a single-tile stack, a mosaic with gaps,
overlaps and tile edges on and off the f-grid, RGB and real files; that the zoom really
reaches libCZI; every declining case going to the default path; the fallback on a shape
mismatch; and why the override reads a mosaic in cells (libCZI's own whole-ROI zoom is not
exact across a subblock edge on the f-grid).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from pylibCZIrw import czi as pyczi

import tensor_server
from tensor_server.adapters.czi import CziAdapter, _grid_runs
from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.downsample import downsample_block
from tests.adapters.czi_test import MOSAIC_ORIGIN, write_mosaic, write_rgb, write_stack

FACTORS = (2, 3, 4, 5, 6, 7, 8)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("czi_zoom")
    out = {"stack": d / "stack.czi", "mosaic": d / "mosaic.czi", "rgb": d / "rgb.czi"}
    write_stack(out["stack"])
    write_mosaic(out["mosaic"])
    write_rgb(out["rgb"])
    return out


@pytest.fixture
def zoom_calls(monkeypatch) -> list:
    """Every ``zoom=`` argument libCZI's reader receives (None for full-resolution reads)."""
    calls: list = []
    original = pyczi.CziReader.read

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("zoom"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pyczi.CziReader, "read", spy)
    return calls


@pytest.fixture
def default_path_calls(monkeypatch) -> list:
    """Scaled reads the engine streamed (sized a streaming unit for) instead of taking the
    adapter's decimated (zoom) read: one entry, the scale, per streamed read."""
    from tensor_server.core import engine

    calls: list = []
    original = engine.streaming_unit

    def spy(transfer, read_block, scale):
        calls.append(tuple(scale))
        return original(transfer, read_block, scale)

    monkeypatch.setattr(engine, "streaming_unit", spy)
    return calls


def _oracle(t: TensorAdapter, b: Bounds, scale: tuple[int, ...]) -> np.ndarray:
    return downsample_block(t.get_data(b), scale, "nearest")


def _plane_scale(t: TensorAdapter, fy: int, fx: int | None = None) -> tuple[int, ...]:
    fx = fy if fx is None else fx
    return tuple(fy if d == "y" else fx if d == "x" else 1 for d in t.dim_labels)


def _divisible_bounds(t: TensorAdapter, f: int, rng: np.random.Generator, n: int) -> list[Bounds]:
    """The largest f-divisible box from the origin, plus n random off-origin f-divisible boxes
    over all planes (and samples)."""
    ya, xa = t.dim_labels.index("y"), t.dim_labels.index("x")
    out = []
    for k in range(n + 1):
        start, stop = [0] * t.ndim, list(t.shape)
        for a in (ya, xa):
            if k == 0:
                start[a], stop[a] = 0, t.shape[a] // f * f
            else:
                s = int(rng.integers(0, t.shape[a] - f + 1))
                m = int(rng.integers(1, (t.shape[a] - s) // f + 1))
                start[a], stop[a] = s, s + m * f
        out.append(Bounds(tuple(start), tuple(stop)))
    return out


class TestZoomServesNearest:
    @pytest.mark.parametrize("f", FACTORS)
    @pytest.mark.parametrize("name", ["stack", "mosaic", "rgb"])
    def test_bit_identical_to_nearest(self, files, zoom_calls, default_path_calls, name, f):
        rng = np.random.default_rng(f)
        with tensor_server.open(files[name]) as src:
            t = src.tensor()
            scale = _plane_scale(t, f)
            for b in _divisible_bounds(t, f, rng, n=4):
                zoom_calls.clear()
                got = t.get_scaled_data(b, scale, "nearest")
                served_with = list(zoom_calls)
                level0 = t.get_data(b)
                want = downsample_block(level0, scale, "nearest")
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got, want, err_msg=f"{name} x{f} {b}")
                assert got.flags.owndata and got.flags.c_contiguous
                assert None not in served_with, f"{name} x{f} {b}: a full-resolution read ({served_with})"
                if level0.any():  # a box no subblock covers is background without any read
                    assert 1.0 / f in served_with, f"{name} x{f} {b}: zoom did not reach libCZI"
            assert default_path_calls == []

    def test_zoom_reaches_libczi(self, files, zoom_calls):
        with tensor_server.open(files["stack"]) as src:
            t = src.tensor()
            b = Bounds((0, 0, 0, 0, 0), (1, 2, 3, 256, 384))
            out = t.get_scaled_data(b, (1, 1, 1, 4, 4), "nearest")
            assert out.shape == (1, 2, 3, 64, 96)
            # one zoomed read per plane (one subblock each), nothing at full resolution
            assert zoom_calls == [0.25] * 6
            assert all(z is not None and 0 < z < 1 for z in zoom_calls)

    def test_mosaic_is_read_in_cells_cut_at_on_grid_edges(self, files, zoom_calls):
        with tensor_server.open(files["mosaic"]) as src:
            t = src.tensor()
            b = Bounds((0, 0, 0, 0, 0), (1, 1, 1, 196, 288))
            got = t.get_scaled_data(b, (1, 1, 1, 4, 4), "nearest")
            served_with = list(zoom_calls)
            np.testing.assert_array_equal(got, _oracle(t, b, (1, 1, 1, 4, 4)))
            # cut at x 100, 128, 200, 248 and y 60, 96, 120 (on the 4-grid; 150 and 130 are
            # not): 5 × 4 cells, of which the 4 that no tile touches (the gaps, and x >= 248
            # above row 60) are background without a read
            assert served_with == [0.25] * 16

    @pytest.mark.parametrize("alias", ["stride", "decimate", " Nearest "])
    def test_method_aliases_take_the_zoom(self, files, zoom_calls, alias):
        with tensor_server.open(files["stack"]) as src:
            t = src.tensor()
            b = Bounds((0, 1, 0, 6, 9), (1, 2, 3, 6 + 5 * 20, 9 + 5 * 30))
            got = t.get_scaled_data(b, (1, 1, 1, 5, 5), alias)
            assert zoom_calls == [0.2] * 3  # one per Z plane
            np.testing.assert_array_equal(got, _oracle(t, b, (1, 1, 1, 5, 5)))

    @pytest.mark.parametrize(
        "case, scale, method, bounds",
        [
            ("method area", (1, 1, 1, 4, 4), "area", None),
            ("default method (area)", (1, 1, 1, 4, 4), None, None),
            ("method max", (1, 1, 1, 4, 4), "max", None),
            ("unequal Y/X factors", (1, 1, 1, 2, 4), "nearest", None),
            ("scale on C", (1, 2, 1, 4, 4), "nearest", None),
            ("scale on Z", (1, 1, 3, 4, 4), "nearest", None),
            ("factor does not divide Y", (1, 1, 1, 3, 3), "nearest", Bounds((0, 0, 0, 0, 0), (1, 2, 3, 256, 384))),
            ("factor does not divide X", (1, 1, 1, 5, 5), "nearest", Bounds((0, 0, 0, 0, 1), (1, 2, 3, 250, 384))),
            ("factor 1 on Y/X, scale on Z", (1, 1, 3, 1, 1), "nearest", None),
            ("factor 1 everywhere", (1, 1, 1, 1, 1), "nearest", None),
        ],
    )
    def test_declining_cases_take_the_default_path(
        self, files, zoom_calls, default_path_calls, case, scale, method, bounds
    ):
        with tensor_server.open(files["stack"]) as src:
            t = src.tensor()
            b = bounds or Bounds((0, 0, 0, 0, 0), (1, 2, 3, 256, 384))
            got = t.get_scaled_data(b, scale, method)
            want = downsample_block(t.get_data(b), scale, method or "area")
            np.testing.assert_array_equal(got, want, err_msg=case)
            assert all(z is None for z in zoom_calls), f"{case}: zoom reached libCZI"
            # the engine streamed it (scale 1 everywhere is a plain read, nothing to stream)
            assert default_path_calls == ([] if all(s == 1 for s in scale) else [scale]), case

    def test_stored_pyramid_declines(self, files, zoom_calls, default_path_calls):
        """libCZI paints stored pyramid subblocks for zoom < 1; their reduction is the
        writer's, so a file with a pyramid never takes the zoom."""
        with tensor_server.open(files["stack"]) as src:
            t = src.tensor()
            t._file.has_pyramid = True
            b = Bounds((0, 0, 0, 0, 0), (1, 2, 3, 256, 384))
            got = t.get_scaled_data(b, (1, 1, 1, 4, 4), "nearest")
            np.testing.assert_array_equal(got, _oracle(t, b, (1, 1, 1, 4, 4)))
            assert all(z is None for z in zoom_calls) and len(default_path_calls) == 1

    def test_shape_mismatch_falls_back_with_a_warning(self, files, monkeypatch, caplog, default_path_calls):
        original = pyczi.CziReader.read

        def off_by_one(self, *args, **kwargs):
            arr = original(self, *args, **kwargs)
            return arr[:-1] if kwargs.get("zoom") is not None else arr  # a rounding slip

        monkeypatch.setattr(pyczi.CziReader, "read", off_by_one)
        with tensor_server.open(files["stack"]) as src:
            t = src.tensor()
            b = Bounds((0, 0, 1, 8, 16), (1, 2, 3, 8 + 6 * 30, 16 + 6 * 50))
            with caplog.at_level(logging.WARNING, logger="tensor_server.adapters.czi"):
                got = t.get_scaled_data(b, (1, 1, 1, 6, 6), "nearest")
            np.testing.assert_array_equal(got, _oracle(t, b, (1, 1, 1, 6, 6)))
            assert got.shape == (1, 2, 2, 30, 50)
            assert any("unexpected shape" in r.getMessage() for r in caplog.records)
            assert default_path_calls == [(1, 1, 1, 6, 6)]

    def test_libczi_whole_roi_zoom_is_not_exact_across_an_on_grid_edge(self, files):
        """Why the zoomed read cuts cells: one libCZI zoom read over the mosaic differs from
        nearest where a tile ends on the f-grid next to a gap (tile 0 ends at x 128; below
        row 96 nothing covers x 100..150, and tile 2 ends at x 100). If this starts passing
        with exact values, libCZI changed and the cell rule may be relaxable."""
        with tensor_server.open(files["mosaic"]) as src:
            t = src.tensor()
            full = t.get_data()[0, 0, 0]
        f = 4
        y0, x0 = MOSAIC_ORIGIN
        with pyczi.open_czi(str(files["mosaic"])) as doc:
            zoomed = doc.read(roi=(x0, y0, 288, 196), plane={"C": 0}, zoom=1.0 / f)[..., 0]
        want = full[:196:f, :288:f]
        assert zoomed.shape == want.shape
        wrong = np.argwhere(zoomed != want)
        assert len(wrong) > 0
        # every wrong pixel samples a level-0 column/row where a tile edge lies on the grid
        on_grid_edges_x = {100, 128, 200, 248}
        on_grid_edges_y = {60, 96, 120, 196}
        assert all(x * f in on_grid_edges_x or y * f in on_grid_edges_y for y, x in wrong)

    def test_concurrent_zoomed_reads_match_serial(self, files):
        """Eight threads share the file's reader pool; each read borrows one reader."""
        import concurrent.futures

        with tensor_server.open(files["mosaic"]) as src:
            t = src.tensor()
            rng = np.random.default_rng(0)
            jobs = [(b, f) for f in (2, 3, 4, 5) for b in _divisible_bounds(t, f, rng, n=5)]
            serial = [t.get_scaled_data(b, (1, 1, 1, f, f), "nearest") for b, f in jobs]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                parallel = list(pool.map(lambda j: t.get_scaled_data(j[0], (1, 1, 1, j[1], j[1]), "nearest"), jobs * 2))
            for a, b in zip(serial * 2, parallel):
                np.testing.assert_array_equal(a, b)
            assert sum(h.opens for h in t._file.handles) <= len(t._file.handles)

    def test_grid_runs(self):
        edges = np.array([0, 10, 12, 17, 24, 40])
        assert _grid_runs(edges, 24, 4) == [(0, 3), (3, 6)]  # 12 cuts; 10 and 17 are off-grid
        assert _grid_runs(edges, 24, 3) == [(0, 4), (4, 8)]  # 12 cuts
        assert _grid_runs(np.array([], dtype=np.int64), 30, 5) == [(0, 6)]

    @pytest.mark.parametrize(
        "name, f",
        [
            ("s_1_t_1_c_1_z_1.czi", 5),
            ("mosaic_test.czi", 2),
            ("mosaic_test.czi", 4),
            ("CD_s_1_t_3_c_2_z_5.czi", 2),
            ("CD_s_1_t_3_c_2_z_5.czi", 5),
            ("tiles.czi", 2),
            ("RGB-8bit.czi", 3),
        ],
    )
    def test_real_files(self, testdata, zoom_calls, name, f):
        with tensor_server.open(testdata / "czi" / name) as src:
            t = src.tensor()
            assert isinstance(t, CziAdapter)
            ya, xa = t.dim_labels.index("y"), t.dim_labels.index("x")
            stop = list(t.shape)
            stop[ya], stop[xa] = t.shape[ya] // f * f, t.shape[xa] // f * f
            b = Bounds((0,) * t.ndim, tuple(stop))
            scale = _plane_scale(t, f)
            got = t.get_scaled_data(b, scale, "nearest")
            served_with = list(zoom_calls)
            np.testing.assert_array_equal(got, _oracle(t, b, scale))
            assert 1.0 / f in served_with and None not in served_with
