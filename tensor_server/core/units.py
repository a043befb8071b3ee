"""Physical units: the one owner of how a unit is spelled by the server.

Every unit a tensor has, whatever wrote it (an OME-Zarr axis ``unit`` such as
``micrometer``, an HDF5 ``units`` attribute, OME-XML ``PhysicalSizeXUnit``, TIFF resolution
tags, ImageJ ``unit=micron``, CZI, ND2, LIF, DeltaVision, MRC, NIfTI ``xyzt_units``, DICOM
spacing, Micro-Manager summaries, a unit given to an in-memory tensor, an upstream server's
descriptor) is spelled one way, the biopb reference server's: SI symbols, ``µm`` (U+00B5)
rather than ``micrometer`` / ``um`` / ``micron`` (``canonical_unit``, applied once where a
tensor's record is built, ``core.adapter_base.TensorInfo``). So the Flight descriptor, SQL
rows, the catalog page and its JSON, and every viewer show the same string for the same
unit. A unit not in the table passes through as written (never guessed at); "pixel" and
blank mean no physical unit.

The one exception is a document whose format names units itself: an OME-NGFF ``axes``
entry must use the UDUNITS name (``micrometer``), so ``core.ngff.ngff_unit`` maps the
symbol back to that name when the server writes NGFF (the HTTP OME-Zarr view, the export).
"""

from __future__ import annotations

__all__ = [
    "MICROMETER",
    "NANOMETER",
    "MILLIMETER",
    "METER",
    "ANGSTROM",
    "SECOND",
    "MILLISECOND",
    "MICROSECOND",
    "HERTZ",
    "canonical_unit",
]

MICROMETER = "µm"
NANOMETER = "nm"
MILLIMETER = "mm"
METER = "m"
ANGSTROM = "Å"
SECOND = "s"
MILLISECOND = "ms"
MICROSECOND = "µs"
HERTZ = "Hz"

# every spelling formats are known to write -> the symbol; matched case-sensitively first
# (``Å`` and ``m`` are not ``å`` and ``M``), then lower-cased
_SYMBOL = {
    "µm": MICROMETER,
    "μm": MICROMETER,
    "\\u00b5m": MICROMETER,
    "um": MICROMETER,
    "micron": MICROMETER,
    "microns": MICROMETER,
    "micrometer": MICROMETER,
    "micrometre": MICROMETER,
    "micrometers": MICROMETER,
    "micrometres": MICROMETER,
    "nm": NANOMETER,
    "nanometer": NANOMETER,
    "nanometre": NANOMETER,
    "nanometers": NANOMETER,
    "mm": MILLIMETER,
    "millimeter": MILLIMETER,
    "millimetre": MILLIMETER,
    "millimeters": MILLIMETER,
    "cm": "cm",
    "centimeter": "cm",
    "centimetre": "cm",
    "m": METER,
    "meter": METER,
    "metre": METER,
    "meters": METER,
    "pm": "pm",
    "picometer": "pm",
    "å": ANGSTROM,
    "Å": ANGSTROM,
    "a": ANGSTROM,
    "ang": ANGSTROM,
    "angstrom": ANGSTROM,
    "angstroms": ANGSTROM,
    "s": SECOND,
    "sec": SECOND,
    "second": SECOND,
    "seconds": SECOND,
    "ms": MILLISECOND,
    "msec": MILLISECOND,
    "millisecond": MILLISECOND,
    "milliseconds": MILLISECOND,
    "µs": MICROSECOND,
    "μs": MICROSECOND,
    "us": MICROSECOND,
    "usec": MICROSECOND,
    "microsecond": MICROSECOND,
    "min": "min",
    "minute": "min",
    "minutes": "min",
    "h": "h",
    "hour": "h",
    "hours": "h",
    "hz": HERTZ,
    "hertz": HERTZ,
    "ev": "eV",
    "electronvolt": "eV",
    "1/nm": "1/nm",
    "nm^-1": "1/nm",
    "1/nanometer": "1/nm",
    "1/um": "1/µm",
    "um^-1": "1/µm",
    "µm^-1": "1/µm",
    "1/µm": "1/µm",
    "1/micrometer": "1/µm",
    "1/a": "1/Å",
    "a^-1": "1/Å",
    "å^-1": "1/Å",
    "1/å": "1/Å",
    "1/angstrom": "1/Å",
}


#: what uncalibrated files write where a unit would be: no physical size at all
_NOT_A_UNIT = frozenset({"pixel", "pixels", "px", "none"})


def canonical_unit(unit: object) -> str | None:
    """The one spelling of a unit (SI symbol, ``µm``); None for a blank one or a "pixel"
    unit (uncalibrated). A unit not in the table passes through as written (never guessed
    at)."""
    if unit is None:
        return None
    text = str(unit).strip()
    if not text or text.lower() in _NOT_A_UNIT:
        return None
    return _SYMBOL.get(text) or _SYMBOL.get(text.lower()) or text
