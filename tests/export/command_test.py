"""The ``export`` command stays light: a local export (TIFF and zarr sources, every level
reduced) never imports numba, llvmlite or scipy (export/reduce.py reduces in NumPy), nor the
server's Flight, HTTP, napari or dask stacks — measured in a fresh interpreter, where no other
test's imports can hide one; the same probe sees numba once a label image needs ``mode``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import tifffile
import zarr

from tests.export.helpers import REPO

HEAVY = ["numba", "llvmlite", "scipy", "pyarrow", "grpc", "dask", "napari", "starlette", "uvicorn", "duckdb"]

_PROBE = """
import json, sys
from tensor_server.cli import main
code = main(["export", sys.argv[1], sys.argv[2], "--levels", "3", "--progress", "none"])
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[3])))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _probe(src, dest) -> dict:
    env = {"PYTHONPATH": f"{REPO}:{REPO / 'kernels'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(src), str(dest), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_local_export_imports_neither_numba_nor_the_server_stack(tmp_path):
    vol = np.random.default_rng(1).integers(0, 60000, (3, 300, 260), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "v.ome.tif", vol, tile=(128, 128), metadata={"axes": "ZYX"}, ome=True)
    zarr.create_array(str(tmp_path / "p.zarr"), data=vol[0], chunks=(128, 128))
    for name in ("v.ome.tif", "p.zarr"):
        got = _probe(tmp_path / name, tmp_path / f"{name}.out.zarr")
        assert got == {"code": 0, "heavy": []}, name
        np.testing.assert_array_equal(
            zarr.open_array(str(tmp_path / f"{name}.out.zarr" / "0"))[...], vol if name == "v.ome.tif" else vol[0]
        )


def test_the_probe_sees_numba_when_labels_need_mode(tmp_path):
    from tensor_server.demo import _write_ome_zarr, synthetic_cells

    nuclei, labels = synthetic_cells((64, 80), 5, seed=1)
    _write_ome_zarr(tmp_path / "c.ome.zarr", np.stack([nuclei, nuclei]), labels.astype(np.uint16))
    assert "numba" in _probe(tmp_path / "c.ome.zarr", tmp_path / "out.zarr")["heavy"]
