"""One owner for unit spelling: every unit a tensor has, whether the data carries it or the
server derives it from format metadata, is spelled the biopb reference's way (SI symbols,
``µm``); NGFF documents name the symbol back (``micrometer``)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.ngff import ngff_unit
from tensor_server.core.units import MICROMETER, canonical_unit


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
def test_units_have_the_reference_spelling(written, spelled):
    assert canonical_unit(written) == spelled
    assert MICROMETER == "\u00b5m"  # MICRO SIGN, as the reference and OME write it


def test_units_the_data_carries_are_spelled_the_same_way():
    """An OME-Zarr axis's ``micrometer`` and an ImageJ ``um`` are one unit, so one string."""
    t = ArrayAdapter(
        np.zeros((2, 2, 2, 2)), "tzyx", physical_scale=(1, 1, 2, 3), physical_unit=("second", "micrometer", "um", "")
    )
    assert t.physical_unit == ("s", "µm", "µm", None)


@pytest.mark.parametrize(
    "unit, name",
    [
        ("µm", "micrometer"),
        ("micrometer", "micrometer"),
        ("um", "micrometer"),
        ("nm", "nanometer"),
        ("mm", "millimeter"),
        ("cm", "centimeter"),
        ("m", "meter"),
        ("Å", "angstrom"),
        ("s", "second"),
        ("ms", "millisecond"),
        ("µs", "microsecond"),
        ("min", "minute"),
        ("h", "hour"),
        ("kilometer", "kilometer"),
        ("Hz", None),  # NGFF has no name for it: the axis goes without a unit
        ("furlong", None),
        (None, None),
    ],
)
def test_ngff_documents_name_each_symbol_as_udunits_does(unit, name):
    assert ngff_unit(unit) == name


def test_no_second_unit_table():
    """core and the TIFF adapter used to spell units differently; now neither has a table."""
    import tensor_server.adapters.tiff as tiff
    import tensor_server.core.adapter_base as base

    for mod in (base, tiff):
        assert not hasattr(mod, "normalize_unit") and not hasattr(mod, "_UNIT_ALIASES")


def test_the_spelling_is_a_fixed_point():
    """``TensorInfo`` spells what an adapter already spelled: doing it twice changes nothing."""
    from tensor_server.core import units

    symbols = {v for k, v in vars(units).items() if k.isupper() and isinstance(v, str)} | set(units._SYMBOL.values())
    assert {canonical_unit(s) for s in symbols} == symbols
