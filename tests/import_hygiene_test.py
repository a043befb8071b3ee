"""`import tensor_server` must stay light: no numba, no Flight, no format library.

Checked in a fresh interpreter so modules other tests imported cannot hide a regression.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = [
    "numba",
    "llvmlite",
    "pyarrow.flight",
    "zarr",
    "tifffile",
    "h5py",
    "nd2",
    "pylibCZIrw",
    "readlif",
    "mrcfile",
    "nibabel",
    "pydicom",
    "duckdb",
    "imagecodecs",
]


@pytest.mark.parametrize("module", ["tensor_server", "tensor_server.core", "tensor_server.adapters"])
def test_import_is_light(module: str) -> None:
    code = (
        "import json, sys\n"
        f"import {module}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"import {module} pulled in {loaded}"


def test_hygiene_check_can_fail() -> None:
    """The probe itself sees a heavy import (so the test above is not vacuous)."""
    code = "import sys, json, numba; print(json.dumps('numba' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip()) is True
