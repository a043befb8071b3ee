"""Servers for the viewer-door tests: in-process HTTP front ends over in-memory catalogs."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tests.http.conftest import http_serving


def validator_squares() -> np.ndarray:
    """The IIIF validator's test image: 10×10 squares of 100 px, colours from its own code
    (``colorInfo[x][y]`` is the square in column x, row y)."""
    from iiif_validator.validator import ValidationInfo

    colours = np.asarray(ValidationInfo().colorInfo, np.uint8)  # (x, y, 3)
    return np.repeat(np.repeat(colours.transpose(1, 0, 2), 100, axis=0), 100, axis=1)  # (y, x, 3)


def memory_catalog(**arrays: ArrayAdapter) -> Catalog:
    cat = Catalog([])
    for sid, adapter in arrays.items():
        cat.add_source(MemorySource(adapter, source_id=sid))
    cat.first_scan_done.set()
    return cat


@contextmanager
def serving_arrays(tmp_path, token=None, **arrays: ArrayAdapter):
    """A server of ``arrays`` whose HTTP door is a public image service: any origin may read
    (``--cors-origin '*'``), as the IIIF validator (and IIIF viewers) expect."""
    from tensor_server.http.security import HttpSecurity

    cat = memory_catalog(**arrays)
    with http_serving(cat, tmp_path, token=token, security=HttpSecurity.build(cors_origins=["*"])) as (srv, http):
        yield cat, http
