"""``python -m tensor_server.bench export``: writing a pyramidal OME-Zarr, ours vs the peers.

For a 2-D plane and a Z stack, each stored as OME-TIFF and as zarr, four writers make the same
pyramid (block mean, factor 2 per level in Y and X, the same Blosc-zstd codec and chunks):

* ``ours``: ``python -m tensor_server export`` (NGFF 0.5, sharded);
* ``ngff-zarr``: ``to_multiscales`` (ITKWASM bin shrink, its block mean) + ``to_ngff_zarr``;
* ``ome-zarr-py``: ``write_image`` over a dask array of the source;
* ``floor``: read the source once and encode + write the output's bytes (every level's pixels,
  taken by striding: no reduction work), on all cores — what no writer can beat.

Each runs in its own process, one after the other, so its wall time and peak RSS
(``os.wait4``) are its own. The machine's load is printed beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["add_arguments", "main"]

#: size -> (plane edge, (z, y, x) of the stack)
SIZES = {"tiny": (2048, (4, 1024, 1024)), "small": (8192, (16, 2048, 2048)), "full": (32768, (30, 4096, 4096))}
LEVELS, CHUNK = 4, 256

_OURS = [
    sys.executable,
    "-m",
    "tensor_server",
    "export",
    "{src}",
    "{dest}",
    "--levels",
    str(LEVELS),
    "--codec",
    "blosc-zstd",
    "--progress",
    "none",
]

_DASK_SOURCE = """
import dask.array as da, tifffile, zarr
def source(path):
    if path.endswith(".zarr"):
        return da.from_zarr(path)
    return da.from_zarr(zarr.open(tifffile.imread(path, aszarr=True), mode="r"))
"""

_NGFF_ZARR = (
    _DASK_SOURCE
    + f"""
import sys, ngff_zarr as nz
from zarr.codecs import BloscCodec
src, dest, ndim = sys.argv[1], sys.argv[2], int(sys.argv[3])
dims = ["z", "y", "x"][3 - ndim:]
image = nz.to_ngff_image(source(src), dims=dims)
factors = [{{**({{"z": 1}} if ndim == 3 else {{}}), "y": 2**k, "x": 2**k}} for k in range(1, {LEVELS})]
ms = nz.to_multiscales(image, scale_factors=factors, method=nz.Methods.ITKWASM_BIN_SHRINK,
                       chunks={{d: ({CHUNK} if d != "z" else 16) for d in dims}})
nz.to_ngff_zarr(dest, ms, version="0.5", chunks_per_shard=8 if ndim == 2 else (1, 4, 4),
                compressors=[BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")])
"""
)

_OME_ZARR_PY = (
    _DASK_SOURCE
    + f"""
import sys, zarr, numcodecs
from ome_zarr.writer import write_image
from ome_zarr.format import FormatV04
src, dest, ndim = sys.argv[1], sys.argv[2], int(sys.argv[3])
group = zarr.open_group(dest, mode="w", zarr_format=2)
chunks = ({CHUNK}, {CHUNK}) if ndim == 2 else (16, {CHUNK}, {CHUNK})
write_image(source(src), group, scale_factors=[2**k for k in range(1, {LEVELS})], axes="zyx"[3 - ndim:], fmt=FormatV04(),
            storage_options=dict(chunks=chunks, compressor=numcodecs.Blosc(cname="zstd", clevel=5, shuffle=1)))
"""
)

_FLOOR = f"""
import sys, os, numpy as np, tifffile, zarr, numcodecs
from concurrent.futures import ThreadPoolExecutor
src, dest = sys.argv[1], sys.argv[2]
arr = zarr.open(src, mode="r") if src.endswith(".zarr") else zarr.open(tifffile.imread(src, aszarr=True), mode="r")
os.makedirs(dest)
blosc = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=1)
step = 2048
def piece(args):
    i, j = args
    block = np.asarray(arr[..., i:i + step, j:j + step])
    n = 0
    for k in range({LEVELS}):  # every level's bytes, by striding (the reduction is not the floor)
        level = np.ascontiguousarray(block[..., ::2**k, ::2**k])
        for a in range(0, level.shape[-2], {CHUNK}):
            for b in range(0, level.shape[-1], {CHUNK}):
                data = blosc.encode(np.ascontiguousarray(level[..., a:a + {CHUNK}, b:b + {CHUNK}]))
                with open(f"{{dest}}/{{k}}.{{i}}.{{j}}.{{a}}.{{b}}", "wb") as f:
                    n += f.write(data)
    return n
cells = [(i, j) for i in range(0, arr.shape[-2], step) for j in range(0, arr.shape[-1], step)]
with ThreadPoolExecutor(os.cpu_count()) as pool:
    print(sum(pool.map(piece, cells)))
"""


def _sources(data_dir: Path, size: str) -> list[tuple[str, Path, int]]:
    """(name, path, ndim): the plane and the stack, as OME-TIFF and as zarr (written once)."""
    import tifffile
    import zarr

    edge, stack = SIZES[size]
    out = []
    for name, shape in (("plane", (edge, edge)), ("stack", stack)):
        zpath, tpath = data_dir / f"{name}-{size}.zarr", data_dir / f"{name}-{size}.ome.tif"
        if not zpath.exists() or not tpath.exists():
            tile = (1, 1024, 1024) if len(shape) == 3 else (1024, 1024)
            z = zarr.create_array(str(zpath) + ".tmp", shape=shape, dtype="uint16", chunks=tile, overwrite=True)
            rows = 1024
            with tifffile.TiffWriter(tpath, bigtiff=True, ome=True) as tw:

                def tiles():
                    for plane in range(shape[0] if len(shape) == 3 else 1):
                        for y in range(0, shape[-2], rows):
                            for x in range(0, shape[-1], rows):
                                yield _pixels(plane, y, x, rows)

                tw.write(
                    tiles(), shape=shape, dtype="uint16", tile=(rows, rows), metadata={"axes": "ZYX"[3 - len(shape) :]}
                )
            for plane in range(shape[0] if len(shape) == 3 else 1):
                for y in range(0, shape[-2], rows):
                    for x in range(0, shape[-1], rows):
                        sel = (
                            (plane, slice(y, y + rows), slice(x, x + rows))
                            if len(shape) == 3
                            else (slice(y, y + rows), slice(x, x + rows))
                        )
                        z[sel] = _pixels(plane, y, x, rows)
            os.replace(str(zpath) + ".tmp", zpath)
        out += [(f"{name} tiff", tpath, len(shape)), (f"{name} zarr", zpath, len(shape))]
    return out


def _pixels(plane: int, y: int, x: int, n: int) -> np.ndarray:
    """A smooth ramp plus noise (compresses like a micrograph, not like zeros)."""
    yy, xx = np.mgrid[y : y + n, x : x + n]
    noise = np.random.default_rng(plane * 1_000_003 + y * 1009 + x).integers(0, 256, (n, n))
    return ((yy * 3 + xx * 2 + plane * 100) % 40000 + noise).astype(np.uint16)


def _run(cmd: list[str], timeout: float, rss_cap: int) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, error) of one writer in its own process; a writer past
    ``timeout`` seconds or ``rss_cap`` bytes resident is stopped and that is its error (the
    figure recorded: it did not finish within the limit)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        stopped = ""
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss = _rss(proc.pid)
            if not stopped and time.perf_counter() - t0 > timeout:
                stopped = f"stopped: not done in {timeout:.0f} s"
            elif not stopped and rss > rss_cap:
                stopped = f"stopped: resident memory above {rss_cap / 1e9:.0f} GB"
            if stopped:
                proc.kill()
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-300:]
    return wall, usage.ru_maxrss * 1024, stopped or ("" if proc.returncode == 0 else tail)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def _writers(src: Path, dest: Path, ndim: int) -> dict[str, list[str]]:
    args = [str(src), str(dest), str(ndim)]
    return {
        "ours": [a.format(src=src, dest=dest) for a in _OURS],
        "ngff-zarr": [sys.executable, "-c", _NGFF_ZARR, *args],
        "ome-zarr-py": [sys.executable, "-c", _OME_ZARR_PY, *args],
        "floor": [sys.executable, "-c", _FLOOR, *args[:2]],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.set_defaults(size="small")
    for action in parser._actions:  # the common --size, with this bench's extra "tiny" (a smoke run)
        if action.dest == "size":
            action.choices = tuple(SIZES)
    parser.add_argument("--only", help="comma-separated source names to run (e.g. 'plane zarr')")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a writer may take before it is stopped")
    parser.add_argument(
        "--rss-cap-gb", type=float, default=16, help="resident GB a writer may hold before it is stopped"
    )


def main(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir or Path(tempfile.gettempdir()) / "tensor-server-bench-export")
    data_dir.mkdir(parents=True, exist_ok=True)
    rows, table = [], []
    for name, src, ndim in _sources(data_dir, args.size):
        if args.only and name not in args.only.split(","):
            continue
        source_mb = src.stat().st_size / 1e6 if src.is_file() else sum(p.stat().st_size for p in src.rglob("*")) / 1e6
        for writer, cmd in _writers(src, data_dir / "out.zarr", ndim).items():
            subprocess.run(["rm", "-rf", str(data_dir / "out.zarr")], check=True)
            wall, rss, err = _run(cmd, args.timeout, int(args.rss_cap_gb * 1e9))
            rows.append(
                {
                    "source": name,
                    "writer": writer,
                    "wall_s": round(wall, 2),
                    "peak_rss_mb": round(rss / 1e6),
                    "source_mb": round(source_mb),
                    "error": err,
                    "load": [round(v, 2) for v in os.getloadavg()],
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # a long run's figures as they come
            table.append([name, writer, wall, rss / 1e6, err.splitlines()[-1][:60] if err else ""])
        subprocess.run(["rm", "-rf", str(data_dir / "out.zarr")], check=True)
    print_table(["source", "writer", "wall s", "peak RSS MB", "error"], table)
    print("load:", " ".join(f"{v:.2f}" for v in os.getloadavg()), f"cores: {os.cpu_count()}")
    write_json(args.json_path, "export", args.size, rows)
    return 1 if any(r["writer"] == "ours" and r["error"] for r in rows) else 0
