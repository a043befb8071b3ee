"""A small generated demo dataset, so ``make run`` serves something real on a fresh machine.

Written with the formats' own writers: an OME-Zarr 0.4 image (2 channels × 1024², with a
stored 2-level pyramid and a labels image), a tiled OME-TIFF volume (24 × 1024², no stored
pyramid, so its levels are computed on demand) and a .npy array. Deterministic (seeded), ~70 MB.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["make_demo_dataset", "synthetic_cells"]


def _blur(a: np.ndarray, r: int) -> np.ndarray:
    """Separable box blur (cumulative sums): cheap and good enough for soft blobs."""
    for axis in range(a.ndim):
        c = np.cumsum(a, axis=axis, dtype=np.float64)
        n = a.shape[axis]
        lo = np.take(c, np.clip(np.arange(n) - r - 1, 0, n - 1), axis=axis)
        hi = np.take(c, np.clip(np.arange(n) + r, 0, n - 1), axis=axis)
        lo = np.where((np.arange(n) - r - 1 < 0).reshape([-1 if i == axis else 1 for i in range(a.ndim)]), 0, lo)
        a = (hi - lo) / (2 * r + 1)
    return a


def synthetic_cells(shape: tuple[int, ...], n_cells: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(uint16 intensity image, uint32 label image) of soft round blobs on noise."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(shape, np.uint32)
    ndim = len(shape)
    radius = max(4, min(shape[-2:]) // 40)
    for i in range(1, n_cells + 1):
        center = [int(rng.integers(radius, n - radius)) if n > 2 * radius else n // 2 for n in shape]
        box = tuple(slice(max(0, c - radius), min(n, c + radius + 1)) for c, n in zip(center, shape))
        d2 = 0.0
        for axis, (b, c, n) in enumerate(zip(box, center, shape)):
            r = radius if n > 2 * radius else max(1, n)
            coords = (np.arange(b.start, b.stop) - c) / r
            d2 = d2 + (coords**2).reshape([-1 if k == axis else 1 for k in range(ndim)])
        labels[box][d2 <= 1.0] = i
    signal = _blur((labels > 0).astype(np.float64), max(1, radius // 3))
    image = 200 + 3000 * signal + rng.normal(0, 40, shape)
    return np.clip(image, 0, 65535).astype(np.uint16), labels


def _write_ome_zarr(path: Path, channels: np.ndarray, labels: np.ndarray) -> None:
    import zarr

    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    levels = [channels, channels[:, ::2, ::2], channels[:, ::4, ::4]]
    for i, lv in enumerate(levels):
        root.create_array(str(i), data=np.ascontiguousarray(lv), chunks=(1, 256, 256))
    axes = [
        {"name": "c", "type": "channel"},
        {"name": "y", "type": "space", "unit": "micrometer"},
        {"name": "x", "type": "space", "unit": "micrometer"},
    ]
    root.attrs["multiscales"] = [
        {
            "version": "0.4",
            "name": "cells",
            "axes": axes,
            "datasets": [
                {
                    "path": str(i),
                    "coordinateTransformations": [{"type": "scale", "scale": [1, 0.65 * 2**i, 0.65 * 2**i]}],
                }
                for i in range(len(levels))
            ],
        }
    ]
    root.attrs["omero"] = {
        "channels": [{"label": "nuclei", "color": "0000FF"}, {"label": "membrane", "color": "00FF00"}]
    }
    lab = root.create_group("labels")
    lab.attrs["labels"] = ["cells"]
    cells = lab.create_group("cells")
    cells.create_array("0", data=labels, chunks=(256, 256))
    cells.attrs["multiscales"] = [
        {
            "version": "0.4",
            "name": "cells",
            "axes": axes[1:],
            "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [0.65, 0.65]}]}],
        }
    ]
    cells.attrs["image-label"] = {"version": "0.4", "source": {"image": "../../"}}


def make_demo_dataset(folder: str | Path, *, force: bool = False) -> Path:
    """Write the demo dataset into ``folder`` (skipped when already complete); return it."""
    import tifffile

    folder = Path(folder)
    marker = folder / ".complete"
    if marker.exists() and not force:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    nuclei, labels = synthetic_cells((1024, 1024), 150, seed=1)
    membrane, _ = synthetic_cells((1024, 1024), 60, seed=2)
    _write_ome_zarr(folder / "cells.ome.zarr", np.stack([nuclei, membrane]), labels)
    volume, _ = synthetic_cells((24, 1024, 1024), 120, seed=3)
    tifffile.imwrite(
        folder / "volume.ome.tif",
        volume,
        tile=(256, 256),
        photometric="minisblack",
        metadata={"axes": "ZYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5, "PhysicalSizeZ": 2.0},
    )
    np.save(folder / "gradient.npy", np.add.outer(np.arange(512, dtype=np.float32), np.arange(768, dtype=np.float32)))
    marker.write_text(json.dumps({"generator": "tensor_server.demo", "version": 1}))
    return folder
