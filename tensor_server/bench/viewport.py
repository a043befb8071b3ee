"""``python -m tensor_server.bench viewport``: what a viewer's screen costs at every zoom of an
image with no stored pyramid, against TensorStore computing the same tiles in-process.

A viewport is up to 9×7 = 63 tiles of 512² at one level (scale factor ``f``), fetched
concurrently (``--concurrency``, 6 by default: a browser's connections per host), as a viewer
does when it lands on that zoom. The image (``--size small``: 8192², ``full``: 32768²) is a uint8
gradient with noise in a zarr v2 array of 512² blosc-zstd chunks and a 512²-tiled zlib TIFF.

* TensorStore (the peer): ``ts.downsample(store, [f, f], "mean")`` and the 63 tile reads issued
  at once (its own thread pool decodes on every core); the store is opened once per level
  before the clock starts, with its cache off, so every level decodes from the file;
* ours over Flight: the biopb SDK's ``get_array(id, slice_hint, scale_hint, "mean")``, one per
  tile, from ``--concurrency`` threads of this process, against a server process of its own
  (``bench/server_process.py``: a client in the server's interpreter competes for its GIL),
  fresh per level (empty chunk cache; the process warmed by a read that shares no chunk with
  any tile, then left to go idle): *cold*, then the same tiles again: *warm* (cache hits);
* ours over HTTP: the IIIF door's 512² JPEG of the same regions (what OpenSeadragon fetches),
  over keep-alive connections (http.client, one per thread), after one untimed tile (the
  tensor's rendering window is computed once); the JPEG encode is ours alone, TensorStore's
  tiles stay raw.

Reported per level: each path's wall time for the whole viewport (``total``: the screen is
drawn when the last tile lands) and per-tile p50; ``ours/ts`` is the cold Flight total over
TensorStore's. Targets (issue 25): total <= 1.0x TensorStore; warm tile p50 <= 3 ms.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.fixtures import default_data_dir
from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["add_arguments", "main", "write_fixtures", "viewport", "TILE"]

TILE = 512
_GRID = (9, 7)  # tiles across, down


def write_fixtures(root: Path, side: int) -> None:
    """The zarr array and the TIFF, written once (the TIFF tile by tile: never the whole image)."""
    import tifffile
    import zarr
    from numcodecs import Blosc

    rng = np.random.default_rng(0)
    ramp = (np.arange(TILE, dtype=np.uint16)[None, :] // 4).astype(np.uint8)

    def tile(row: int, col: int) -> np.ndarray:
        base = (row * 7 + col * 3) % 128
        return (ramp + base + rng.integers(0, 16, (TILE, TILE), dtype=np.uint8)).astype(np.uint8)

    n = side // TILE
    if not (root / "big.zarr" / ".zarray").exists():
        z = zarr.open_array(
            str(root / "big.zarr"),
            mode="w",
            shape=(side, side),
            chunks=(TILE, TILE),
            dtype=np.uint8,
            zarr_format=2,
            compressor=Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE),
        )
        for row in range(n):
            z[row * TILE : (row + 1) * TILE] = np.concatenate([tile(row, col) for col in range(n)], axis=1)
    if not (root / "big.tif").exists():
        src = zarr.open_array(str(root / "big.zarr"), mode="r")
        tiles = (src[r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE] for r in range(n) for c in range(n))
        tifffile.imwrite(
            root / "big.tif",
            tiles,
            shape=(side, side),
            dtype=np.uint8,
            tile=(TILE, TILE),
            compression="zlib",
            photometric="minisblack",
        )


def viewport(side: int, factor: int) -> list[tuple[int, int, int, int]]:
    """(y, x, height, width) in full-resolution pixels of up to 9×7 tiles of 512 level pixels
    around the image centre at ``factor`` (edge tiles clipped to the image)."""
    region = TILE * factor
    n = -(-side // region)
    cols = range(max(0, n // 2 - _GRID[0] // 2), min(n, n // 2 + _GRID[0] - _GRID[0] // 2))
    rows = range(max(0, n // 2 - _GRID[1] // 2), min(n, n // 2 + _GRID[1] - _GRID[1] // 2))
    return [
        (r * region, c * region, min(region, side - r * region), min(region, side - c * region))
        for r in rows
        for c in cols
    ]


def _concurrently(fetch: Callable[[tuple], Any], tiles: list[tuple], workers: int) -> tuple[float, list[float]]:
    """(wall ms of the whole viewport, per-tile ms) with ``workers`` fetches in flight."""

    def timed(t: tuple) -> float:
        t0 = time.perf_counter()
        fetch(t)
        return (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as pool:
        each = list(pool.map(timed, tiles))
    return (time.perf_counter() - t0) * 1e3, each


def _tensorstore_total(path: Path, tiles: list[tuple], factor: int) -> float:
    import tensorstore as ts

    store = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(path)},
            "context": {"cache_pool": {"total_bytes_limit": 0}},
        },
        read=True,
    ).result()
    view = ts.downsample(store, [factor, factor], "mean") if factor > 1 else store
    t0 = time.perf_counter()
    futures = [
        view[y // factor : -(-(y + h) // factor), x // factor : -(-(x + w) // factor)].read() for y, x, h, w in tiles
    ]
    for f in futures:
        f.result()
    return (time.perf_counter() - t0) * 1e3


def _ours(root: Path, kind: str, tiles: list[tuple], factor: int, workers: int) -> dict[str, float]:
    """Cold and warm Flight viewports and a warm IIIF one, on a fresh server process (empty
    chunk cache); the clients are this process's threads, as a viewer's are its own."""
    import http.client
    import threading

    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.server_process import server_process, wait_idle

    path = root / ("big.zarr" if kind == "zarr" else "big.tif")
    with (
        tempfile.TemporaryDirectory(prefix="ts-bench-viewport-") as work,
        server_process([path], Path(work) / "cache") as srv,
    ):
        client = TensorFlightClient(srv.location)
        aid = client.query("SELECT source_id FROM sources").to_pylist()[0]["source_id"]
        aid = client.get_descriptor(aid).array_id  # the tensor id: what a viewer holds after its first describe
        scale = [factor, factor]
        # warm the process (imports, kernels), not the cache: a read no tile shares a chunk
        # with (a scale no level has, so the precacher warms only its own neighbours)
        client.get_array(aid, slice_hint=(slice(0, 1536), slice(0, 1536)), scale_hint=[3, 3], reduction_method="max")
        wait_idle(srv.pid)

        def flight_tile(t: tuple) -> None:
            y, x, h, w = t
            client.get_array(
                aid, slice_hint=(slice(y, y + h), slice(x, x + w)), scale_hint=scale, reduction_method="mean"
            )

        local = threading.local()  # one keep-alive connection per thread, as a browser keeps per host
        host, port = srv.http_url.removeprefix("http://").split(":")

        def iiif_tile(t: tuple) -> None:
            if not hasattr(local, "conn"):
                local.conn = http.client.HTTPConnection(host, int(port), timeout=600)
            y, x, h, w = t
            local.conn.request("GET", f"/iiif/3/{aid}/{x},{y},{w},{h}/{-(-w // factor)},/0/default.jpg")
            r = local.conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"IIIF {r.status}: {body[:200]!r}")

        cold, cold_each = _concurrently(flight_tile, tiles, workers)
        warm, warm_each = _concurrently(flight_tile, tiles, workers)
        iiif_tile(tiles[0])  # the tensor's rendering window, computed once (a viewer's info.json visit)
        iiif, iiif_each = _concurrently(iiif_tile, tiles, workers)  # warm chunks: crop, render, encode
    return {
        "cold_total": cold,
        "cold_p50": float(np.median(cold_each)),
        "warm_total": warm,
        "warm_p50": float(np.median(warm_each)),
        "iiif_total": iiif,
        "iiif_p50": float(np.median(iiif_each)),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, sizes="small: 8192², full: 32768² (2 GiB of fixtures)")
    parser.add_argument("--formats", default="zarr,tiff", help="comma-separated: zarr, tiff")
    parser.add_argument("--concurrency", type=int, default=6, help="tiles in flight (a browser's connections)")


def main(ns: argparse.Namespace) -> int:
    side = 8192 if ns.size == "small" else 32768
    root = Path(ns.data_dir or default_data_dir()) / f"viewport-{side}"
    root.mkdir(parents=True, exist_ok=True)
    write_fixtures(root, side)
    from tensor_server.core.downsample import warm_up

    warm_up()  # as a server does at start: cold means an empty chunk cache, not an unloaded kernel
    load = os.getloadavg()
    headers = [
        "format",
        "scale",
        "tiles",
        "ts total",
        "cold total",
        "ours/ts",
        "cold p50",
        "warm total",
        "warm p50",
        "iiif total",
        "iiif p50",
    ]
    rows, out = [], []
    factor = 1
    while TILE * factor <= side:
        tiles = viewport(side, factor)
        ts_ms = _tensorstore_total(root / "big.zarr", tiles, factor)
        for kind in ns.formats.split(","):
            ours = _ours(root, kind, tiles, factor, ns.concurrency)
            row = {
                "format": kind,
                "scale": factor,
                "tiles": len(tiles),
                "ts_total": ts_ms,
                **ours,
                "ours_over_ts": ours["cold_total"] / ts_ms,
            }
            out.append(row)
            rows.append(
                [
                    kind,
                    factor,
                    len(tiles),
                    ts_ms,
                    ours["cold_total"],
                    row["ours_over_ts"],
                    ours["cold_p50"],
                    ours["warm_total"],
                    ours["warm_p50"],
                    ours["iiif_total"],
                    ours["iiif_p50"],
                ]
            )
            print_table(headers, rows[-1:])
        factor *= 2
    print(
        f"\n{side}² uint8 with no stored pyramid, a viewport of up to 63 512² tiles per level, "
        f"{ns.concurrency} in flight (ms); load average before the run {load[0]:.1f} (2 cores)"
    )
    print(
        "ts = TensorStore downsample 'mean' of the zarr, all tiles issued at once, cache off; cold/warm = ours "
        "over Flight (SDK get_array per tile), fresh server per level; iiif = ours over HTTP, 512² JPEG, warm"
    )
    print_table(headers, rows)
    write_json(ns.json_path, "viewport", ns.size, out)
    return 0
