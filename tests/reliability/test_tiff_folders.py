"""A folder of TIFF planes claimed as a sequence does not hide the other sources beside it,
and one unreadable plane file is named instead of making the folder unreadable (issue 12,
medium findings)."""
from __future__ import annotations

import numpy as np
import pytest

from tensor_server.catalog import Catalog

PLANE = np.arange(20 * 30, dtype=np.uint16).reshape(20, 30)


def _planes(folder, n, zero_bytes=()):
    import tifffile

    folder.mkdir(parents=True, exist_ok=True)
    for z in range(n):
        path = folder / f"img_z{z:02d}.tif"
        if z in zero_bytes:
            path.write_bytes(b"")
        else:
            tifffile.imwrite(path, PLANE + z)


def _write_czi(path):
    from pylibCZIrw import czi as pyczi

    with pyczi.create_czi(str(path), exist_ok=True) as doc:
        doc.write(data=(PLANE[..., None] % 255).astype(np.uint8), plane={"C": 0, "Z": 0, "T": 0})


def test_sources_beside_a_tiff_sequence_are_served(tmp_path):
    import mrcfile

    seq = tmp_path / "stack"
    _planes(seq, 3)
    with mrcfile.new(seq / "density.map") as m:
        m.set_data(np.ones((4, 5, 6), np.float32))
    _write_czi(seq / "scan.czi")
    _planes(seq / "nested", 2)  # a sequence in a sub-folder of a sequence
    cat = Catalog([tmp_path])
    cat.scan()
    got = {r.path.relative_to(tmp_path).as_posix(): r for r in cat.records()}
    assert set(got) == {"stack", "stack/density.map", "stack/scan.czi", "stack/nested"}
    assert all(r.is_resolved for r in got.values())
    assert got["stack"].type == "tiff-sequence" and got["stack"].source.tensor().shape == (3, 20, 30)
    np.testing.assert_array_equal(got["stack"].source.tensor().get_data()[2], PLANE + 2)
    assert got["stack/density.map"].source.tensor().shape == (4, 5, 6)
    assert got["stack/scan.czi"].type == "czi"
    assert got["stack/nested"].source.tensor().shape == (2, 20, 30)
    cat.close()


def test_one_empty_tif_is_named_and_the_other_planes_still_serve(tmp_path):
    seq = tmp_path / "stack"
    _planes(seq, 4, zero_bytes={2})
    cat = Catalog([tmp_path])
    cat.scan()
    (rec,) = cat.records()
    assert rec.is_resolved and rec.type == "tiff-sequence"
    meta = rec.source.metadata
    assert list(meta["unreadable_files"]) == ["img_z02.tif"]
    t = rec.source.tensor()
    data = t.get_data()
    assert data.shape == (4, 20, 30) and t.metadata["missing_planes"] == 1
    for z in (0, 1, 3):
        np.testing.assert_array_equal(data[z], PLANE + z)
    cat.close()


def test_a_folder_of_only_unreadable_tifs_names_them(tmp_path):
    seq = tmp_path / "stack"
    _planes(seq, 2, zero_bytes={0, 1})
    cat = Catalog([tmp_path])
    cat.scan()
    (rec,) = cat.records()
    assert not rec.is_resolved
    assert "img_z00.tif" in rec.unresolved_reason and "img_z01.tif" in rec.unresolved_reason
    cat.close()
