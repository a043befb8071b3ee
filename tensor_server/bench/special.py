"""``python -m tensor_server.bench special``: special (uniform) chunks answered in closed form.

The case of python-blosc2 issue #761: a (1100, 512, 512) float16 volume chunked (64, 128,
128), zero but for 6 small boxes, in zarr v3, HDF5 and blosc2 (``--size small``: (275, 256,
256)); and a 4096² uint16 label image chunked 256², 95 % empty chunks, plus a sweep at 50 /
90 / 99 % empty. Timed in one run, alternating (medians):

* a scale-4 ``area`` read of the whole volume (``mode`` for the label image) through the
  server and the biopb SDK, special-chunk detection on vs off (``[read] special_chunks``);
* ``tensor_stats`` of the whole tensor through the server, on vs off;
* the peers: zarr-python + NumPy (read everything, reduce with NumPy) and blosc2's own
  ``sum`` / ``max``.

Both servers run without a chunk cache and the SDK client with its cache off, so every
repeat computes. Results are checked equal (on = off = oracle) before they are timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_special"]

VOLUME = {"full": ((1100, 512, 512), (64, 128, 128)), "small": ((275, 256, 256), (64, 128, 128))}


def alternating_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of each function, run round-robin (a machine's drift hits all alike)."""
    import statistics
    import time

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _boxes(shape: tuple[int, ...], rng: np.random.Generator, n: int = 6) -> list[tuple[slice, ...]]:
    out = []
    for _ in range(n):
        ext = [max(4, s // 24) for s in shape]
        start = [int(rng.integers(0, s - e)) for s, e in zip(shape, ext)]
        out.append(tuple(slice(a, a + e) for a, e in zip(start, ext)))
    return out


def write_volume(work: Path, size: str) -> dict[str, Path]:
    """The sparse float16 volume in zarr v3, HDF5 and blosc2 (only the boxes are written)."""
    import blosc2
    import h5py
    import zarr

    shape, chunks = VOLUME[size]
    rng = np.random.default_rng(761)
    boxes = _boxes(shape, rng)
    paths = {"zarr": work / "vol.zarr", "hdf5": work / "vol.h5", "blosc2": work / "vol.b2nd"}
    z = zarr.create_array(str(paths["zarr"]), shape=shape, chunks=chunks, dtype="f2", fill_value=0)
    b = blosc2.zeros(shape, dtype=np.float16, chunks=chunks, urlpath=str(paths["blosc2"]), mode="w")
    with h5py.File(paths["hdf5"], "w") as f:
        ds = f.create_dataset(
            "vol", shape=shape, chunks=chunks, dtype="f2", fillvalue=0, compression="gzip", compression_opts=1
        )
        for box in boxes:
            data = rng.normal(size=tuple(s.stop - s.start for s in box)).astype(np.float16)
            z[box] = data
            ds[box] = data
            b[box] = data
    return paths


def write_labels(work: Path, empty_fraction: float, n: int = 4096, chunk: int = 256) -> Path:
    """A uint16 label image, ``empty_fraction`` of its chunks never written (zarr v3)."""
    import zarr

    path = work / f"labels-{int(round(empty_fraction * 100))}.zarr"
    z = zarr.create_array(str(path), shape=(n, n), chunks=(chunk, chunk), dtype="u2", fill_value=0)
    rng = np.random.default_rng(95)
    grid = (n // chunk) ** 2
    dense = rng.choice(grid, size=max(1, int(round(grid * (1 - empty_fraction)))), replace=False)
    for k in sorted(dense):
        i, j = divmod(int(k), n // chunk)
        z[i * chunk : (i + 1) * chunk, j * chunk : (j + 1) * chunk] = rng.integers(
            1, 40, (chunk, chunk), dtype=np.uint16
        )
    return path


def _numpy_reduce(a: np.ndarray, s: int, method: str) -> np.ndarray:
    """The peer's reduction: NumPy block mean (float32 accumulate) or block max of a whole read."""
    crop = a[tuple(slice(0, (n // s) * s) for n in a.shape)]
    blocks = crop.reshape(sum(((n // s, s) for n in crop.shape), ()))
    axes = tuple(range(1, 2 * a.ndim, 2))
    return blocks.mean(axis=axes, dtype=np.float32) if method == "area" else blocks.max(axis=axes)


def run_special(size: str = "small", json_path: str | None = None, repeats: int = 3) -> list[dict[str, Any]]:
    import pyarrow.flight as flight
    import zarr
    from biopb.tensor import TensorFlightClient

    from tensor_server.catalog import Catalog
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.stream_reduce import iter_units
    from tensor_server.core.uniform import uniform_value
    from tensor_server.testing import start_serving

    warm_up()
    work = Path(tempfile.mkdtemp(prefix="ts-bench-special-"))
    vol = write_volume(work, size)
    labels = {f: write_labels(work, f) for f in (0.5, 0.9, 0.95, 0.99)}
    cat = Catalog([work])
    cat.scan()
    servers = {mode: start_serving(cat, special_chunks=on) for mode, on in (("on", True), ("off", False))}
    clients = {m: TensorFlightClient(s.location, cache_bytes=0) for m, s in servers.items()}
    raw = {m: flight.FlightClient(s.location) for m, s in servers.items()}

    def tensor_of(path: Path):
        for rec in cat.records():
            if rec.path is not None and Path(rec.path).resolve() == path.resolve():
                return rec.source.tensor()
        raise LookupError(path)

    def uniform_share(t) -> float:
        block = t.read_block_shape or t.chunk_shape
        units = list(iter_units(Bounds.full(t.shape), block))
        return sum(uniform_value(t, u) is not None for u in units) / len(units)

    def stats_call(mode: str, array_id: str) -> dict[str, Any]:
        body = json.dumps({"array_id": array_id}).encode()
        (res,) = list(raw[mode].do_action(flight.Action("tensor_stats", body)))
        return json.loads(res.body.to_pybytes())

    rows: list[dict[str, Any]] = []
    try:
        cases = [(f"volume {fmt}", p, 4, "area") for fmt, p in vol.items()]
        cases += [(f"labels {int(f * 100)}% empty", p, 4, "mode") for f, p in labels.items()]
        for name, path, s, method in cases:
            t = tensor_of(path)
            scale = [s] * t.ndim
            read = {
                m: (lambda m=m: clients[m].get_array(t.array_id, scale_hint=scale, reduction_method=method))
                for m in clients
            }
            a_on, a_off = np.asarray(read["on"]()), np.asarray(read["off"]())
            assert a_on.tobytes() == a_off.tobytes(), f"{name}: special chunks changed the pixels"
            st_on, st_off = stats_call("on", t.array_id), stats_call("off", t.array_id)
            assert st_on["max"] == st_off["max"] and st_on["count_nonzero"] == st_off["count_nonzero"]
            fns: dict[str, Callable[[], object]] = {
                "read on": read["on"],
                "read off": read["off"],
                "stats on": lambda: stats_call("on", t.array_id),
                "stats off": lambda: stats_call("off", t.array_id),
            }
            if path.suffix == ".zarr":
                fns["zarr+numpy read"] = lambda: _numpy_reduce(
                    np.asarray(zarr.open_array(str(path), mode="r")[...]), s, "area" if method == "area" else "max"
                )
                fns["zarr+numpy stats"] = lambda: (lambda a: (a.min(), a.max(), a.sum(dtype=np.float64)))(
                    np.asarray(zarr.open_array(str(path), mode="r")[...])
                )
            if path.suffix == ".b2nd":
                import blosc2

                fns["blosc2 sum+max"] = lambda: (lambda b: (b.sum(), b.max()))(blosc2.open(str(path), mode="r"))
            ms = alternating_medians(fns, repeats)
            row = {
                "case": name,
                "shape": list(t.shape),
                "chunks": list(t.read_block_shape or t.chunk_shape),
                "uniform_chunks": round(uniform_share(t), 3),
                "scale": s,
                "method": method,
                **ms,
                "read_speedup": ms["read off"] / ms["read on"],
                "stats_speedup": ms["stats off"] / ms["stats on"],
            }
            rows.append(row)
            print(
                f"{name}: {json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for c in raw.values():
            c.close()
        for srv in servers.values():
            srv.stop()
        cat.close()
        shutil.rmtree(work, ignore_errors=True)
    peer = lambda r, k: f"{r[k]:.0f}" if k in r else "-"  # noqa: E731
    print_table(
        [
            "case",
            "uniform",
            "read on",
            "read off",
            "x",
            "stats on",
            "stats off",
            "x",
            "zarr+np read",
            "zarr+np stats",
            "blosc2 sum+max",
        ],
        [
            [
                r["case"],
                f"{r['uniform_chunks']:.0%}",
                r["read on"],
                r["read off"],
                f"{r['read_speedup']:.1f}",
                r["stats on"],
                r["stats off"],
                f"{r['stats_speedup']:.1f}",
                peer(r, "zarr+numpy read"),
                peer(r, "zarr+numpy stats"),
                peer(r, "blosc2 sum+max"),
            ]
            for r in rows
        ],
    )
    write_json(json_path, "special", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, data_dir=False)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")


def main(args: argparse.Namespace) -> int:
    run_special(args.size, args.json_path, args.repeats)
    return 0
