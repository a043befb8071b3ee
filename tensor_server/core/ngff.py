"""OME-NGFF's vocabulary for writing metadata: axis types and UDUNITS unit names.

One owner for both NGFF writers: the virtual OME-Zarr view (``http/zarr_view.py``) and the
exporter (``export/``). Reading NGFF metadata is ``adapters/_ngff.py``.
"""
from __future__ import annotations

__all__ = ["AXIS_TYPES", "ngff_unit"]

#: canonical axis label -> NGFF axis type
AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}
# NGFF takes UDUNITS names; format metadata may spell units the microscopy way
_NGFF_UNITS = {"µm": "micrometer", "μm": "micrometer", "um": "micrometer", "nm": "nanometer", "mm": "millimeter",
               "Å": "angstrom", "s": "second", "ms": "millisecond", "µs": "microsecond", "min": "minute", "h": "hour"}
_NGFF_UNIT_NAMES = {"angstrom", "attometer", "centimeter", "decimeter", "exameter", "femtometer", "foot", "gigameter",
                    "hectometer", "inch", "kilometer", "megameter", "meter", "micrometer", "mile", "millimeter",
                    "nanometer", "parsec", "petameter", "picometer", "terameter", "yard", "yoctometer", "yottameter",
                    "zeptometer", "zettameter", "attosecond", "centisecond", "day", "decisecond", "exasecond",
                    "femtosecond", "gigasecond", "hectosecond", "hour", "kilosecond", "megasecond", "microsecond",
                    "millisecond", "minute", "nanosecond", "petasecond", "picosecond", "second", "terasecond",
                    "yoctosecond", "yottasecond", "zeptosecond", "zettasecond"}


def ngff_unit(unit: str | None) -> str | None:
    """The NGFF (UDUNITS) name of a unit, or None when NGFF has no name for it."""
    if not unit:
        return None
    name = _NGFF_UNITS.get(unit, unit)
    return name if name in _NGFF_UNIT_NAMES else None
