"""``python -m tensor_server.bench hdf5-whole``: a (60, 1065, 1030) HDF5 dataset read whole (issue 28).

The target: a whole read costs at most 1.2x a direct h5py read. One uint16 dataset in two
layouts (contiguous, and chunked one plane a chunk), page cache warm, each path run
round-robin ``--repeats`` times (medians, the peer in the same run):

* the peer: ``h5py.File(path)["data"][...]`` and ``read_direct`` into a preallocated array;
* ours in process: the adapter's ``get_data()`` and the engine's ``read`` (the serving runtime's
  path for a region: special-chunk check, then one read into the output);
* ours through the biopb SDK: ``client.get_array`` against a server without a chunk cache
  (every planned chunk crosses gRPC DoGet) and against one with a cache (a loopback client
  maps the cached chunks: ``chunk_locate``), the SDK's own cache off.

Every path is checked bit-identical to the written array before it is timed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.special import alternating_medians
from tensor_server.bench.timing import print_table, write_json

SHAPE = (60, 1065, 1030)
LAYOUTS: dict[str, tuple[int, ...] | None] = {"contiguous": None, "chunked (1, 1065, 1030)": (1, 1065, 1030)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each path (default 7, medians)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def _write(work: Path, data: np.ndarray) -> dict[str, Path]:
    import h5py

    paths = {}
    for i, (name, chunks) in enumerate(LAYOUTS.items()):
        paths[name] = work / f"vol{i}.h5"
        with h5py.File(paths[name], "w") as f:
            f.create_dataset("data", data=data, chunks=chunks)
    return paths


def _paths(path: Path, tensor: Any, runtime: Any, clients: dict[str, Any]) -> dict[str, Callable[[], np.ndarray]]:
    import h5py

    def h5py_read() -> np.ndarray:
        with h5py.File(path, "r") as f:
            return f["data"][...]

    def h5py_read_direct() -> np.ndarray:
        with h5py.File(path, "r") as f:
            ds = f["data"]
            out = np.empty(ds.shape, ds.dtype)
            ds.read_direct(out)
            return out

    return {
        "h5py [...]": h5py_read,
        "h5py read_direct": h5py_read_direct,
        "adapter get_data": tensor.get_data,
        "engine read": lambda: runtime.engine.read(tensor, None, None, None),
        "SDK, server uncached": lambda: clients["uncached"].get_array(tensor.array_id),
        "SDK, server cached (mapped)": lambda: clients["cached"].get_array(tensor.array_id),
    }


def main(args: argparse.Namespace) -> int:
    from biopb.tensor import TensorFlightClient

    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.testing import start_serving

    work = Path(tempfile.mkdtemp(prefix="tensor-server-hdf5-whole-"))
    data = (np.arange(np.prod(SHAPE), dtype=np.uint32) % 65521).astype(np.uint16).reshape(SHAPE)
    rows: list[dict[str, Any]] = []
    cat = cache = None
    servers: dict[str, Any] = {}
    try:
        (work / "root").mkdir()
        paths = _write(work / "root", data)
        cat = Catalog([work / "root"])
        cat.scan()
        cache = CacheManager(work / "cache", max_total_bytes=4 << 30)
        servers = {"uncached": start_serving(cat), "cached": start_serving(cat, cache=cache)}
        clients = {k: TensorFlightClient(s.location, cache_bytes=0) for k, s in servers.items()}
        for layout, path in paths.items():
            rec = next(r for r in cat.records() if r.path.name == path.name)
            tensor = rec.source.tensor()
            fns = _paths(path, tensor, servers["uncached"].runtime, clients)
            for name, fn in fns.items():
                assert np.array_equal(fn(), data), f"{layout}: {name} read other pixels"
            ms = alternating_medians(fns, args.repeats)
            peer = ms["h5py [...]"]
            load = os.getloadavg()[0]
            rows += [
                {"layout": layout, "path": name, "ms": v, "x_h5py": v / peer, "load": load} for name, v in ms.items()
            ]
    finally:
        for srv in servers.values():
            srv.stop()
        if cat is not None:
            cat.close()
        if cache is not None:
            cache.close()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{SHAPE} uint16 ({data.nbytes / 2**20:.0f} MiB), page cache warm, medians of {args.repeats}; "
        f"{os.cpu_count()} cores"
    )
    print_table(
        ["layout", "path", "ms", "x h5py [...]", "load"],
        [[r["layout"], r["path"], f"{r['ms']:.0f}", f"{r['x_h5py']:.2f}", f"{r['load']:.1f}"] for r in rows],
    )
    write_json(args.json_path, "hdf5-whole", "x".join(map(str, SHAPE)), rows)
    return 0
