"""Every TensorAdapter class declares its read granularity, with the reason (design §3).

A wrong declaration is silent (values stay identical, reads cost more), so each class must be
listed here as "block" (read_block_shape is a shape the reader cannot read below) or "none"
(the reader crops cheaply), with why. A new adapter class without a row fails this test.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import tensor_server.adapters
from tensor_server.core.adapter_base import TensorAdapter

READ_BLOCK = {
    "TiffPlaneGridAdapter": (
        "block",
        "base of the folder-of-TIFF formats: declares one strile (strip/tile of the first file) when planes are compressed or tiled, None when raw (a pread of the window's rows costs only those rows)",
    ),
    "TiffSequenceAdapter": (
        "block",
        "compressed/tiled planes: one strile (only the striles a window touches are read and decoded); raw planes: None (pread of the window's rows, mmap stride for decimation)",
    ),
    "MicroManagerLegacyAdapter": (
        "none",
        "MMStack planes are raw and contiguous at the index map's offsets; a window is one pread of its rows (finer than the strile of design §3)",
    ),
    "MicroManagerSequenceAdapter": (
        "none",
        "Micro-Manager writes each plane file raw; its offset is parsed once and a window is one pread of its rows (a compressed file would declare one strile)",
    ),
    "LiveOmeTiffAdapter": (
        "none",
        "an acquisition ome-writers is writing keeps its planes raw at data offset + k x plane bytes; a window is one pread of its rows",
    ),
    "NdTiffAdapter": (
        "none",
        "NDTiff images are raw at the index's byte offsets; a window is one pread of its rows, no dask block involved",
    ),
    "MrcAdapter": ("none", "mrcfile memmap: a crop costs only its own pages, no block to floor the streaming unit at"),
    "DeltaVisionAdapter": ("none", "mrc.DVFile memmap of the planes: a crop costs only its own pages"),
    "NiftiAdapter": (
        "none",
        "nibabel dataobj slicing plans the file read from the slice (fileslice); .nii.gz inflates up to the crop but has no block either",
    ),
    "DicomAdapter": (
        "block",
        "one frame (a WSI tile, one frame of a multi-frame object): pydicom decodes a frame whole to return any of it",
    ),
    "DicomSeriesAdapter": ("block", "one slice file: each slice is a single frame decoded whole"),
    "CziAdapter": (
        "none",
        "a libCZI ROI read composes only the subblocks it touches (no store chunk to floor at); nearest at f>=2 is the zoom= override of get_scaled_data",
    ),
    "TiffPageSeriesAdapter": (
        "block",
        "raw pages: one page (aszarr(chunkmode='page') decodes a page whole and slices the window); compressed pages, read strile by strile: the transfer chunk in whole striles, so units meet on strile edges",
    ),
    "TiffAdapter": (
        "block",
        "as TiffPageSeriesAdapter: one page when raw; compressed (tiled slides, zlib stacks) the transfer chunk in whole striles, each strile decoded once",
    ),
    "LsmAdapter": (
        "block",
        "one page: an LSM page is one Z/T plane with all channels as planar strips (raw as a rule: page mode); compressed, the transfer chunk in whole strips",
    ),
    "OmeTiffAdapter": (
        "block",
        "raw pages: one page (page mode decodes it whole); compressed pages are read strile by strile on all cores: the transfer chunk in whole tiles/strips",
    ),
    "_UrlTiffAdapter": (
        "block",
        "a TIFF at a URL (adapters/_url_tiff.py): as TiffPageSeriesAdapter without the strile reader (it preads a local path): the native chunk, one page in page mode (decoded whole by tifffile's store), one tile in strile mode",
    ),
    "_UrlOmeTiffAdapter": (
        "block",
        "an OME-TIFF at a URL: as _UrlTiffAdapter, the native chunk (a page in page mode, a tile in strile mode)",
    ),
    "Nd2Adapter": (
        "none",
        "read_frame returns an mmap view for uncompressed ND2, so a crop costs its own pages; the seed (a whole C/Y/X frame) would floor every scaled read at the frame",
    ),
    "LifAdapter": (
        "block",
        "one plane: each stored LIF plane is read whole (one contiguous read at the XML byte offset) and Y/X are cropped from it",
    ),
    "Hdf5Adapter": (
        "block",
        "HDF5 runs the filter pipeline on whole chunks, so any read of a chunk decodes all of it: the dataset chunk (None for a virtual dataset, whose sources decide)",
    ),
    "Hdf5ContiguousAdapter": (
        "none",
        "a contiguous/compact HDF5 dataset is raw bytes at one offset; a hyperslab read costs only the bytes it selects",
    ),
    # class name: (classification, reason)
    "B2ndAdapter": (
        "block",
        "the blosc2 chunk: blosc2 decompresses a whole chunk (its blocks in parallel) to return any part of it",
    ),
    "RemoteTensorAdapter": (
        "block",
        "the upstream's transfer chunk: a read of any part fetches whole upstream chunks, so the proxy's grid is the upstream's and nothing below it is cheaper",
    ),
    "ZarrAdapter": (
        "block",
        "the store chunk (a sharded v3 array's inner chunk): zarr decodes a whole chunk to return any of it, and reads only the inner chunks a selection touches",
    ),
    "EncodedZarrAdapter": (
        "block",
        "the store chunk of the codes (a row LUT's index chunk times the row width): zarr decodes whole chunks; None for a broadcast row (np.broadcast_to crops for free), a reference forwards its target's",
    ),
    "ReducedLevel": (
        "none",
        "a level below a stored pyramid's coarsest (core/reduced_level.py): a box reduces its own window of the stored level",
    ),
    "MontageTensor": (
        "none",
        "an HCS plate or a file's positions as one image (core/montage.py): a box is cut out of the images it overlaps, each read at its own blocks",
    ),
    "AxisIndexTensor": (
        "forwards",
        "one position (one p index) of a tensor inside a positions montage: the tensor's own block without the axis",
    ),
    "ArrayAdapter": (
        "none",
        "slicing memory (or a .npy memmap) crops for free; tests may declare a block to exercise the floor",
    ),
    "DamagedStoreTensor": (
        "none",
        "the tombstone of an upload store boot could not adopt: every read is refused, nothing is decoded",
    ),
    "_RaisingAdapter": ("none", "the door suite's ArrayAdapter whose every read raises: it reads nothing"),
    "NormalizingAdapter": ("forwards", "reports the wrapped adapter's block, permuted"),
    "CacheMemberAdapter": (
        "none",
        "a cache:// upload's chunks are stored whole as Arrow batches in mapped segments; a crop slices the mapped batches it overlaps, no decode",
    ),
}


def all_adapter_classes() -> list[type]:
    for mod in pkgutil.iter_modules(tensor_server.adapters.__path__):
        importlib.import_module(f"tensor_server.adapters.{mod.name}")
    importlib.import_module("tensor_server.uploads")  # the readers of uploaded tensors
    importlib.import_module("tensor_server.testing.door_tests")  # the door suite's raising tensor
    seen, stack = [], [TensorAdapter]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("tensor_server.") and sub not in seen:
                seen.append(sub)
    return seen


def test_every_adapter_class_is_classified():
    missing = [c.__name__ for c in all_adapter_classes() if c.__name__ not in READ_BLOCK]
    assert not missing, f"add a READ_BLOCK row (block/none + reason) for: {missing}"


@pytest.mark.parametrize("name", sorted(READ_BLOCK))
def test_rows_have_reasons(name):
    kind, reason = READ_BLOCK[name]
    assert kind in ("block", "none", "forwards") and len(reason) > 20


def test_no_stale_rows():
    names = {c.__name__ for c in all_adapter_classes()}
    assert set(READ_BLOCK) <= names, f"rows for classes that no longer exist: {set(READ_BLOCK) - names}"


def test_declarations_match_behaviour():
    """Checked on instances where a class can be built without a file: ArrayAdapter."""
    import numpy as np

    from tensor_server.adapters.memory import ArrayAdapter
    from tensor_server.core.normalizing import NormalizingAdapter

    assert ArrayAdapter(np.zeros((4, 4))).read_block_shape is None
    t = ArrayAdapter(np.zeros((2, 4, 6)), "zyx", read_block_shape=(1, 2, 3))
    w = NormalizingAdapter(t, (0, 2, 1))
    assert w.read_block_shape == (1, 3, 2)
