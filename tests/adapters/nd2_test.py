"""Nd2Adapter: the real ND2 sample through the conformance suite, frame mapping, decimation.

``nd2`` has no writer, so nothing can be generated in the ND2 format: the suite runs over the
one real file in ../shared/testdata (nd2/cluster.nd2, TZCYX uint16). The axis/frame logic for
layouts that file does not have (stage positions, RGB samples, singleton frame axes) runs
over a stand-in for ``ND2File`` that reproduces ``read_frame``'s documented reshape.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.nd2 import Nd2Adapter, _FrameModel, _position_names, served_tensors, sniff_nd2
from tensor_server.adapters.registry import detect_format
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.core.bounds import Bounds
from tensor_server.core.handles import LazyHandle
from tensor_server.core.normalizing import canonical_axis_order, normalize_axes
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

CLUSTER = "nd2/cluster.nd2"


def served_reference(path: Path) -> np.ndarray:
    """The whole file read by nd2 itself, transposed to the served (canonical) axis order."""
    import nd2

    with nd2.ND2File(path) as f:
        labels = [a.lower() for a in f.sizes]
        data = f.asarray()
    return np.transpose(data, canonical_axis_order(labels))


def inner(tensor):
    return getattr(tensor, "inner", tensor)


class TestNd2RealFile(AdapterTests):
    @pytest.fixture
    def source(self, testdata):
        src = tensor_server.open(testdata / CLUSTER)
        yield src
        src.close()

    def reference_array(self, source, field):
        return served_reference(source.path)


# ---- the real file against expected.json ---------------------------------------------------
def test_cluster_matches_expected(testdata, expected):
    want = expected[CLUSTER]
    with tensor_server.open(testdata / CLUSTER) as src:
        assert src.type == "nd2" and list(src.tensors) == ["image"]
        t = src.tensor()
        native = inner(t)
        assert "".join(native.dim_labels) == want["axes"].lower() == "tzcyx"
        assert list(native.shape) == want["shape"]
        # served canonically: T, C, Z, Y, X
        assert t.dim_labels == ("t", "c", "z", "y", "x") and t.shape == (3, 2, 10, 31, 38)
        a = t.get_data()
        assert a.dtype == np.dtype(want["dtype"])
        assert (int(a.min()), int(a.max()), float(a.sum(dtype=np.float64))) == (want["min"], want["max"], want["sum"])
        vx, vy, vz = want["voxel_size_um"]
        assert t.physical_scale[2:] == pytest.approx((vz, vy, vx))
        assert t.physical_unit[2:] == ("µm", "µm", "µm") and t.physical_scale[:2] == (None, None)
        assert src.metadata["channel_names"][0] == "5-FAM/pH 9.0"


def test_read_block_and_decimation_are_declared(testdata):
    with tensor_server.open(testdata / CLUSTER) as src:
        t = src.tensor()
        assert t.read_block_shape is None and inner(t).read_block_shape is None
        assert t.decimates and isinstance(inner(t), Nd2Adapter)
        # the seed is one whole frame (C/Y/X) even though it is not a read floor
        assert inner(t).native_chunk_shape == (1, 1, 2, 31, 38)


def test_frame_numbers_follow_the_files_loop_order(testdata):
    import nd2

    with tensor_server.open(testdata / CLUSTER) as src, nd2.ND2File(testdata / CLUSTER) as f:
        native = inner(src.tensor())
        loops = [a for a in f.sizes if a not in "CYXS"]
        for number, idx in enumerate(f.loop_indices):
            assert native.frame_index([idx[a] for a in loops]) == number
        # and a frame read through the adapter is nd2's frame of that number
        got = native.get_data(Bounds((2, 7, 0, 0, 0), (3, 8, 2, 31, 38)))[0, 0]
        np.testing.assert_array_equal(got, f.read_frame(2 * 10 + 7))


def test_sniff_and_detection(testdata, tmp_path):
    head = (testdata / CLUSTER).read_bytes()[:4096]
    assert sniff_nd2(Path("a.nd2"), head) and sniff_nd2(Path("renamed.bin"), head)
    jp2 = b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\x00" * 64
    assert sniff_nd2(Path("legacy.ND2"), jp2)
    assert not sniff_nd2(Path("photo.jp2"), jp2), "a plain JPEG 2000 file is not an ND2"
    assert not sniff_nd2(Path("x.nd2"), b"II*\x00" + b"\x00" * 64)
    assert not sniff_nd2(Path("x.nd2"), b"")
    renamed = tmp_path / "acquisition.dat"
    shutil.copyfile(testdata / CLUSTER, renamed)
    assert detect_format(renamed).name == "nd2"  # content first, not the suffix
    with tensor_server.open(renamed) as src:
        assert src.tensor().shape == (3, 2, 10, 31, 38)


# ---- decimated reads -----------------------------------------------------------------------
@pytest.fixture
def frame_spy(monkeypatch):
    """Records every frame number nd2.ND2File.read_frame is asked for."""
    import nd2

    calls: list[int] = []
    original = nd2.ND2File.read_frame

    def spy(self, frame_index):
        calls.append(int(frame_index))
        return original(self, frame_index)

    monkeypatch.setattr(nd2.ND2File, "read_frame", spy)
    return calls


def test_decimated_read_decodes_only_frames_on_the_step(testdata, frame_spy):
    with tensor_server.open(testdata / CLUSTER) as src:
        t = src.tensor()  # served t, c, z, y, x
        ref = served_reference(testdata / CLUSTER)
        b = Bounds((0, 0, 1, 3, 2), (3, 2, 10, 31, 37))
        step = (2, 1, 4, 3, 5)
        frame_spy.clear()
        dec = t.get_decimated_data(b, step)
        np.testing.assert_array_equal(dec, ref[b.to_slices()][::2, :, ::4, ::3, ::5])
        assert dec.flags.owndata and dec.flags.c_contiguous
        # frames = ravel(t, z) over the native T, Z loops: t in {0, 2}, z in {1, 5, 9}
        want = sorted(t_ * 10 + z for t_ in (0, 2) for z in (1, 5, 9))
        assert sorted(frame_spy) == want, "a decimated read must decode only the frames on the step"

        # the scaled-read path takes the decimated read for nearest: same frames, same pixels
        frame_spy.clear()
        scaled = t.get_scaled_data(b, step, "nearest")
        np.testing.assert_array_equal(scaled, dec)
        assert sorted(frame_spy) == want

        # while the streamed default (area) has to read every frame of the extent
        frame_spy.clear()
        t.get_scaled_data(b, step, "area")
        assert set(frame_spy) == {t_ * 10 + z for t_ in range(3) for z in range(1, 10)}


@pytest.mark.parametrize("factor", [8, 32])
def test_plane_scaled_nearest_matches_stride(testdata, factor):
    with tensor_server.open(testdata / CLUSTER) as src:
        t = src.tensor()
        b = Bounds((0, 0, 0, 0, 0), t.shape)
        got = t.get_scaled_data(b, (1, 1, 1, factor, factor), "nearest")
        np.testing.assert_array_equal(got, served_reference(testdata / CLUSTER)[..., ::factor, ::factor])


# ---- handles -------------------------------------------------------------------------------
def test_handle_is_lazy_reopens_and_closes_cleanly(testdata):
    with tensor_server.open(testdata / CLUSTER) as src:
        native = inner(src.tensor())
        handle = native._handle
        assert handle.opens == 1
        first = native.get_data(Bounds((0, 0, 0, 0, 0), (1, 1, 2, 31, 38)))
        native.get_decimated_data(Bounds((0, 0, 0, 0, 0), native.shape), (1, 2, 1, 2, 2))
        # no view onto the mmap survived the reads: closing the map cannot fail
        assert handle.close_if_idle(now=float("inf")) is True and not handle.is_open
        again = native.get_data(Bounds((0, 0, 0, 0, 0), (1, 1, 2, 31, 38)))
        assert handle.opens == 2
        np.testing.assert_array_equal(first, again)
        assert not np.shares_memory(first, again)
    assert not handle.is_open, "closing the source closes the file"


# ---- the frame model on layouts the real file does not have ---------------------------------
class _FakeNd2File:
    """Mimics nd2.ND2File.read_frame: raw (H, W, ch, comp) → transpose(2, 0, 1, 3).squeeze()."""

    def __init__(self, frames: np.ndarray) -> None:
        self.frames = frames  # (n_frames, H, W, ch, comp)
        self.read = []

    def read_frame(self, i: int) -> np.ndarray:
        self.read.append(i)
        return self.frames[i].transpose(2, 0, 1, 3).squeeze()

    def close(self) -> None:
        pass


def _fake_source(tmp_path, loops, h, w, ch, comp, axes):
    rng = np.random.default_rng(11)
    n = int(np.prod([s for _a, s in loops])) if loops else 1
    frames = rng.integers(0, 60000, (n, h, w, ch, comp), dtype=np.uint16)
    stand_in = tmp_path / "fake.nd2"
    stand_in.write_bytes(b"stat me")
    fake = _FakeNd2File(frames)
    shape = [s for a, s in loops] + [dict(C=ch if comp == 3 else ch * comp, Y=h, X=w, S=3)[a] for a in axes]
    tensor = Nd2Adapter(
        stand_in,
        LazyHandle(lambda: fake),
        [a for a, _s in loops] + list(axes),
        shape,
        np.dtype(np.uint16),
        _FrameModel(h, w, ch, comp),
        physical_scale=[None] * len(shape),
        physical_unit=[None] * len(shape),
        metadata={},
    )
    return fake, frames, SourceAdapter(stand_in, {"image": normalize_axes(tensor)}, source_id="fake")


class TestNd2PositionsAndRgb(AdapterTests):
    """T x P loops with RGB frames: served as p, t, y, x, s."""

    @pytest.fixture
    def source(self, tmp_path):
        fake, frames, src = _fake_source(tmp_path, [("T", 3), ("P", 4)], 20, 26, 1, 3, "YXS")
        src.frames = frames
        yield src
        src.close()

    def reference_array(self, source, field):
        # frames (T*P, H, W, 1, 3) → native T, P, Y, X, S → served P, T, Y, X, S
        native = source.frames[:, :, :, 0, :].reshape(3, 4, 20, 26, 3)
        return native.transpose(1, 0, 2, 3, 4)

    def test_served_axes(self, source):
        t = source.tensor()
        assert t.dim_labels == ("p", "t", "y", "x", "s") and t.shape == (4, 3, 20, 26, 3)


def test_positions_are_served_as_one_image_too(tmp_path):
    """A stand-in file of 3 T x 4 P RGB frames (no real multi-position ND2 sample or writer
    exists): ``positions`` lays the p axis out 2 x 2 in p order, named by the XY loop's
    points where every point has a name, each box holding its position's t, y, x, s pixels."""
    fake, frames, src = _fake_source(tmp_path, [("T", 3), ("P", 4)], 20, 26, 1, 3, "YXS")
    tensors = served_tensors(src.tensor().inner, metadata := {"positions": ["A1", "A2", "B1", "B2"]})
    assert list(tensors) == ["image", "positions"]
    montage = tensors["positions"]
    assert montage.dim_labels == ("t", "y", "x", "s") and montage.shape == (3, 2 * 20 + 2, 2 * 26 + 2, 3)
    layout = montage.metadata["montage"]
    assert "montage" not in metadata and layout["gap"] == [2, 2]  # ceil(26 / 16); on its own descriptor
    assert [(p["index"], p["name"], p["box"]) for p in layout["positions"]] == [
        (0, "A1", [[0, 0], [20, 26]]),
        (1, "A2", [[0, 28], [20, 54]]),
        (2, "B1", [[22, 0], [42, 26]]),
        (3, "B2", [[22, 28], [42, 54]]),
    ]
    whole = montage.get_data()
    native = frames[:, :, :, 0, :].reshape(3, 4, 20, 26, 3)  # T, P, Y, X, S
    for p in layout["positions"]:
        (y0, x0), (y1, x1) = p["box"]
        np.testing.assert_array_equal(whole[:, y0:y1, x0:x1], native[:, p["index"]])
    assert not whole[:, 20:22].any() and not whole[:, :, 26:28].any(), "the gaps are the fill"
    unnamed = served_tensors(src.tensor().inner, {"positions": ["A1", "", "B1", "B2"]})["positions"]
    assert [p["name"] for p in unnamed.metadata["montage"]["positions"]] == ["0", "1", "2", "3"]
    (tmp_path / "one").mkdir()
    _, _, single = _fake_source(tmp_path / "one", [("T", 3)], 20, 26, 1, 3, "YXS")
    assert list(served_tensors(single.tensor(), {})) == ["image"]  # t y x s: no normalizing wrapper


def test_position_names_come_from_the_xy_loop():
    """nd2's own structures: the XY position loop's point names, "" for an unnamed point."""
    from types import SimpleNamespace

    from nd2 import structures as s

    points = [s.Position(stagePositionUm=(0, 0, 0), name="A1"), s.Position(stagePositionUm=(9, 0, 0))]
    loops = [
        SimpleNamespace(type="TimeLoop"),
        s.XYPosLoop(count=2, nestingLevel=1, parameters=s.XYPosLoopParams(isSettingZ=False, points=points)),
    ]
    assert _position_names(SimpleNamespace(experiment=loops)) == ["A1", ""]
    assert _position_names(SimpleNamespace(experiment=loops[:1])) == []


def test_non_rgb_components_become_channels(tmp_path):
    """nd2 serves 2 components per channel as C = componentCount: c index = ch * comp + k."""
    fake, frames, src = _fake_source(tmp_path, [("Z", 5)], 9, 7, 2, 2, "CYX")
    t = src.tensor()
    assert t.dim_labels == ("c", "z", "y", "x") and t.shape == (4, 5, 9, 7)
    want = frames.reshape(5, 9, 7, 4).transpose(3, 0, 1, 2)
    np.testing.assert_array_equal(t.get_data(), want)


def test_singleton_frame_axes_dropped_by_nd2(tmp_path):
    """One channel (nd2 drops C) and a line scan of height 1 (nd2 drops Y too)."""
    fake, frames, src = _fake_source(tmp_path, [("T", 6)], 1, 40, 1, 1, "X")
    t = src.tensor()
    assert t.dim_labels == ("t", "x") and t.shape == (6, 40)
    np.testing.assert_array_equal(t.get_data(), frames[:, 0, :, 0, 0])
    fake.read.clear()
    np.testing.assert_array_equal(t.get_decimated_data(Bounds((1, 3), (6, 40)), (2, 4)), frames[1::2, 0, 3::4, 0, 0])
    assert fake.read == [1, 3, 5]


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0, 4, 200, 4096, 300_000, -4096, -1])
def test_truncated_file_is_unreadable(testdata, tmp_path, keep):
    data = (testdata / CLUSTER).read_bytes()
    p = tmp_path / "cut.nd2"
    p.write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("content", [b"not an nd2 file at all\n" * 50, b"\xda\xce\xbe\x0a" + bytes(range(256)) * 8])
def test_garbage_is_unreadable(tmp_path, content):
    p = tmp_path / "garbage.nd2"
    p.write_bytes(content)
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(p)
    assert str(p) in str(info.value)
