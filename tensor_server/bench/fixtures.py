"""Benchmark fixtures, generated once with each format's own writer into a cache folder.

``--size small`` writes 2048² planes (runs in well under two minutes on 2 cores),
``--size full`` the 8192² planes the design doc measures. Content is a smooth pattern with
noise, so compressed formats compress like real images rather than like random bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Fixture", "SIZES", "plane", "make_fixtures", "zarr_layouts", "default_data_dir", "drop_page_cache"]

SIZES = {"small": 2048, "full": 8192}


@dataclass(frozen=True)
class Fixture:
    name: str  # e.g. "ome-tiff tiled 512"
    path: Path
    layout: str
    files: tuple[Path, ...]  # what to drop from the page cache for a cold read


def default_data_dir() -> Path:
    from tensor_server.config import default_cache_dir

    return default_cache_dir() / "bench-data"


def plane(n: int, seed: int = 0) -> np.ndarray:
    """A smooth uint16 pattern with noise (compresses like a real image, unlike random bytes)."""
    rng = np.random.default_rng(seed)
    y = np.sin(np.linspace(0, 12, n, dtype=np.float32))[:, None]
    x = np.cos(np.linspace(0, 9, n, dtype=np.float32))[None, :]
    img = 2000 + 1500 * (y * x) + rng.normal(0, 30, (n, n)).astype(np.float32)
    return np.clip(img, 0, 65535).astype(np.uint16)


def _files_under(path: Path) -> tuple[Path, ...]:
    if path.is_file():
        return (path,)
    return tuple(p for p in path.rglob("*") if p.is_file())


def make_fixtures(
    size: str = "small", data_dir: str | os.PathLike[str] | None = None, *, with_czi: bool = True
) -> list[Fixture]:
    """Write (or reuse) the fixtures for ``size``; return them in table order."""
    import h5py
    import mrcfile
    import tifffile
    import zarr

    n = SIZES[size]
    root = Path(data_dir or default_data_dir()) / size
    root.mkdir(parents=True, exist_ok=True)
    done = root / ".complete.json"
    generated = None

    def data() -> np.ndarray:
        nonlocal generated
        if generated is None:
            generated = plane(n)
        return generated

    if not done.exists():
        tifffile.imwrite(
            root / "tiled.ome.tif",
            data(),
            tile=(512, 512),
            compression="zlib",
            photometric="minisblack",
            metadata={"axes": "YX"},
        )
        import numcodecs

        z = zarr.open_array(
            str(root / "chunked.ome.zarr" / "0"),
            mode="w",
            shape=(n, n),
            chunks=(n // 2, n // 2),
            dtype=np.uint16,
            zarr_format=2,
            compressor=numcodecs.Blosc("zstd", 5, numcodecs.Blosc.SHUFFLE),
        )
        z[...] = data()
        g = zarr.open_group(str(root / "chunked.ome.zarr"), mode="a", zarr_format=2)
        g.attrs["multiscales"] = [
            {
                "version": "0.4",
                "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
                "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}],
            }
        ]
        with h5py.File(root / "chunked.h5", "w") as f:
            f.create_dataset("image", data=data(), chunks=(1024, 1024))
        with mrcfile.new(root / "plane.mrc", overwrite=True) as m:
            m.set_data(data()[None])
        if with_czi:
            try:
                from tensor_server.bench.writers import write_benchmark_czi

                write_benchmark_czi(root / "plane.czi", size=n, channels=3)
            except Exception as exc:  # the CZI writer is optional for the table
                (root / "czi-skipped.txt").write_text(str(exc))
        done.write_text(json.dumps({"size": n}))

    out = [
        Fixture("ome-tiff", root / "tiled.ome.tif", f"{n}² page, 512² zlib tiles", ()),
        Fixture("ome-zarr", root / "chunked.ome.zarr", f"{n}², {n // 2}² blosc chunks", ()),
        Fixture("hdf5", root / "chunked.h5", f"{n}², 1024² chunks", ()),
        Fixture("mrc", root / "plane.mrc", f"{n}², memmap", ()),
    ]
    if (root / "plane.czi").exists():
        out.append(Fixture("czi", root / "plane.czi", f"{n}² x 3C", ()))
    return [Fixture(f.name, f.path, f.layout, _files_under(f.path)) for f in out]


def zarr_layouts(size: str = "small", data_dir: str | os.PathLike[str] | None = None) -> list[Fixture]:
    """The zarr layouts of ``bench peers``' zarr table, one plane each (blosc-zstd 5, byte
    shuffle, zarr-python's writer): v2 and v3 with chunks of half and an eighth of the plane
    (4096² and 1024² at full size) and v3 shards of half the plane holding inner chunks of a
    thirty-second (4096² shards of 256² chunks at full size)."""
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec

    n = SIZES[size]
    root = Path(data_dir or default_data_dir()) / size / "zarr-layouts"
    layouts = [
        (f"zarr v2, {n // 2}² chunks", "v2-half", 2, n // 2, None),
        (f"zarr v2, {n // 8}² chunks", "v2-eighth", 2, n // 8, None),
        (f"zarr v3, {n // 2}² chunks", "v3-half", 3, n // 2, None),
        (f"zarr v3, {n // 8}² chunks", "v3-eighth", 3, n // 8, None),
        (f"zarr v3, {n // 2}² shards of {n // 32}²", "v3-sharded", 3, n // 32, n // 2),
    ]
    data = None
    out = []
    for label, name, fmt, chunk, shard in layouts:
        path = root / f"{name}.zarr"
        if not (path / ".complete").exists():
            data = plane(n) if data is None else data
            if fmt == 2:
                z = zarr.open_array(
                    str(path),
                    mode="w",
                    shape=data.shape,
                    chunks=(chunk, chunk),
                    dtype=np.uint16,
                    zarr_format=2,
                    compressor=numcodecs.Blosc("zstd", 5, numcodecs.Blosc.SHUFFLE),
                )
            else:
                z = zarr.create_array(
                    str(path),
                    shape=data.shape,
                    chunks=(chunk, chunk),
                    shards=None if shard is None else (shard, shard),
                    dtype=np.uint16,
                    zarr_format=3,
                    compressors=BloscCodec(cname="zstd", clevel=5, shuffle="shuffle"),
                    overwrite=True,
                )
            z[...] = data
            (path / ".complete").write_text("")
        out.append(Fixture(label, path, label, _files_under(path)))
    return out


def drop_page_cache(files: tuple[Path, ...]) -> None:
    """Ask the kernel to drop these files' cached pages (posix_fadvise DONTNEED): a cold read
    without root-only tricks. Dirty pages are flushed first so they can be dropped."""
    for p in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
