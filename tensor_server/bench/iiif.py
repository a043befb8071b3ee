"""``python -m tensor_server.bench iiif``: 512² JPEG tiles of every level of a big image with no
stored pyramid, through the IIIF door, cold and warm, beside the decode floor and the naive
on-the-fly peer, in one run.

The image (``--size small``: 8192², ``full``: 32768²) is a uint8 gradient with noise, written
once as a 512²-tiled zlib TIFF and as a zarr v2 array of 512² zstd chunks. For each IIIF scale
factor ``f`` a viewport of up to 9×7 = 63 tiles (region 512·f, output 512) is requested over
HTTP:

* cold: a fresh server with an empty chunk cache per level, after the image's ``info.json``
  (what a viewer asks first; it opens the source). A cold tile is computed from its own
  extent while the precacher fills the level's chunks (``ServingRuntime.level_region``);
* warm: the same tiles again once the precacher has settled (cache hits, crop, JPEG encode);
* floor: read and decode, on all cores, the stored pieces (TIFF tiles, zarr chunk files)
  under each tile's full-resolution extent (``decode_floor``): what no tile server can beat
  without a stored pyramid; ``cold/floor`` is the median ratio over the same tiles;
* peer (tifffile + Pillow per tile, the naive tile server): read the tile's extent from the
  TIFF, reduce with Pillow's box filter, encode.

The floor and the peer read the first ``--peer-tiles`` tiles of each level (a coarse tile's
extent is the whole image). Printed beside them: Cantaloupe's published figures, 30 ms median
per tile from a stored pyramid and 45–50 s per tile from a non-pyramidal TIFF (cantaloupe#455),
and the load average after each row (the figures are only comparable within one run).
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["add_arguments", "main"]

TILE = 512


def _write_fixtures(root: Path, side: int) -> None:
    import tifffile
    import zarr

    rng = np.random.default_rng(0)
    ramp = (np.arange(TILE, dtype=np.uint16)[None, :] // 4).astype(np.uint8)

    def tiles():
        for row in range(side // TILE):
            for col in range(side // TILE):
                base = (row * 7 + col * 3) % 128
                yield (ramp + base + rng.integers(0, 16, (TILE, TILE), dtype=np.uint8)).astype(np.uint8)

    if not (root / "big.tif").exists():  # written aside, then renamed: an interrupted run leaves no half file
        tifffile.imwrite(
            root / "big.tif.partial",
            tiles(),
            shape=(side, side),
            dtype=np.uint8,
            tile=(TILE, TILE),
            compression="zlib",
            photometric="minisblack",
        )
        os.replace(root / "big.tif.partial", root / "big.tif")
    if not (root / "big.zarr").exists():
        src = tifffile.imread(root / "big.tif", aszarr=True)
        z = zarr.create_array(
            str(root / "big.zarr.partial"),
            shape=(side, side),
            chunks=(TILE, TILE),
            dtype=np.uint8,
            zarr_format=2,
            overwrite=True,
        )
        arr = zarr.open(src, mode="r")
        for row in range(0, side, 4 * TILE):
            z[row : row + 4 * TILE] = arr[row : row + 4 * TILE]
        os.replace(root / "big.zarr.partial", root / "big.zarr")


class _Server:
    def __init__(self, root: Path) -> None:
        from tensor_server.cache import CacheManager
        from tensor_server.catalog import Catalog
        from tensor_server.testing import start_serving

        self.catalog = Catalog([root])
        self.catalog.scan()
        self._cache_dir = tempfile.TemporaryDirectory(prefix="ts-bench-iiif-")
        self.cache = CacheManager(self._cache_dir.name)
        self.served = start_serving(self.catalog, cache=self.cache, http=True)
        self.http = self.served.http

    def ids(self) -> dict[str, str]:
        return {r.type: t.array_id for r in self.catalog.records() for t in r.source.tensors.values()}

    def close(self) -> None:
        self.served.stop()
        self.cache.close()
        self.catalog.close()
        self._cache_dir.cleanup()


def _viewport(side: int, factor: int) -> list[tuple[int, int, int]]:
    """(x, y, region side) of up to 9×7 tiles around the image centre at ``factor``."""
    region = TILE * factor
    n = -(-side // region)
    cols = range(max(0, n // 2 - 4), min(n, n // 2 + 5))
    rows = range(max(0, n // 2 - 3), min(n, n // 2 + 4))
    return [(c * region, r * region, region) for r in rows for c in cols]


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _served_times(root: Path, kind: str, side: int, factor: int, settle_s: float) -> dict[str, Any]:
    """Cold then warm ms per tile of the viewport at ``factor`` through a fresh server, and
    the seconds the precacher took to settle in between."""
    import http.client
    import json

    server = _Server(root)
    # http.client with keep-alive, as the http bench: the least client work in this process,
    # whose Python shares one interpreter lock with the server's (httpx cost 0.2-0.65 ms more
    # per warm tile, a third of it)
    conn = http.client.HTTPConnection("127.0.0.1", server.http.port, timeout=600)

    def get(path: str) -> bytes:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status}: {body[:200]!r}")
        return body

    try:
        array_id = next(v for k, v in server.ids().items() if kind in k)
        out: dict[str, Any] = {"cold": [], "warm": []}
        t0 = time.perf_counter()  # what a viewer asks first: opens the source, no pixels
        json.loads(get(f"/iiif/3/{array_id}/info.json"))
        out["info"] = (time.perf_counter() - t0) * 1e3
        for phase in ("cold", "warm"):
            if phase == "warm":
                out["settle"] = _settle(server.served.runtime, settle_s)
            for x, y, region in _viewport(side, factor):
                w, h = min(region, side - x), min(region, side - y)
                size = f"{-(-w // factor)},{-(-h // factor)}"
                t0 = time.perf_counter()
                get(f"/iiif/3/{array_id}/{x},{y},{w},{h}/{size}/0/default.jpg")
                out[phase].append((time.perf_counter() - t0) * 1e3)
        return out
    finally:
        conn.close()
        server.close()


def _settle(runtime: Any, limit_s: float) -> float:
    """Wait (up to ``limit_s``) until the precacher has warmed what the cold pass queued:
    warm means every tile is a cache hit and nothing else is computing."""
    t0 = time.perf_counter()
    while runtime.precacher is not None and not runtime.precacher.idle() and time.perf_counter() - t0 < limit_s:
        time.sleep(0.05)
    return time.perf_counter() - t0


def _peer_times(tif: Path, side: int, factor: int, cap: int) -> list[float]:
    """Whole-tile ms of tifffile + Pillow per tile (read the extent, box-reduce, encode)."""
    import tifffile
    import zarr
    from PIL import Image

    store = tifffile.imread(tif, aszarr=True)
    arr = zarr.open(store, mode="r")
    whole = []
    for x, y, region in _viewport(side, factor)[:cap]:
        t0 = time.perf_counter()
        block = arr[y : y + region, x : x + region]
        image = Image.fromarray(np.ascontiguousarray(block))
        if factor > 1:
            image = image.resize((-(-block.shape[1] // factor), -(-block.shape[0] // factor)), Image.Resampling.BOX)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        whole.append((time.perf_counter() - t0) * 1e3)
    store.close()
    return whole


def _floor_times(root: Path, kind: str, side: int, factor: int, cap: int) -> list[float]:
    """ms to read and decode (all cores) the stored pieces under each tile's extent, first tile
    first: the least a cold tile can cost (``decode_floor``)."""
    from tensor_server.bench.decode_floor import tiff_extent_floor, zarr_extent_floor

    floor = tiff_extent_floor(root / "big.tif") if kind == "tiff" else zarr_extent_floor(root / "big.zarr")
    out = []
    for x, y, region in _viewport(side, factor)[:cap]:
        t0 = time.perf_counter()
        floor(x, y, min(region, side - x), min(region, side - y))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


#: Cantaloupe's published per-tile figures (cantaloupe#455, its docs): median from a stored
#: pyramid, and the range from a non-pyramidal TIFF
CANTALOUPE_PYRAMID_MS = 30.0
CANTALOUPE_NO_PYRAMID_MS = (45_000.0, 50_000.0)
_HEAD = [
    "format",
    "scale",
    "tiles",
    "cold 1st",
    "floor 1st",
    "1st/floor",
    "cold p50",
    "cold p99",
    "floor p50",
    "cold/floor",
    "info",
    "warm p50",
    "warm p99",
    "peer p50",
    "peer p99",
    "settle s",
    "load",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=("small", "full"), default="small", help="small: 8192², full: 32768²")
    parser.add_argument("--data-dir", help="where the fixtures are written once (default: a temporary folder)")
    parser.add_argument(
        "--peer-tiles",
        type=int,
        default=9,
        help="tiles the peer and the floor read per level "
        "(a coarse tile's extent is the whole image at full resolution)",
    )
    parser.add_argument("--formats", default="tiff,zarr", help="comma-separated: tiff, zarr")
    parser.add_argument("--scales", help="comma-separated scale factors (default: every level)")
    parser.add_argument(
        "--settle", type=float, default=120.0, help="seconds to wait for the precacher before the warm pass"
    )
    parser.add_argument("--json", dest="json_path")


def main(ns: argparse.Namespace) -> int:
    side = 8192 if ns.size == "small" else 32768
    root = Path(ns.data_dir or Path(tempfile.gettempdir()) / "ts-bench-iiif-data") / f"iiif-{side}"  # kept: reused
    root.mkdir(parents=True, exist_ok=True)
    _write_fixtures(root, side)
    from tensor_server.adapters.memory import ArrayAdapter
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.level_grid import published_levels

    warm_up()  # the kernels, as ``serve`` loads them at start: not a cost of the first scaled tile

    plane = ArrayAdapter(np.broadcast_to(np.uint16(0), (side, side)), "yx")  # the levels IIIF advertises
    factors = [int(f) for f in ns.scales.split(",")] if ns.scales else [lv.scale[0] for lv in published_levels(plane)]
    rows, out = [], []
    for factor in factors:
        peer = _peer_times(root / "big.tif", side, factor, ns.peer_tiles)
        for kind in ns.formats.split(","):
            floor = _floor_times(root, kind, side, factor, ns.peer_tiles)
            got = _served_times(root, kind, side, factor, ns.settle)
            cold, warm = got["cold"], got["warm"]
            row = {
                "format": kind,
                "scale": factor,
                "tiles": len(cold),
                "cold_first": cold[0],
                "floor_first": floor[0],
                "first_over_floor": cold[0] / floor[0],
                "cold_p50": _pct(cold, 50),
                "cold_p99": _pct(cold, 99),
                "floor_p50": _pct(floor, 50),
                "cold_over_floor": float(np.median([c / f for c, f in zip(cold, floor)])),
                "info": got["info"],
                "warm_p50": _pct(warm, 50),
                "warm_p99": _pct(warm, 99),
                "peer_p50": _pct(peer, 50),
                "peer_p99": _pct(peer, 99),
                "settle_s": got["settle"],
                "load": os.getloadavg()[0],
            }
            out.append(row)
            rows.append(list(row.values()))
            print_table(_HEAD, rows[-1:])
    print(
        f"\n{side}² uint8, 512² JPEG tiles over HTTP (ms), {os.cpu_count()} cores; cold: a fresh server per "
        f"level, after its info.json (info: ms); warm: the same tiles once the precacher settled; floor: read + decode (all cores) of the stored "
        f"pieces under the tile's extent; cold/floor: the median over the floor's tiles of cold / floor; peer: tifffile + Pillow per tile (first {ns.peer_tiles} tiles per level); "
        "load: 1-min load average after the row"
    )
    print_table(_HEAD, rows)
    print(
        f"Cantaloupe (published, cantaloupe#455): {CANTALOUPE_PYRAMID_MS:g} ms median per tile from a stored "
        f"pyramid; {CANTALOUPE_NO_PYRAMID_MS[0] / 1e3:g}-{CANTALOUPE_NO_PYRAMID_MS[1] / 1e3:g} s per tile without one"
    )
    write_json(ns.json_path, "iiif", ns.size, out)
    return 0
