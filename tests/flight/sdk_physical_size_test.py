"""Physical pixel sizes as the biopb SDK reads them (``get_physical_scale``): what a viewer
(the Tensor Browser in napari) multiplies every layer by, so one wrong size shrinks or grows
an image against its neighbours.

A TIFF resolution tag is a pixel size only when it is not a default: programs that know
none write 72 dpi (25400/72 = 352.78 µm pixels) or a resolution of 1 with no unit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.flight.conftest import client_for


@pytest.fixture(scope="module")
def tiffs(tmp_path_factory):
    import tifffile

    root = tmp_path_factory.mktemp("tiffs")
    plane = np.zeros((32, 48), np.uint16)
    for name in ("dpi72", "dpi72_in_cm", "one_no_unit", "per_cm", "dpi300", "ij_inch", "ij_micron"):
        (root / name).mkdir()  # one folder each: files of one shape side by side are one sequence
    tifffile.imwrite(root / "dpi72" / "dpi72.tif", plane, resolution=(72, 72), resolutionunit="INCH")
    tifffile.imwrite(
        root / "dpi72_in_cm" / "dpi72_in_cm.tif", plane, resolution=(72 / 2.54, 72 / 2.54), resolutionunit="CENTIMETER"
    )
    tifffile.imwrite(root / "one_no_unit" / "one_no_unit.tif", plane, resolution=(1, 1), resolutionunit="NONE")
    tifffile.imwrite(root / "per_cm" / "per_cm.tif", plane, resolution=(10000, 10000), resolutionunit="CENTIMETER")
    tifffile.imwrite(root / "dpi300" / "dpi300.tif", plane, resolution=(300, 300), resolutionunit="INCH")
    # ImageJ carries a 72-dpi default over as a calibration in inches; a real one wins
    tifffile.imwrite(
        root / "ij_inch" / "ij_inch.tif", plane, imagej=True, resolution=(72, 72), metadata={"unit": "inch"}
    )
    tifffile.imwrite(
        root / "ij_micron" / "ij_micron.tif", plane, imagej=True, resolution=(4, 4), metadata={"unit": "micron"}
    )
    cat = Catalog([root])
    cat.scan()
    with serving(cat) as srv:
        client = client_for(srv)
        yield {r.url.rsplit("/", 1)[-1]: r.source_id for r in cat.records()}, client
    cat.close()


@pytest.mark.parametrize("name", ["dpi72.tif", "dpi72_in_cm.tif", "one_no_unit.tif", "ij_inch.tif"])
def test_a_default_resolution_tag_is_no_physical_size(tiffs, name):
    ids, client = tiffs
    assert client.get_physical_scale(ids[name]) is None


@pytest.mark.parametrize("name, size", [("per_cm.tif", 1.0), ("dpi300.tif", 25400 / 300), ("ij_micron.tif", 0.25)])
def test_a_set_resolution_tag_is_the_pixel_size(tiffs, name, size):
    ids, client = tiffs
    scale, unit = client.get_physical_scale(ids[name])
    np.testing.assert_allclose(scale, [size, size])
    assert unit == ["µm", "µm"]
