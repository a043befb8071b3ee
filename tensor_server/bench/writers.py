"""Sample files the benchmarks need that no fixture generator of the bench writes itself.

Kept out of the adapter modules: an adapter reads its format; writing a synthetic sample for a
benchmark is the bench's business (the tests use it too, to check it writes what it says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["plate_grid", "write_benchmark_czi", "write_metadata_plate", "write_plate"]

#: a field's pixels: (well path, field index, (channels, y, x)) -> the array to write
FieldPixels = Callable[[str, int, tuple[int, int, int]], np.ndarray]


def plate_grid(rows: int, columns: int) -> tuple[list[str], list[str]]:
    """Row and column names of a plate as screens name them: A..Z, AA.. and 1..columns."""
    names = [chr(65 + i) if i < 26 else "A" + chr(65 + i - 26) for i in range(rows)]
    return names, [str(i + 1) for i in range(columns)]


def write_plate(
    path: str | Path,
    rows: Sequence[str],
    columns: Sequence[str],
    wells: Mapping[str, Sequence[tuple[int, int] | None]],
    pixels: FieldPixels,
    *,
    version: str = "0.4",
    channels: int = 2,
    scale_factors: Sequence[int] = (2, 4),
    listed: Sequence[str] = (),
    chunks: Sequence[int] | None = None,
) -> Path:
    """An OME-Zarr HCS plate through ome-zarr-py's own writer (``write_plate_metadata``,
    ``write_well_metadata``, ``write_image``, NGFF ``version`` 0.4 on zarr v2 or 0.5 on v3):
    ``wells`` maps a well's path to its fields' (y, x), each ``channels`` × y × x of
    ``pixels(well, index, shape)`` with levels at ``scale_factors``; a None field is listed
    in its well but never written, a well in ``listed`` only named in the plate.
    ``chunks``: the storage chunks (default: the writer's)."""
    import zarr
    from ome_zarr import format as ome_format
    from ome_zarr import writer

    fmt = ome_format.FormatV04() if version == "0.4" else ome_format.FormatV05()
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt.zarr_format)
    field_count = max((len(f) for f in wells.values()), default=0)
    writer.write_plate_metadata(root, list(rows), list(columns), [*wells, *listed], fmt=fmt, field_count=field_count)
    storage = None if chunks is None else {"chunks": tuple(chunks)}
    for well, fields in wells.items():
        group = root.require_group(well)
        writer.write_well_metadata(group, [str(i) for i in range(len(fields))], fmt=fmt)
        for i, yx in enumerate(fields):
            if yx is not None:
                data = pixels(well, i, (channels, *yx))
                image = group.require_group(str(i))
                writer.write_image(
                    data, image, scale_factors=tuple(scale_factors), axes="cyx", fmt=fmt, storage_options=storage
                )
    return Path(path)


def write_metadata_plate(
    path: str | Path, rows: int, columns: int, fields: int, side: int = 1080, levels: int = 4
) -> Path:
    """A plate of ``rows`` × ``columns`` wells of ``fields`` fields of 2 × ``side``² uint16
    with ``levels``-level pyramids and no pixel written (NGFF 0.4): one well written by
    ome-zarr-py (``write_plate`` of zeros, which zarr does not store), its metadata documents
    copied to every well, the plate's document listing them all. A big plate's open costs
    the same as a written one's (the open reads metadata only) in seconds and megabytes."""
    import json
    import shutil
    import tempfile

    path = Path(path)
    names, numbers = plate_grid(rows, columns)
    with tempfile.TemporaryDirectory(prefix="ts-metadata-plate-") as tmp:
        seed = write_plate(
            Path(tmp) / "seed.ome.zarr",
            ["A"],
            ["1"],
            {"A/1": [(side, side)] * fields},
            lambda well, index, shape: np.zeros(shape, np.uint16),
            scale_factors=[2**k for k in range(1, levels)],
        )
        well = {p.relative_to(seed / "A" / "1"): p.read_bytes() for p in (seed / "A" / "1").rglob("*") if p.is_file()}
        plate = json.loads((seed / ".zattrs").read_bytes())
        path.mkdir(parents=True)
        shutil.copy(seed / ".zgroup", path / ".zgroup")
    wells = [f"{r}/{c}" for r in names for c in numbers]
    plate["plate"].update(
        rows=[{"name": n} for n in names],
        columns=[{"name": n} for n in numbers],
        wells=[{"path": w, "rowIndex": i // columns, "columnIndex": i % columns} for i, w in enumerate(wells)],
    )
    (path / ".zattrs").write_text(json.dumps(plate))
    for row in names:
        (path / row).mkdir()
        (path / row / ".zgroup").write_text('{"zarr_format": 2}')
    for w in wells:
        for rel, data in well.items():
            (path / w / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / w / rel).write_bytes(data)
    return path


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
