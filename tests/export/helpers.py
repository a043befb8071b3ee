"""Shared pieces of the export tests: a generated tensor that holds no pixels, a small
OME-Zarr with a label image, and the engine's scaled read of a level in the output's (NGFF)
axis order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.core.engine import ReadEngine

REPO = Path(__file__).resolve().parents[2]


def write_cells(path: Path, shape: tuple[int, int] = (300, 413)) -> Path:
    """A 2-channel OME-Zarr (NGFF 0.4) at ``path`` with one label image ``cells`` (y, x)."""
    from tensor_server.demo import _write_ome_zarr, synthetic_cells

    nuclei, labels = synthetic_cells(shape, 20, seed=1)
    membrane, _ = synthetic_cells(shape, 10, seed=2)
    _write_ome_zarr(path, np.stack([nuclei, membrane]), labels.astype(np.uint16))
    return path


class GeneratedPlane(TensorAdapter):
    """uint16 ``3y + x + y mod 13`` (wrapping): deterministic, computed per read into the
    output alone, so a tensor of any size holds no memory."""

    def __init__(self, shape, **kw) -> None:
        super().__init__(TensorInfo(tuple(shape), np.dtype(np.uint16), dim_labels=("y", "x"), **kw))
        self.array_id = "generated"

    def read_region(self, bounds):
        y, x = (np.arange(s.start, s.stop, dtype=np.uint16) for s in bounds.to_slices())
        out = np.empty(bounds.shape, np.uint16)
        np.add((y * np.uint16(3) + y % np.uint16(13))[:, None], x[None, :], out=out)
        return out


def engine_level(tensor, scale, method, out_order):
    """``engine.read`` of the whole tensor at ``scale``, axes moved to ``out_order`` (a
    permutation of the source axes) — the test's own statement of the NGFF axis order."""
    ref = ReadEngine().read(tensor, None, scale, method)
    return np.transpose(ref, out_order)


def peak_rss() -> int:
    """This process's own peak resident bytes (``VmHWM``). Not ``ru_maxrss``: a child's starts
    at the forking parent's (a pytest process of 170 MB hid a smaller export's growth)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"}
    return subprocess.run(
        [sys.executable, "-m", "tensor_server", "export", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        **kw,
    )
