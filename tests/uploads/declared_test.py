"""What add_tensor refuses in a declaration before anything is allocated, and what it makes of
the rest (``uploads/declared.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tensor_server.errors import InvalidArgument
from tensor_server.uploads.declared import (
    checked_dim_labels,
    checked_dtype,
    checked_metadata,
    checked_ttl,
    label_set_dim_labels,
    write_grid,
)
from tensor_server.uploads.names import parse_upload_id

REQ = "zarr://scratch/@fields/x"


def test_a_dtype_is_a_little_endian_numeric_one():
    assert checked_dtype("<u2", REQ) == np.dtype(np.uint16)
    with pytest.raises(InvalidArgument, match="'nope' is not a numpy dtype"):
        checked_dtype("nope", REQ)
    with pytest.raises(InvalidArgument, match="dtype >u2 is not a little-endian numeric dtype"):
        checked_dtype(">u2", REQ)
    with pytest.raises(InvalidArgument, match="dtype \\|O is not a little-endian numeric dtype"):
        checked_dtype(object, REQ)


def test_dim_labels_are_lower_cased_and_one_per_axis():
    assert checked_dim_labels(["Y", "X"], 2, REQ) == ("y", "x")
    assert checked_dim_labels((), 3, REQ) == ()
    with pytest.raises(InvalidArgument, match="1 dim_labels for a 2-D tensor"):
        checked_dim_labels(["x"], 2, REQ)


def test_metadata_is_refused_but_a_label_sets_image_label_block():
    assert checked_metadata(parse_upload_id(REQ), "", REQ) == {}
    label_set = parse_upload_id("zarr://src/@labels/cells")
    assert checked_metadata(label_set, '{"image-label": {"version": "0.4"}}', REQ) == {
        "image-label": {"version": "0.4"}
    }
    with pytest.raises(InvalidArgument, match="metadata is the source's"):
        checked_metadata(parse_upload_id(REQ), '{"image-label": {}}', REQ)


def test_a_lifetime_is_positive_or_unset():
    checked_ttl(None, REQ)
    checked_ttl(5, REQ)
    with pytest.raises(InvalidArgument, match="ttl_seconds must be positive"):
        checked_ttl(0, REQ)


def test_a_label_set_covers_its_image_with_or_without_channels():
    image = SimpleNamespace(shape=(3, 40, 30), dim_labels=("c", "y", "x"), array_id="src/img")
    assert label_set_dim_labels(image, (3, 40, 30), REQ) == ("c", "y", "x")
    assert label_set_dim_labels(image, (40, 30), REQ) == ("y", "x")
    with pytest.raises(InvalidArgument, match=r"must have shape \[3, 40, 30\] or \[40, 30\], not \[40, 31\]"):
        label_set_dim_labels(image, (40, 31), REQ)


def test_the_write_grid_is_the_declared_one_cut_to_the_shape_and_under_the_ceiling():
    cache = parse_upload_id("cache://scratch/@fields/x")
    u16 = np.dtype(np.uint16)
    assert write_grid(cache, (100, 50), (64, 64), u16, (), REQ) == (64, 50)
    with pytest.raises(InvalidArgument, match=r"chunk_shape \[6000, 6000\] is above the 64 MiB limit"):
        write_grid(cache, (6000, 6000), (6000, 6000), u16, (), REQ)
