"""Sample files the benchmarks need that no fixture generator of the bench writes itself.

Kept out of the adapter modules: an adapter reads its format; writing a synthetic sample for a
benchmark is the bench's business (the tests use it too, to check it writes what it says).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["write_benchmark_czi"]


def write_benchmark_czi(
    path: str | Path, size: int = 8192, channels: int = 3, tile: int | None = 2048, seed: int = 0
) -> Path:
    """Write a synthetic ``channels`` × ``size``² uint16 CZI (no pyramid, uncompressed) for
    the scaled-read benchmark, tile by tile so memory stays at one tile.

    ``tile`` is the subblock edge (a mosaic of tile² subblocks, as a scanner writes); None
    writes each plane in one call and lets pylibCZIrw retile it (it cuts planes over 10 MB
    into thirds, so the subblock edges land off the power-of-two grid).
    """
    from pylibCZIrw import czi as pyczi

    path = Path(path)
    rng = np.random.default_rng(seed)
    step = size if tile is None else int(tile)
    yy, xx = np.mgrid[0:step, 0:step].astype(np.uint32)
    with pyczi.create_czi(str(path), exist_ok=True) as writer:
        for c in range(channels):
            for ty in range(0, size, step):
                for tx in range(0, size, step):
                    th, tw = min(step, size - ty), min(step, size - tx)
                    base = ((yy[:th, :tw] + ty) * 7 + (xx[:th, :tw] + tx) * 3 + c * 1000) % 50000
                    noise = rng.integers(0, 4096, (th, tw), dtype=np.uint32)
                    plane = {"C": c, "Z": 0, "T": 0}
                    writer.write((base + noise).astype(np.uint16), plane=plane, location=(tx, ty))
    return path
