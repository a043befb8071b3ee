"""A rescan keeps a source whose tensor grows in place (a live acquisition): reopening would
mint a new content version and drop every cached chunk (catalog/scanning.py ``grew_in_place``)."""

from __future__ import annotations

import numpy as np
import zarr

from tensor_server.catalog import Catalog


def test_a_rescan_keeps_a_source_that_grew_in_place_and_reopens_one_that_changed(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    z = zarr.create_array(str(root / "live.zarr"), shape=(2, 8, 8), chunks=(1, 8, 8), dtype="uint8", zarr_format=2)
    z[:] = 1
    cat = Catalog([root])
    cat.scan()
    aid = cat.records()[0].source_id
    t = cat.find_tensor(aid)[0]
    z.resize((3, 8, 8))
    z[2] = 2
    assert t.refresh_extent() is None and t.shape == (3, 8, 8)
    cat.scan()
    assert cat.find_tensor(aid)[0] is t, "kept: grown in place"
    np.testing.assert_array_equal(t.get_data()[2], np.full((8, 8), 2, np.uint8))
    zarr.create_array(str(root / "live.zarr"), shape=(3, 8, 8), chunks=(1, 8, 8), dtype="uint16", overwrite=True)
    cat.scan()
    reopened = cat.find_tensor(aid)[0]
    assert reopened is not t and reopened.dtype == np.uint16
    assert reopened.extents.sequence == t.extents.sequence + 1, "the sequence goes on across the reopen"
