"""One owner for unit spelling: units the data carries pass through; units derived from
format metadata use the biopb reference's spelling (SI symbols, ``µm``)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.units import MICROMETER, carried_unit, format_unit


@pytest.mark.parametrize(
    "written, spelled",
    [
        ("micron", "µm"),
        ("um", "µm"),
        ("μm", "µm"),
        ("µm", "µm"),
        ("\\u00B5m", "µm"),
        ("micrometer", "µm"),
        ("Micrometre", "µm"),
        ("nanometer", "nm"),
        ("NM", "nm"),
        ("mm", "mm"),
        ("millimeter", "mm"),
        ("meter", "m"),
        ("Å", "Å"),
        ("angstrom", "Å"),
        ("sec", "s"),
        ("second", "s"),
        ("msec", "ms"),
        ("1/nm", "1/nm"),
        ("1/um", "1/µm"),
        ("hz", "Hz"),
        ("furlong", "furlong"),  # unknown: as written, never guessed at
        ("", None),
        ("  ", None),
        (None, None),
        ("pixel", None),
        ("px", None),  # uncalibrated: no unit
    ],
)
def test_format_units_have_the_reference_spelling(written, spelled):
    assert format_unit(written) == spelled
    assert MICROMETER == "\u00b5m"  # MICRO SIGN, as the reference and OME write it


def test_carried_units_pass_through_unchanged():
    assert carried_unit("micrometer") == "micrometer" and carried_unit("um") == "um"
    assert carried_unit("") is None and carried_unit(None) is None
    t = ArrayAdapter(np.zeros((2, 2, 2)), "zyx", physical_scale=(1, 2, 3), physical_unit=("micrometer", "um", ""))
    assert t.physical_unit == ("micrometer", "um", None)


def test_no_second_unit_table():
    """core and the TIFF adapter used to spell units differently; now neither has a table."""
    import tensor_server.adapters.tiff as tiff
    import tensor_server.core.adapter_base as base

    for mod in (base, tiff):
        assert not hasattr(mod, "normalize_unit") and not hasattr(mod, "_UNIT_ALIASES")
