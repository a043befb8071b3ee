"""A folder of TIFF planes claimed as a sequence does not hide the other sources beside it,
and an unreadable plane file is named in the folder's reason (issue 12,
medium findings)."""

from __future__ import annotations

import numpy as np

from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.flight.conftest import client_for

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


def test_an_unreadable_plane_file_is_named_in_the_row(tmp_path):
    """The folder stays one source (a plane that exists but cannot be read is not served as
    zeros), and its reason says which file, for the catalog and for a client's query."""
    _planes(tmp_path / "stack", 4, zero_bytes={2})
    cat = Catalog([tmp_path])
    cat.scan()
    (rec,) = cat.records()
    assert rec.type == "tiff-sequence" and not rec.is_resolved
    assert rec.unresolved_reason.startswith("img_z02.tif: cannot read the TIFF header")
    with serving(cat) as srv:
        rows = client_for(srv).query("SELECT unresolved_reason FROM sources").to_pylist()
    assert rows == [{"unresolved_reason": rec.unresolved_reason}]
    cat.close()
