"""Every TensorAdapter class declares whether it serves nearest as a strided read (design §4).

Rows: "yes" (``decimates = True``; get_decimated_data strides the read), "no", or "per tensor"
(``decimates`` is a property: the TIFF series whose pages are read strile by strile), with why.
Values of decimated reads are checked per adapter by the conformance suite
(``AdapterTests.test_decimated_read``: equals ``get_data(bounds)[::step]`` on ragged,
off-origin bounds) and on real files in each adapter's tests.
"""

from __future__ import annotations

import inspect

import pytest

from tests.adapters.read_block_test import all_adapter_classes

DECIMATES = {
    "TiffPlaneGridAdapter": (
        "yes",
        "the step skips whole plane files on the grid axes and strides rows/columns of raw planes (mmap when the row gap exceeds readahead)",
    ),
    "TiffSequenceAdapter": (
        "yes",
        "frame selection: the step skips whole plane files on c/z/t/...; raw planes stride rows, compressed planes decode only the window's striles then stride",
    ),
    "MicroManagerLegacyAdapter": (
        "yes",
        "the step skips planes on p/t/c/z and strides rows of the raw planes at their index-map offsets",
    ),
    "MicroManagerSequenceAdapter": ("yes", "the step skips plane files on p/t/c/z and strides rows of the raw planes"),
    "LiveOmeTiffAdapter": (
        "yes",
        "the step skips planes on t/c/z and strides rows of the raw planes at their offsets in the acquisition",
    ),
    "NdTiffAdapter": (
        "yes",
        "the step skips images on the index axes and mosaic tiles, and strides rows of the raw frames",
    ),
    "MrcAdapter": (
        "yes",
        "memmap indexing with a step (data[a:b:s, ...]) touches only the picked rows, copied inside the handle's use()",
    ),
    "DeltaVisionAdapter": ("yes", "memmap indexing with a step over the DV planes touches only the picked rows"),
    "NiftiAdapter": (
        "yes",
        "dataobj[a:b:s, ...]: nibabel plans the strided read from the slice (.nii.gz still inflates the stream, saving memory not decode)",
    ),
    "DicomAdapter": (
        "yes",
        "the step selects frames (multi-frame, focal planes, optical paths) and skips WSI tiles holding no picked pixel; Y/X strided inside a decoded frame",
    ),
    "DicomSeriesAdapter": (
        "yes",
        "the step on z skips whole slice files (never decoded), like LifAdapter's plane skipping; Y/X strided inside a decoded slice",
    ),
    "CziAdapter": (
        "yes",
        "libCZI read(zoom=1/f) picks exactly data[::f, ::f] where the gate holds (same Y/X factor, other axes 1, f divides the extent, no stored pyramid); it declines with None elsewhere and the engine streams",
    ),
    "TiffPageSeriesAdapter": (
        "per tensor",
        "compressed pages are read strile by strile: the step picks from each decoded strile straight into the output (no page buffer); pages stored raw are not (a property says which)",
    ),
    "TiffAdapter": (
        "per tensor",
        "as TiffPageSeriesAdapter: compressed pages stride each decoded strile into the output, raw pages decline",
    ),
    "LsmAdapter": (
        "per tensor",
        "as TiffPageSeriesAdapter: compressed planes stride each decoded strip, raw (the usual LSM) decline",
    ),
    "OmeTiffAdapter": (
        "per tensor",
        "as TiffPageSeriesAdapter: compressed pages stride each decoded tile into the output, raw pages decline",
    ),
    "_UrlTiffAdapter": (
        "per tensor",
        "a TIFF at a URL: the property of TiffPageSeriesAdapter, always false here (the strile reader preads a local path): the engine streams",
    ),
    "_UrlOmeTiffAdapter": (
        "per tensor",
        "an OME-TIFF at a URL: as _UrlTiffAdapter, the property is false (no strile reader for a URL): the engine streams",
    ),
    "Nd2Adapter": (
        "yes",
        "the step selects only the frames on the step along T/P/Z and strides the mmap view inside each frame",
    ),
    "LifAdapter": (
        "yes",
        "its block is one plane: the step skips whole planes on T/C/Z/M/wavelength axes, Y/X stride a plane read whole",
    ),
    "Hdf5Adapter": (
        "no",
        "chunked HDF5: a strided hyperslab measured 2-45x slower than reading whole chunks (256² chunks step 8: 46 vs 24 ms; plane-axis stride on (1,1024,1024) chunks: 913 vs 20 ms), and a chunk decodes whole anyway",
    ),
    "Hdf5ContiguousAdapter": (
        "yes",
        "hyperslab strided on all but the innermost axis reads only the picked rows: 64 MiB contiguous, step 8: 4.3 vs 12.5 ms streamed, step 32: 0.6 vs 11.8 ms, step 2: equal",
    ),
    # class name: (yes/no, reason)
    "B2ndAdapter": (
        "no",
        "quantized: blosc2 decompresses a whole chunk to return any of it, so a stride inside it saves only a memcpy",
    ),
    "RemoteTensorAdapter": (
        "no",
        "an upstream server's tensor: nearest is one of the reductions it declares with reduces (get_reduced_data), computed upstream next to the data",
    ),
    "ZarrAdapter": (
        "yes",
        "a local store's chunks are decoded on every core and each is strided into the output as it is decoded (no full-resolution buffer); declines (None) where zarr-python reads",
    ),
    "EncodedZarrAdapter": (
        "yes",
        "decoding (a LUT gather, a per-element exp) costs several times the chunk read, so nearest decodes only the picked codes; a broadcast row is a strided view",
    ),
    "ReducedLevel": (
        "no",
        "a level below a stored pyramid's coarsest is served as a stored level (precompute): its pixels are one reduction of the stored level, never strided",
    ),
    "MontageTensor": (
        "no",
        "an HCS plate or a file's positions as one image: its coarse levels are the fields' stored levels, else streamed reductions over the images it overlaps",
    ),
    "AxisIndexTensor": (
        "no",
        "one position of a tensor, only read inside a positions montage, which streams its coarse levels (it never asks a tile for a strided read)",
    ),
    "ArrayAdapter": ("no", "memory slicing already costs only the bytes copied; streaming nearest is as cheap"),
    "DamagedStoreTensor": (
        "no",
        "the tombstone of an upload store boot could not adopt: every read is refused, nothing to stride",
    ),
    "_RaisingAdapter": ("no", "the door suite's tensor whose every read raises one error class: nothing to stride"),
    "NormalizingAdapter": ("forwards", "decimates exactly when the wrapped adapter does"),
    "CacheMemberAdapter": (
        "no",
        "a cache:// upload's chunk is one mapped Arrow batch: a stride inside it saves only a memcpy",
    ),
}


def test_every_adapter_class_is_classified():
    missing = [c.__name__ for c in all_adapter_classes() if c.__name__ not in DECIMATES]
    assert not missing, f"add a DECIMATES row (yes/no + reason) for: {missing}"


@pytest.mark.parametrize("cls", all_adapter_classes(), ids=lambda c: c.__name__)
def test_flag_matches_the_row(cls):
    kind, reason = DECIMATES[cls.__name__]
    assert len(reason) > 20
    if kind == "forwards":
        return
    if kind == "per tensor":  # a property: whether this tensor's pages can be strided
        assert isinstance(inspect.getattr_static(cls, "decimates"), property), f"{cls.__name__}.decimates is fixed"
        kind = "yes"
    else:
        assert bool(cls.decimates) == (kind == "yes"), f"{cls.__name__}.decimates disagrees with its row"
    # an adapter class (or an adapter base it inherits from) must override the method
    overrides = any(
        "get_decimated_data" in vars(c) for c in cls.__mro__ if c.__module__.startswith("tensor_server.adapters")
    )
    assert overrides == (kind == "yes"), (
        f"{cls.__name__}: decimates={cls.decimates} but get_decimated_data override={overrides}"
    )
