"""``python -m tensor_server.bench catalog-start``: the first minute over a big root (issue 28).

A generated root of ``--files`` small files of mixed formats (npy, TIFF, HDF5, MRC) plus
``--large`` large ones (TIFF, HDF5), measured once each, in one run:

1. the first scan until every row is listed: ours (adapters opened on a pool of
   ``open_workers``) against the peer, the same catalog opening one file at a time
   (``open_workers=1``, what a scan did before), on the same tree, page cache warm for both;
2. a restart with the tree unchanged: rows listed from the store at construction, then the
   verifying scan; files reopened (the catalog's counter, expected 0);
3. a rescan of the unchanged tree in the same process (stats only);
4. a real ``serve`` process: seconds from process start to its Flight port answering
   ``health``, and to ``health.source_count`` reaching every row, first start and restart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tensor_server.bench.timing import Progress, print_table, write_json

__all__ = ["make_tree"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=10_000, help="small files (default 10,000)")
    parser.add_argument("--large", type=int, default=100, help="large files (default 100)")
    parser.add_argument("--large-mib", type=int, default=32, help="size of each large file in MiB (default 32)")
    parser.add_argument("--data-dir", help="where the tree is generated (default: a temporary folder, removed)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def _letters(i: int) -> str:
    """``i`` spelled in letters: TIFFs named with digits in one folder are a TIFF sequence."""
    return "".join(chr(97 + int(d)) for d in f"{i:06d}")


def _small(path: Path, i: int) -> None:
    data = np.full((16, 16 + i % 7), i % 251, np.uint8)
    kind = i % 4
    if kind == 0:
        np.save(path / f"s{i:06d}.npy", data)
    elif kind == 1:
        import tifffile

        tifffile.imwrite(path / f"s_{_letters(i)}.tif", data)
    elif kind == 2:
        import h5py

        with h5py.File(path / f"s{i:06d}.h5", "w") as f:
            f["data"] = data
    else:
        import mrcfile

        with mrcfile.new(path / f"s{i:06d}.mrc") as m:
            m.set_data(data.astype(np.int16))


def _large(path: Path, i: int, mib: int) -> None:
    side = max(256, (mib << 20) // (2 * 8 * 1024))  # 8 planes of 1024 x side uint16
    plane = np.arange(side * 1024, dtype=np.uint16).reshape(1024, side)
    stack = np.broadcast_to(plane, (8, 1024, side))
    if i % 2:
        import tifffile

        tifffile.imwrite(path / f"L_{_letters(i)}.tif", stack)
    else:
        import h5py

        with h5py.File(path / f"L{i:03d}.h5", "w") as f:
            f.create_dataset("data", data=stack, chunks=(1, 256, 256))


def make_tree(root: Path, files: int, large: int, large_mib: int) -> int:
    """Write the tree (100 files a folder); return the number of sources in it."""
    progress = Progress(-(-files // 500) + large)
    for i in range(files):
        folder = root / f"d{i // 100:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        _small(folder, i)
        if i % 500 == 0:
            progress.step(f"small {i}")
    (root / "large").mkdir(parents=True, exist_ok=True)
    for i in range(large):
        _large(root / "large", i, large_mib)
        progress.step(f"large {i}")
    progress.close()
    return files + large


def _scan_seconds(root: Path, workers: int, store: str | None = None) -> tuple[float, int, int]:
    from tensor_server.catalog import Catalog

    t0 = time.perf_counter()
    cat = Catalog([root], store_path=store, open_workers=workers)
    cat.scan()
    took = time.perf_counter() - t0
    rows, opens = len(cat), cat.opens
    cat.close()
    return took, rows, opens


def _warm_up(root: Path) -> None:
    """Open one file of each format first, so neither contender pays the libraries' imports."""
    from tensor_server.adapters.registry import open_source

    seen: set[str] = set()
    for path in sorted((root / "d0000").iterdir()) + sorted((root / "large").iterdir()):
        if path.suffix not in seen:
            seen.add(path.suffix)
            open_source(path).close()


def _catalog_rows(root: Path, expected: int, store: str) -> list[dict]:
    from tensor_server.catalog import Catalog

    _warm_up(root)
    rows = []
    took, n, opens = _scan_seconds(root, 1, store + ".peer")
    rows.append(
        {
            "step": "first scan, all listed",
            "who": "peer: one file at a time",
            "seconds": took,
            "rows": n,
            "opened": opens,
        }
    )
    took, n, opens = _scan_seconds(root, Catalog().open_workers, store)
    rows.append({"step": "first scan, all listed", "who": "ours: pool", "seconds": took, "rows": n, "opened": opens})
    t0 = time.perf_counter()
    cat = Catalog([root], store_path=store)
    listed = time.perf_counter() - t0
    rows.append(
        {
            "step": "restart, all listed (from the store)",
            "who": "ours",
            "seconds": listed,
            "rows": len(cat),
            "opened": cat.opens,
        }
    )
    t0 = time.perf_counter()
    cat.scan()
    rows.append(
        {
            "step": "restart, verifying scan",
            "who": "ours",
            "seconds": time.perf_counter() - t0,
            "rows": len(cat),
            "opened": cat.opens,
        }
    )
    t0 = time.perf_counter()
    cat.scan()
    rows.append(
        {
            "step": "rescan, unchanged tree",
            "who": "ours",
            "seconds": time.perf_counter() - t0,
            "rows": len(cat),
            "opened": cat.opens,
        }
    )
    cat.close()
    assert all(r["rows"] == expected for r in rows), rows
    return rows


def _health(location: str) -> dict | None:
    import pyarrow.flight as flight

    client = flight.FlightClient(location)
    try:
        results = list(client.do_action(flight.Action("health", b""), flight.FlightCallOptions(timeout=2)))
        return json.loads(results[0].body.to_pybytes())
    except Exception:
        return None
    finally:
        client.close()


def _serve_once(root: Path, home: Path, expected: int, timeout: float = 600) -> tuple[float, float]:
    """(seconds to a health answer, seconds to every row listed) from process start."""
    env = dict(os.environ, TENSOR_SERVER_HOME=str(home), PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensor_server", "serve", str(root), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    location: list[str] = []
    found = threading.Event()

    def pump() -> None:
        for line in proc.stderr:
            if "listening on" in line and not location:
                location.append(line.split("listening on ", 1)[1].split()[0])
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        found.wait(timeout)
        answered = listed = float("nan")
        while location and time.perf_counter() - t0 < timeout:
            h = _health(location[0])
            now = time.perf_counter() - t0
            if h is not None and answered != answered:
                answered = now
            if h is not None and h.get("source_count", 0) >= expected and listed != listed:
                listed = now
            if listed == listed and not h.get("full_scan_in_progress", True):
                break  # the scan is over (its rows stored): the restart then sees an unchanged tree
            time.sleep(0.05)
        return answered, listed
    finally:
        proc.terminate()
        proc.wait(60)


def main(args: argparse.Namespace) -> int:
    base = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="tensor-server-catalog-start-"))
    try:
        root, home = base / "root", base / "home"
        marker = base / f"tree-{args.files}-{args.large}-{args.large_mib}.done"  # a --data-dir tree is reused
        if not marker.exists():
            shutil.rmtree(root, ignore_errors=True)
            make_tree(root, args.files, args.large, args.large_mib)
            marker.touch()
        shutil.rmtree(home, ignore_errors=True)
        for old in base.glob("catalog.duckdb*"):
            old.unlink()
        expected = args.files + args.large
        rows = _catalog_rows(root, expected, str(base / "catalog.duckdb"))
        for run in ("first start", "restart"):
            answered, listed = _serve_once(root, home, expected)
            rows.append(
                {
                    "step": f"serve process, {run}: health answers",
                    "who": "ours",
                    "seconds": answered,
                    "rows": expected,
                    "opened": "",
                }
            )
            rows.append(
                {
                    "step": f"serve process, {run}: all listed",
                    "who": "ours",
                    "seconds": listed,
                    "rows": expected,
                    "opened": "",
                }
            )
        print(
            f"tree: {args.files} small files (npy, tif, h5, mrc) + {args.large} large ({args.large_mib} MiB); "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
        )
        print_table(
            ["step", "who", "seconds", "rows", "opened"],
            [[r["step"], r["who"], f"{r['seconds']:.3f}", r["rows"], r["opened"]] for r in rows],
        )
        write_json(args.json_path, "catalog-start", f"{args.files}+{args.large}", rows)
    finally:
        if not args.data_dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0
