"""``python -m tensor_server.bench nearest``: each format's own nearest path vs the default.

For every adapter that serves ``nearest`` its own way (a strided/decimated read, or CZI's
libCZI zoom) the same scaled read is timed twice in one run: through the adapter, and through
the engine's streamed path (decimation turned off for the call), on one plane at scales 8 and 32, warm. Checksums must agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, median_ms, print_table, write_json

__all__ = ["run_nearest_paths"]


def _extra_fixtures(root: Path, n: int) -> list[tuple[str, Path]]:
    """Decimating formats the plane-latency fixtures lack: contiguous HDF5, NIfTI, DICOM."""
    import h5py
    import nibabel as nib

    from tensor_server.bench.fixtures import plane

    out = []
    p = root / "contiguous.h5"
    if not p.exists():
        with h5py.File(p, "w") as f:
            f.create_dataset("image", data=plane(n))
    out.append(("hdf5 contiguous", p))
    p = root / "plane.nii"
    if not p.exists():
        nib.save(nib.Nifti1Image(plane(n).T[:, :, None].copy(), np.eye(4)), p)
    out.append(("nifti", p))
    return out


def run_nearest_paths(
    size: str = "small", data_dir: str | None = None, json_path: str | None = None, repeats: int = 7
) -> list[dict[str, Any]]:
    import tensor_server
    from tensor_server.bench.fixtures import SIZES, make_fixtures
    from tensor_server.core import Bounds
    from tensor_server.core.downsample import warm_up

    warm_up()
    fixtures = make_fixtures(size, data_dir)
    root = fixtures[0].path.parent
    cases = [(f.name, f.path) for f in fixtures] + _extra_fixtures(root, SIZES[size])
    rows = []
    for name, path in cases:
        t = tensor_server.open(path).tensor()
        inner = getattr(t, "inner", t)
        if not inner.decimates:
            continue
        own_path = f"{type(inner).__name__}.get_decimated_data"
        labels = t.dim_labels
        sl = tuple(slice(None) if d in ("y", "x") else slice(0, 1) for d in labels)
        b = Bounds.from_slices(sl, t.shape)
        for s in (8, 32):
            scale = tuple(s if d in ("y", "x") else 1 for d in labels)

            def own() -> np.ndarray:
                return t.get_scaled_data(b, scale, "nearest")

            # The default path: the engine's streamed read, with decimation switched off for
            # the call. A canonical-order wrapper reports its inner adapter's flag, which is
            # the one switched.
            def streamed() -> np.ndarray:
                had_own_flag = "decimates" in inner.__dict__
                inner.decimates = False  # an instance attribute shadows the class flag
                try:
                    return t.get_scaled_data(b, scale, "nearest")
                finally:
                    if not had_own_flag:
                        del inner.decimates

            a, c = own(), streamed()
            assert np.array_equal(a, c), f"{name}: own nearest path disagrees with the default"
            rows.append(
                {
                    "format": name,
                    "path": own_path,
                    "scale": s,
                    "default_ms": median_ms(streamed, repeats),
                    "own_ms": median_ms(own, repeats),
                }
            )
    print_table(
        ["format", "own path", "scale", "default ms", "own ms", "speed-up"],
        [
            [r["format"], r["path"], r["scale"], r["default_ms"], r["own_ms"], f"{r['default_ms'] / r['own_ms']:.1f}x"]
            for r in rows
        ],
    )
    write_json(json_path, "nearest", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def main(args: argparse.Namespace) -> int:
    run_nearest_paths(args.size, args.data_dir, args.json_path)
    return 0
