"""An OME-TIFF that ome-writers is still writing (adapters/_ome_tiff_live.py): what is
recognised as an acquisition in progress and what is not, and the count of planes across
the two writes of a close. The acquisition served while it grows is tests/service/
live_ome_tiff_test.py."""

from __future__ import annotations

import shutil
import struct

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


def acquired(path, planes: int) -> None:
    """A closed ome-writers acquisition of ``planes`` 8x8 planes, two channels a time point."""
    from ome_writers import AcquisitionSettings, create_stream, dims_from_standard_axes

    dims = dims_from_standard_axes({"t": None, "c": 2, "y": 8, "x": 8})
    with create_stream(AcquisitionSettings(root_path=str(path), dimensions=dims, dtype="uint8")) as stream:
        for i in range(planes):
            stream.append(plane(i))


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
