"""An OME-TIFF that ome-writers is still writing (adapters/_ome_tiff_live.py): what is
recognised as an acquisition in progress and what is not, and the count of planes across
the two writes of a close. The acquisition served while it grows is tests/service/
live_ome_tiff_test.py."""

from __future__ import annotations

import shutil
import struct
import time

import numpy as np
import pytest
import tifffile

import tensor_server
from tensor_server.adapters._ome_tiff_live import LiveOmeTiffAdapter, live_layout
from tensor_server.adapters.ome_tiff import OmeTiffSource
from tensor_server.testing import AdapterTests

pytest.importorskip("ome_writers")


def plane(i: int) -> np.ndarray:
    return (np.arange(64, dtype=np.uint8).reshape(8, 8) + 3 * i).astype(np.uint8)


def settings(path, compression: str = "none"):
    from ome_writers import AcquisitionSettings, dims_from_standard_axes

    dims = dims_from_standard_axes({"t": None, "c": 2, "y": 8, "x": 8})
    return AcquisitionSettings(root_path=str(path), dimensions=dims, dtype="uint8", compression=compression)


def acquired(path, planes: int, compression: str = "none") -> None:
    """A closed ome-writers acquisition of ``planes`` 8x8 planes, two channels a time point."""
    from ome_writers import create_stream

    with create_stream(settings(path, compression)) as stream:
        for i in range(planes):
            stream.append(plane(i))


def as_while_acquiring(path) -> None:
    """A closed compressed acquisition's OME-XML put back as ome-writers writes it until the
    close: one time point (its IFDs, one a plane, are as they were while acquiring)."""
    with tifffile.TiffFile(path) as tf:
        xml = tf.ome_metadata
    start = xml.index('SizeT="')
    xml = xml[:start] + 'SizeT="1"' + xml[xml.index('"', start + 7) + 1 :]
    start = xml.index('PlaneCount="')
    xml = xml[:start] + 'PlaneCount="2"' + xml[xml.index('"', start + 12) + 1 :]
    tifffile.tiffcomment(path, xml.encode())


def pages_on_disk(path, at_least: int) -> None:
    """Wait until ``at_least`` pages are on disk (ome-writers' thread writes behind ``append``)."""
    for _ in range(3000):
        try:
            with tifffile.TiffFile(path) as tf:
                if len(tf.pages) >= at_least:
                    return
        except Exception:  # nothing parseable yet
            pass
        time.sleep(0.01)
    raise AssertionError(f"{at_least} pages never reached the disk")


def unlink_the_chain(path) -> None:
    """The file as a look between the close's two writes finds it: the other pages' IFDs
    written after the pixels, the first IFD's next pointer not yet set to them."""
    with tifffile.TiffFile(path) as tf:
        assert tf.is_bigtiff and len(tf.pages) > 1
        at = tf.pages.first.offset
    with open(path, "r+b") as fh:
        fh.seek(at)
        (entries,) = struct.unpack("<Q", fh.read(8))
        fh.seek(at + 8 + entries * 20)
        fh.write(bytes(8))


def test_a_closed_acquisition_is_a_finished_file(tmp_path):
    path = tmp_path / "a.ome.tif"
    acquired(path, 6)
    tensor = OmeTiffSource(path).tensor()
    assert not isinstance(getattr(tensor, "inner", tensor), LiveOmeTiffAdapter)
    assert (tensor.shape, tensor.dim_labels) == ((3, 2, 8, 8), ("t", "c", "y", "x"))


def test_the_ifds_of_a_close_not_yet_linked_are_not_counted_as_planes(tmp_path):
    """The chain of 5 IFDs spans many 64-byte planes: counted from the size, it would be
    served as time points of IFD bytes."""
    path = tmp_path / "a.ome.tif"
    acquired(path, 6)
    unlink_the_chain(path)
    with tifffile.TiffFile(path) as tf:
        layout = live_layout(path, tf, tf.ome_metadata)
    assert layout is not None
    assert (path.stat().st_size - layout.data_offset) // layout.plane_bytes > 6 + 2, "the chain spans planes"
    assert (layout.labels, layout.sizes) == (("t", "c"), (3, 2))
    tensor = OmeTiffSource(path).tensor()
    assert tensor.shape == (3, 2, 8, 8)
    np.testing.assert_array_equal(tensor.get_data().reshape(6, 8, 8), np.stack([plane(i) for i in range(6)]))


def test_the_close_linking_the_chain_ends_growth_at_the_same_extent(tmp_path):
    path = tmp_path / "a.ome.tif"
    acquired(path, 7)  # the last time point has one channel: not published, before or after
    closed = path.read_bytes()
    unlink_the_chain(path)
    tensor = OmeTiffSource(path).tensor()
    version = tensor.content_version
    assert tensor.shape == (3, 2, 8, 8)
    path.write_bytes(closed)  # the second write of the close (same file, same inode)
    assert tensor.refresh_extent() is None
    live = getattr(tensor, "inner", tensor)
    assert live.closed and tensor.shape == (3, 2, 8, 8) and tensor.content_version == version
    assert tensor.extents.sequence == 0, "a close is not growth"


def test_a_single_plane_ome_tiff_with_its_xml_after_the_pixels_is_not_an_acquisition(tmp_path):
    """Bytes past the one plane that the IFD points at (a rewritten, longer OME-XML) are not
    frames."""
    path = tmp_path / "one.ome.tif"
    tifffile.imwrite(path, plane(0), ome=True)
    with tifffile.TiffFile(path) as tf:
        xml = tf.ome_metadata
    tifffile.tiffcomment(path, xml.replace("</OME>", "<!--" + "x" * 4096 + "--></OME>").encode())
    with tifffile.TiffFile(path) as tf:
        assert (
            len(tf.pages) == 1 and tf.pages.first.tags["ImageDescription"].valueoffset > tf.pages.first.dataoffsets[0]
        )
        assert live_layout(path, tf, tf.ome_metadata) is None
    tensor = OmeTiffSource(path).tensor()
    assert tensor.shape == (8, 8)
    np.testing.assert_array_equal(tensor.get_data(), plane(0))


def test_a_replaced_file_is_not_growth(tmp_path):
    path = tmp_path / "a.ome.tif"
    acquired(path, 6)
    unlink_the_chain(path)
    tensor = OmeTiffSource(path).tensor()
    other = tmp_path / "b.ome.tif"
    shutil.copy(path, other)
    other.replace(path)  # another inode in its place
    assert "rewritten" in (tensor.refresh_extent() or "")


class TestAcquisitionInProgress(AdapterTests):
    """The conformance suite over an acquisition as a look finds it mid-write: 7 planes of two
    channels (3 complete time points), the IFDs of the close written but not yet linked."""

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "a.ome.tif"
        acquired(path, 7)
        unlink_the_chain(path)
        src = tensor_server.open(path)
        assert isinstance(getattr(src.tensor(), "inner", src.tensor()), LiveOmeTiffAdapter)
        yield src
        src.close()

    def reference_array(self, source, field):
        return np.stack([plane(i) for i in range(6)]).reshape(3, 2, 8, 8)


def test_a_compressed_acquisition_grows_by_its_new_ifds_and_its_close_keeps_the_shape(tmp_path):
    """An IFD a plane (lzw): a look reads the IFDs written since the last; a time point of one
    channel is not published; the close (the OME-XML rewritten) changes nothing served."""
    from ome_writers import create_stream

    path = tmp_path / "a.ome.tif"
    stream = create_stream(settings(path, "lzw"))
    try:
        for i in range(4):
            stream.append(plane(i))
        pages_on_disk(path, 4)
        tensor = OmeTiffSource(path).tensor()
        version = tensor.content_version
        assert (tensor.shape, tensor.dim_labels) == ((2, 2, 8, 8), ("t", "c", "y", "x"))
        for i in range(4, 7):
            stream.append(plane(i))
        pages_on_disk(path, 7)
        assert tensor.refresh_extent() is None and tensor.shape == (3, 2, 8, 8)
        assert tensor.extents.sequence == 1
    finally:
        stream.close()
    assert tensor.refresh_extent() is None
    assert (tensor.shape, tensor.content_version, tensor.extents.sequence) == ((3, 2, 8, 8), version, 1)
    np.testing.assert_array_equal(tensor.get_data().reshape(6, 8, 8), np.stack([plane(i) for i in range(6)]))


def test_an_ifd_linked_before_it_is_written_is_not_a_plane(tmp_path):
    """tifffile links the previous IFD to the new one's place before it writes it: zeros (or
    nothing) there are not a page."""
    path = tmp_path / "a.ome.tif"
    acquired(path, 6, "lzw")
    as_while_acquiring(path)
    with tifffile.TiffFile(path) as tf:
        last = tf.pages[-1].offset
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(last)
        (entries,) = struct.unpack("<Q", fh.read(8))
        fh.seek(last + 8 + entries * 20)
        fh.write(struct.pack("<Q", size + size % 2))
        fh.seek(0, 2)
        fh.write(bytes(size % 2 + 400))  # the hole the IFD will be written into
    tensor = OmeTiffSource(path).tensor()
    assert isinstance(getattr(tensor, "inner", tensor), LiveOmeTiffAdapter)
    assert tensor.shape == (3, 2, 8, 8)
    np.testing.assert_array_equal(tensor.get_data().reshape(6, 8, 8), np.stack([plane(i) for i in range(6)]))


class TestCompressedAcquisitionInProgress(AdapterTests):
    """The conformance suite over a compressed acquisition (an IFD a plane) as ome-writers
    leaves it before the close: 7 planes of two channels, the OME-XML saying one time point."""

    @pytest.fixture
    def source(self, tmp_path):
        path = tmp_path / "a.ome.tif"
        acquired(path, 7, "lzw")
        as_while_acquiring(path)
        src = tensor_server.open(path)
        live = getattr(src.tensor(), "inner", src.tensor())
        assert isinstance(live, LiveOmeTiffAdapter) and live.layout.decoder is not None
        yield src
        src.close()

    def reference_array(self, source, field):
        return np.stack([plane(i) for i in range(6)]).reshape(3, 2, 8, 8)
