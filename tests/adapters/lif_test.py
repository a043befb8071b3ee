"""LifAdapter: the real LIF samples through the conformance suite, layouts, decimation.

No LIF writer exists (readlif only reads), so the suite runs over the two real files in
../shared/testdata/lif. A 16-bit image is derived from a real file by editing its XML header
in place (same byte length), and a layout readlif cannot address likewise.
"""

from __future__ import annotations

import shutil
from math import prod
from pathlib import Path

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.lif import LifAdapter, _field_names, sniff_lif
from tensor_server.adapters.registry import detect_format
from tensor_server.core.bounds import Bounds
from tensor_server.core.normalizing import canonical_axis_order
from tensor_server.errors import UnreadableSource
from tensor_server.testing import AdapterTests

SWEEP = "lif/LeicaLASX_wavelength-sweep_example.lif"
XZ = "lif/testdata_2channel_xz.lif"


def inner(tensor):
    return getattr(tensor, "inner", tensor)


def readlif_reference(path: Path, image_index: int) -> np.ndarray:
    """The whole image read plane by plane with readlif's get_plane, in the served order."""
    from readlif.reader import LifFile

    image = LifFile(str(path)).get_image(image_index)
    keys = list(image.dims_n)
    plane_keys, outer = keys[:2], keys[2:][::-1]  # outer: slowest first
    labels = {1: "x", 2: "y", 3: "z", 4: "t", 5: "w", 9: "i", 10: "m"}
    shape = [image.dims_n[k] for k in outer] + [image.channels] + [image.dims_n[k] for k in plane_keys[::-1]]
    out = np.empty(shape, np.uint8 if image.bit_depth[0] <= 8 else np.uint16)
    for idx in np.ndindex(*shape[:-2]):
        *o, c = idx
        out[idx] = np.asarray(image.get_plane(c=c, requested_dims=dict(zip(outer, o))))
    native_labels = [labels[k] for k in outer] + ["c"] + [labels[k] for k in plane_keys[::-1]]
    return np.transpose(out, canonical_axis_order(native_labels))


def raw_oracle(path: Path, image_index: int) -> np.ndarray:
    """Independent of readlif's plane addressing: the memory block viewed through the XML's
    own BytesInc strides (native adapter order: outer dims slowest first, c, plane)."""
    from readlif.reader import LifFile

    lif = LifFile(str(path))
    image = lif.get_image(image_index)
    element = [e for e in lif.xml_root.iter("Element") if e.find("./Data/Image") is not None][image_index]
    desc = "./Data/Image/ImageDescription"
    dims = [(int(d.get("NumberOfElements")), int(d.get("BytesInc"))) for d in element.findall(f"{desc}/Dimensions/")]
    chans = [int(c.get("BytesInc")) for c in element.findall(f"{desc}/Channels/ChannelDescription")]
    itemsize = 1 if image.bit_depth[0] <= 8 else 2
    start, length = image.offsets
    block = np.fromfile(path, dtype=np.uint8, count=length, offset=start)
    c_stride = chans[1] - chans[0] if len(chans) > 1 else 0
    shape = [n for n, _ in dims[2:][::-1]] + [len(chans), dims[1][0], dims[0][0]]
    strides = [inc for _, inc in dims[2:][::-1]] + [c_stride, dims[1][1], dims[0][1]]
    view = np.lib.stride_tricks.as_strided(
        block.view(f"<u{itemsize}" if itemsize > 1 else np.uint8), shape=shape, strides=strides, writeable=False
    )
    return view.copy()


class _LifSuite(AdapterTests):
    sample = ""

    @pytest.fixture
    def source(self, testdata):
        src = tensor_server.open(testdata / self.sample)
        yield src
        src.close()

    def reference_array(self, source, field):
        return readlif_reference(source.path, list(source.tensors).index(field))


class TestLifWavelengthSweep(_LifSuite):
    sample = SWEEP


class TestLifXZScans(_LifSuite):
    sample = XZ


# ---- values against the XML layout, expected.json and readlif's TIFF references -------------
@pytest.mark.parametrize("sample", [SWEEP, XZ])
def test_every_image_equals_the_raw_block_through_xml_strides(testdata, sample):
    with tensor_server.open(testdata / sample) as src:
        for i, t in enumerate(src.tensors.values()):
            np.testing.assert_array_equal(inner(t).get_data(), raw_oracle(src.path, i))


def test_xz_file_matches_expected(testdata, expected):
    """readlif's expected values flatten (C, other) planes of Z x X; the tensors keep the
    axes: xzt → t, c, z, x; xzy → a c, z, y, x volume; xz → c, z, x."""
    want = {im["name"]: im for im in expected[XZ]["images"]}
    with tensor_server.open(testdata / XZ) as src:
        assert list(src.tensors) == ["xzt", "xzy", "xz"]
        layout = {
            "xzt": (("t", "c", "z", "x"), (20, 2, 128, 128)),
            "xzy": (("c", "z", "y", "x"), (2, 128, 23, 128)),
            "xz": (("c", "z", "x"), (2, 512, 512)),
        }
        for name, t in src.tensors.items():
            w = want[name]
            assert (t.dim_labels, t.shape) == layout[name]
            assert prod(t.shape) == prod(w["shape"])
            a = t.get_data()
            assert a.dtype == np.dtype(w["dtype"])
            assert (int(a.min()), int(a.max()), float(a.sum(dtype=np.float64))) == (w["min"], w["max"], w["sum"])
            assert t.physical_unit[-2:] == ("µm", "µm")
            x_length_um = 52.47828 if name == "xz" else 17.81554
            assert t.physical_scale[-1] == pytest.approx(x_length_um / (t.shape[-1] - 1))  # µm
        xzt = src.tensors["xzt"]
        assert xzt.physical_scale[0] == pytest.approx(10.07 / 19) and xzt.physical_unit[0] == "s"
        assert src.tensors["xzy"].physical_scale[2] == pytest.approx(5.039354 / 22)


def test_xz_planes_equal_readlifs_reference_tiffs(testdata):
    """SOURCES.md: readlif's own test TIFFs are planes of the xzt image."""
    import tifffile

    with tensor_server.open(testdata / XZ) as src:
        xzt = src.tensors["xzt"]  # t, c, z, x
        for name, (t, c) in {"xz_c0_t0": (0, 0), "xz_c1_t8": (8, 1)}.items():
            ref = tifffile.imread(testdata / f"tiff-sequence/readlif_tiff/{name}.tif")
            got = xzt.get_data(Bounds((t, c, 0, 0), (t + 1, c + 1, 128, 128)))[0, 0]
            np.testing.assert_array_equal(got, ref)


def test_wavelength_sweep_matches_expected(testdata, expected):
    """expected.json holds readlif's get_frame view, which ignores the wavelength axes: it is
    the first plane, and for x_y_z_t_lambdaEmi its 22 "(t, z)" frames are the first 22
    planes in storage order (z fastest, then wavelength): t=0 at the first two wavelengths.
    The tensors keep every stored plane (20, 15 and 220 of them)."""
    from readlif.reader import LifFile

    want = {im["name"]: im for im in expected[SWEEP]["images"]}
    with tensor_server.open(testdata / SWEEP) as src:
        emi, exc, zt = (src.tensors[n] for n in ("x_y_lambdaEmi", "x_y_lambdaExc", "x_y_z_t_lambdaEmi"))
        assert (emi.dim_labels, emi.shape) == (("w", "c", "y", "x"), (20, 1, 64, 64))
        assert (exc.dim_labels, exc.shape) == (("i", "c", "y", "x"), (15, 1, 64, 64))
        assert (zt.dim_labels, zt.shape) == (("w", "t", "c", "z", "y", "x"), (10, 2, 1, 11, 64, 64))
        assert emi.physical_scale[0] == pytest.approx(10.0) and emi.physical_unit[0] == "nm"
        assert exc.physical_scale[0] == pytest.approx(5.0) and zt.physical_scale[1] == pytest.approx(80.91)
        assert emi.physical_scale[-1] == pytest.approx(1 / 9.54067119984844)
        picks = {
            "x_y_lambdaEmi": emi.get_data()[0],
            "x_y_lambdaExc": exc.get_data()[0],
            "x_y_z_t_lambdaEmi": zt.get_data()[:2, 0],
        }
        for name, a in picks.items():
            w = want[name]
            assert a.size == prod(w["shape"]) and a.dtype == np.dtype(w["dtype"])
            assert (int(a.min()), int(a.max()), float(a.sum(dtype=np.float64))) == (w["min"], w["max"], w["sum"])
        frames = LifFile(str(src.path)).get_image(2)
        for t_, z in [(0, 0), (0, 10), (1, 3), (1, 10)]:
            np.testing.assert_array_equal(np.asarray(frames.get_frame(z=z, t=t_)), picks["x_y_z_t_lambdaEmi"][t_, 0, z])


def test_read_block_is_one_plane_and_decimation_is_declared(testdata):
    with tensor_server.open(testdata / XZ) as src:
        xzt, xzy = src.tensors["xzt"], src.tensors["xzy"]
        assert isinstance(inner(xzt), LifAdapter) and xzt.decimates
        assert xzt.read_block_shape == (1, 1, 128, 128)
        assert xzy.read_block_shape == (1, 128, 1, 128)  # a stored z-x plane, served c, z, y, x


# ---- decimated reads -----------------------------------------------------------------------
@pytest.fixture
def read_spy(monkeypatch):
    """Records the file offset of every pixel read the LIF adapter makes."""
    from tensor_server.adapters import lif

    offsets: list[int] = []
    original = lif._LifFileReader.read

    def spy(self, offset, nbytes):
        offsets.append(offset)
        return original(self, offset, nbytes)

    monkeypatch.setattr(lif._LifFileReader, "read", spy)
    return offsets


def test_decimated_read_reads_only_planes_on_the_step(testdata, read_spy):
    with tensor_server.open(testdata / XZ) as src:
        t = src.tensors["xzt"]  # t, c, z, x; stored x, z, c, t: plane 16384 B, t step 32768 B
        full = t.get_data()
        b = Bounds((1, 0, 5, 3), (20, 2, 120, 128))
        step = (4, 2, 3, 3)
        start = inner(t)._block_start
        read_spy.clear()
        dec = t.get_decimated_data(b, step)
        np.testing.assert_array_equal(dec, full[1:20:4, 0:2:2, 5:120:3, 3:128:3])
        assert dec.flags.owndata
        want = [start + ti * 32768 for ti in (1, 5, 9, 13, 17)]  # channel 0 only
        assert sorted(read_spy) == want, "a decimated read must read only the planes on the step"
        read_spy.clear()
        np.testing.assert_array_equal(t.get_scaled_data(b, step, "nearest"), dec)
        assert sorted(read_spy) == want
        read_spy.clear()
        t.get_scaled_data(b, step, "area")  # the streamed default reads every plane
        assert len(read_spy) == 19 * 2


# ---- synthetic variants derived from a real file -------------------------------------------
def _edit_xml(src: Path, dst: Path, edits: list[tuple[str, str]]) -> None:
    """Copy a LIF with same-length text edits in its UTF-16 XML header (offsets unchanged)."""
    data = bytearray(src.read_bytes())
    n_chars = int.from_bytes(data[9:13], "little")
    xml = data[13 : 13 + 2 * n_chars].decode("utf-16-le")
    for old, new in edits:
        assert len(old) == len(new) and xml.count(old) >= 1, old
        xml = xml.replace(old, new)
    data[13 : 13 + 2 * n_chars] = xml.encode("utf-16-le")
    dst.write_bytes(bytes(data))


def _xml_of(path: Path) -> str:
    data = path.read_bytes()
    return data[13 : 13 + 2 * int.from_bytes(data[9:13], "little")].decode("utf-16-le")


def _element_text(xml: str, name: str) -> str:
    start = xml.index(f'Name="{name}"')
    return xml[start : xml.index("</Element>", start)]


def test_twelve_bit_image(testdata, tmp_path):
    """The 'xz' image (2 x 512 x 512 bytes) re-declared as 12-bit 2 x 512 x 256: served as
    uint16 with the stored little-endian values, exactly the raw block. (readlif's get_plane
    would read 1 byte per pixel here: it sizes pixels as bit_depth // 8.)"""
    piece = _element_text(_xml_of(testdata / XZ), "xz")
    new = piece.replace(
        'NumberOfElements="512" Origin="1.376765e-020"', 'NumberOfElements="256" Origin="1.376765e-20"', 1
    )
    new = new.replace('BytesInc="1"', 'BytesInc="2"', 1)  # x: 2-byte pixels; z step stays 512
    new = new.replace('Resolution="8"', 'Resolution="12"')  # two channels: 2 chars longer...
    new = new.replace('Origin="4.413365e-006"', 'Origin="4.413365e-06"', 1)  # ...1 shorter here, 1 above
    p = tmp_path / "twelve.lif"
    _edit_xml(testdata / XZ, p, [(piece, new)])
    with tensor_server.open(p) as s:
        t = s.tensors["xz"]
        assert t.dtype == np.uint16 and t.shape == (2, 512, 256) and t.dim_labels == ("c", "z", "x")
        raw = np.fromfile(testdata / XZ, dtype="<u2", count=2 * 512 * 256, offset=inner(t)._block_start)
        raw = raw.reshape(2, 512, 256)
        np.testing.assert_array_equal(t.get_data(), raw)
        np.testing.assert_array_equal(inner(t).get_data(), raw_oracle(p, 2))
        assert inner(t).metadata["bit_depth"] == [12, 12]
        dec = t.get_scaled_data(Bounds((0, 0, 0), t.shape), (1, 8, 8), "nearest")
        np.testing.assert_array_equal(dec, raw[:, ::8, ::8])
        b = Bounds((1, 100, 7), (2, 300, 250))
        np.testing.assert_array_equal(t.get_data(b), raw[1:2, 100:300, 7:250])


def test_channels_stored_after_time_are_read_where_the_xml_says(testdata, tmp_path):
    """'xzt' re-declared with channels outermost (x, z, t, then c: LAS X Navigator style):
    the tensor follows the XML's byte offsets, where readlif's get_plane would not."""
    piece = _element_text(_xml_of(testdata / XZ), "xzt")
    new = piece.replace(
        'LUTName="Red" IsLUTInverted="0" BytesInc="16384"', 'LUTName="Red" IsLUTInverted="0" BytesInc="327680"'
    )
    new = new.replace(
        'NumberOfElements="20" Origin="0.000000e+000" Length="1.007000e+001" Unit="s" BitInc="0" BytesInc="32768"',
        'NumberOfElements="20" Origin="0.000000e+00" Length="1.007000e+001" Unit="s" BitInc="0" BytesInc="16384"',
    )
    p = tmp_path / "channels_last.lif"
    _edit_xml(testdata / XZ, p, [(piece, new)])
    block = np.fromfile(testdata / XZ, dtype=np.uint8, count=655360, offset=91161)
    want = block.reshape(2, 20, 128, 128).transpose(1, 0, 2, 3)  # stored c, t, z, x → served t, c, z, x
    with tensor_server.open(p) as s:
        t = s.tensors["xzt"]
        np.testing.assert_array_equal(t.get_data(), want)
        np.testing.assert_array_equal(inner(t).get_data(), raw_oracle(p, 0))
        assert not np.array_equal(want, readlif_reference(p, 0)), "readlif's get_plane misreads this layout"


def test_planes_outside_the_memory_block_are_refused(testdata, tmp_path):
    p = tmp_path / "overrun.lif"
    red = 'LUTName="Red" IsLUTInverted="0" BytesInc='
    _edit_xml(testdata / XZ, p, [(red + '"16384"', red + '"96384"')])  # channel 1 past the block end
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(p)
    assert str(p) in str(info.value) and "memory block" in str(info.value)


def test_field_names_are_unique_and_safe():
    assert _field_names(["a", "/b/c/", "a", "x\x00y", "", "a"]) == ["a", "b/c", "a#2", "x_y", "image", "a#3"]


# ---- detection and bad input ---------------------------------------------------------------
def test_sniff_and_detection(testdata, tmp_path):
    head = (testdata / XZ).read_bytes()[:4096]
    assert sniff_lif(Path("x.lif"), head)
    assert not sniff_lif(Path("x.lif"), b"\x70\x00\x00\x00\x10\x00\x00\x00\x2b" + b"\x00" * 20)
    assert not sniff_lif(Path("x.lif"), b"\x70\x00\x00")
    renamed = tmp_path / "scan.bin"
    shutil.copyfile(testdata / XZ, renamed)
    assert detect_format(renamed).name == "lif"


@pytest.mark.parametrize("keep", [0, 5, 13, 20_000, 91_161 + 100, 1_000_000, -1])
def test_truncated_file_is_unreadable(testdata, tmp_path, keep):
    """Cut in the header, the XML, the first image's pixels, a later image, the last byte."""
    data = (testdata / XZ).read_bytes()
    p = tmp_path / "cut.lif"
    p.write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("content", [b"garbage" * 100, b"\x70\x00\x00\x00\x00\x00\x00\x00\x2a" + b"\xff" * 300])
def test_garbage_is_unreadable(tmp_path, content):
    p = tmp_path / "garbage.lif"
    p.write_bytes(content)
    with pytest.raises(UnreadableSource) as info:
        tensor_server.open(p)
    assert str(p) in str(info.value)


def test_file_shrunk_after_open_fails_at_read(testdata, tmp_path):
    p = tmp_path / "shrinks.lif"
    shutil.copyfile(testdata / XZ, p)
    with tensor_server.open(p) as src:
        t = src.tensors["xz"]
        data = p.read_bytes()
        p.write_bytes(data[: len(data) - 300_000])
        with pytest.raises(UnreadableSource) as info:
            t.get_data()
        assert str(p) in str(info.value)
