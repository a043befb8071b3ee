"""``python -m tensor_server.bench remote``: a viewer's first view of an image by URL, against
zarr-python and tifffile reading the same URLs over fsspec (issue 43).

The host is ``testing/range_host.py`` on loopback with ``--latency`` (50 ms) per request and
a request counter, serving an OME-Zarr 0.5 (zarr v3, sharded: 4 × 4 inner chunks of one
tile each) and a tiled OME-TIFF (SubIFD levels), both a uint16 image with a pyramid at
factors 2, 4, ... whose coarsest level is exactly 7 × 9 tiles (``--size small``: 256² tiles,
2 levels, 3584 × 4608; ``full``: 4 levels, 14336 × 18432).

The first view is what a tiled viewer asks when it opens the image: the 63 tiles of the
coarsest level (the whole image on a screen), then the 63 tiles at level 0 in the top-left
corner. Ours: a server process (``bench/server_process.py``) serving the two URLs as roots,
and local copies of the two files, read by the biopb SDK, ``--concurrency`` in flight (no
client cache), timed from the first read asked to the last answered, after the server listed
the sources (its scan opened them). ``--reads views``: a view is one read (as a notebook asks);
``tiles``: a view is its 63 tile reads (as a viewer asks). Sessions:

* cold: an empty byte cache (the server's home) and chunk cache;
* second: the server restarted over the same home and chunk cache (what a restart is);
* second, bytes only: restarted over the same home (the persistent byte cache) with an empty
  chunk cache, so what answers is the byte cache, every chunk computed again;
* local file, second (the floor): the local copies' second session, what a cached read costs
  when no host is involved; a remote second session can be no cheaper than this.

The peers, in the same run and over the same URLs, read the way ours does: ``views``, each
view one selection (zarr-python over ``FsspecStore``: zarr fetches the shards concurrently;
tifffile over an ``fsspec.open`` file: ``asarray`` of a whole level, else a selection of its
zarr store); ``tiles``, each tile one selection, ``--concurrency`` in flight. They have no
persistent cache (no second session). What each pays per tile differs: zarr-python asks the
host for the shard index and the chunk, every tile (2 requests, 50 ms each); tifffile reads
through fsspec's read-ahead cache (5 MiB blocks), so its 126 tiles cost the host 6 requests
and the tile mode is as cheap for it as the view mode. Against that peer the per-tile cost is
ours alone, which is why the floor row is there. Opens are untimed (as ours); requests are
counted for open and view separately.

Then ``warm``: after the cold first view, the ``warm`` action (one per tile, so it plans the
chunks the tile's read will) fills the chunk cache with the next finer level's bottom-right 63
tiles, and those tiles are read: the zoom is a cache hit when the host saw no request and the
chunk cache counted no miss during it (counts, not time).

Targets (issue 43): cold first view <= 1.0 x the direct peer, second session <= 0.05 x. Read
tile by tile, a second session is bounded by the floor row (``vs floor`` near 1 x): each tile
is two SDK round trips (plan, then the chunk's location) costing about 1 ms of server and
1 ms of client CPU with no host involved, whatever the peer's requests cost.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["add_arguments", "main", "measure", "write_images", "GRID"]

#: a viewport's tiles: rows, columns (a 2304 × 1792 screen of 256² tiles)
GRID = (7, 9)
#: ``--size``: (tile side, levels)
SIZES = {"small": (256, 2), "full": (256, 4)}
TARGETS = {"cold": 1.0, "second": 0.05}
#: a level the file stores is read as stored
METHOD = "precompute"
ZARR, TIFF = "image.ome.zarr", "image.ome.tif"


def write_images(folder: Path, tile: int, levels: int) -> list[np.ndarray]:
    """The OME-Zarr and the OME-TIFF of the same image (module docstring); its levels."""
    import tifffile
    import zarr

    coarsest = (GRID[0] * tile, GRID[1] * tile)
    shape = tuple(n * 2 ** (levels - 1) for n in coarsest)
    rng = np.random.default_rng(43)
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    image = ((yy.astype(np.uint32) * 7 + xx.astype(np.uint32) * 3) % 40000).astype(np.uint16)
    image += rng.integers(0, 2000, shape, dtype=np.uint16)  # full: 0.5 GB, never an int64 copy
    pyramid = [np.ascontiguousarray(image[:: 2**k, :: 2**k]) for k in range(levels)]
    root = zarr.open_group(str(folder / ZARR), mode="w", zarr_format=3)
    for k, level in enumerate(pyramid):
        root.create_array(str(k), data=level, chunks=(tile, tile), shards=(4 * tile, 4 * tile))
    axes = [{"name": a, "type": "space", "unit": "micrometer"} for a in "yx"]
    datasets = [
        {"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [2.0**k, 2.0**k]}]}
        for k in range(levels)
    ]
    root.attrs["ome"] = {"version": "0.5", "multiscales": [{"name": "image", "axes": axes, "datasets": datasets}]}
    with tifffile.TiffWriter(folder / TIFF, ome=True) as tw:
        options = {"tile": (tile, tile), "compression": "zlib"}
        tw.write(pyramid[0], subifds=levels - 1, metadata={"axes": "YX"}, **options)
        for level in pyramid[1:]:
            tw.write(level, subfiletype=1, **options)
    return pyramid


def tiles_of(tile: int, factor: int, level_shape: tuple[int, int], corner: str) -> list[tuple[int, int, int, int]]:
    """(y, x, height, width) in level-0 pixels of the 7 × 9 tiles of the level at ``factor``
    in its ``corner`` ("top-left" or "bottom-right")."""
    rows, cols = (-(-n // tile) for n in level_shape)
    r0, c0 = (0, 0) if corner == "top-left" else (max(0, rows - GRID[0]), max(0, cols - GRID[1]))
    out = []
    for r in range(r0, min(rows, r0 + GRID[0])):
        for c in range(c0, min(cols, c0 + GRID[1])):
            h, w = min(tile, level_shape[0] - r * tile), min(tile, level_shape[1] - c * tile)
            out.append((r * tile * factor, c * tile * factor, h * factor, w * factor))
    return out


def _box(tiles: list[tuple[int, int, int, int]], factor: int) -> tuple[slice, slice]:
    """The level's selection the tiles cover together."""
    y0, x0 = min(t[0] for t in tiles), min(t[1] for t in tiles)
    y1, x1 = max(t[0] + t[2] for t in tiles), max(t[1] + t[3] for t in tiles)
    return slice(y0 // factor, y1 // factor), slice(x0 // factor, x1 // factor)


# ---- ours ----------------------------------------------------------------------------------------
def _array_ids(location: str) -> dict[str, str]:
    """kind ("zarr", "tiff", "zarr local", "tiff local") -> the image's array id (a level is a
    ``scale_hint`` of it), of the sources the server lists."""
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(location)
    out: dict[str, str] = {}
    for row in client.query("SELECT source_id, source_url FROM sources").to_pylist():
        url = str(row["source_url"])
        kind = ("zarr" if url.endswith(ZARR) else "tiff") + (" local" if url.startswith("file:") else "")
        out[kind] = client.get_descriptor(row["source_id"]).array_id
    return out


def _read_tiles(client: Any, aid: str, tiles: list[tuple], factor: int, workers: int) -> tuple[float, dict]:
    """(wall ms, {tile: pixels}) of the tiles read ``workers`` at a time."""

    def one(t: tuple) -> np.ndarray:
        y, x, h, w = t
        return np.asarray(
            client.get_array(
                aid,
                slice_hint=(slice(y, y + h), slice(x, x + w)),
                scale_hint=[factor, factor],
                reduction_method=METHOD,
            )
        )

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as pool:
        got = dict(zip(tiles, pool.map(one, tiles)))
    return (time.perf_counter() - t0) * 1e3, got


def _stats(client: Any) -> dict[str, Any]:
    from pyarrow import flight

    return json.loads(list(client._client.do_action(flight.Action("cache_stats", b"")))[0].body.to_pybytes())


def _warm(client: Any, aid: str, tiles: list[tuple], factor: int, workers: int) -> dict[str, int]:
    """The ``warm`` action for each tile, as the tile's read will plan it (a region of many
    tiles plans on the transfer grid, a tile on the tile grid: other chunk ids at level 0)."""
    from pyarrow import flight

    def one(t: tuple) -> dict[str, int]:
        y, x, h, w = t
        body = {"array_id": aid, "region": [[y, y + h], [x, x + w]], "scale": [factor, factor]}
        records = list(client._client.do_action(flight.Action("warm", json.dumps({**body, "method": METHOD}).encode())))
        return json.loads(records[-1].body.to_pybytes())

    with cf.ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, tiles))
    return {k: sum(d[k] for d in done) for k in ("total", "computed")}


def _session(
    host: Any, roots: dict[str, str], home: Path, cache: Path, views: dict, ns: Any, name: str
) -> dict[str, Any]:
    """One server session over the roots (the URLs and the local copies): per kind it reads
    (``SESSIONS``) the first view's times, requests and pixels; and, in the cold session, what
    warming the next level and zooming to it cost."""
    from biopb.tensor import TensorFlightClient

    from tensor_server.bench.server_process import server_process

    host.reset()
    env = {**os.environ, "TENSOR_SERVER_HOME": str(home)}
    out: dict[str, Any] = {}
    config = home.parent / "bench-remote.toml"
    config.write_text("[cache]\nprecache_bytes = 0\n")  # the zoom's hits are the warm action's, nothing else's
    with server_process(list(roots.values()), cache, "--config", str(config), env=env) as srv:
        ids = _array_ids(srv.location)
        out["open_requests"] = {kind: host.count(prefix=f"/{ZARR if kind == 'zarr' else TIFF}") for kind in roots}
        client = TensorFlightClient(srv.location, cache_bytes=0)
        for kind in SESSIONS[name][2]:
            host.reset()
            ms, pixels = {}, {}
            for view, (factor, tiles) in views["first"].items():
                ms[view], pixels[view] = _read_tiles(client, ids[kind], tiles, factor, ns.concurrency)
            out[kind] = {"ms": ms, "requests": host.count(), "pixels": pixels}
            if name == "cold" and kind in ("zarr", "tiff"):
                out[kind]["warm"] = _warm_and_zoom(host, client, ids[kind], views["next"], ns.concurrency)
    return out


def _warm_and_zoom(host: Any, client: Any, aid: str, view: tuple, workers: int) -> dict[str, int]:
    factor, tiles = view
    host.reset()
    done = _warm(client, aid, tiles, factor, workers)
    warm_requests = host.count()
    host.reset()
    misses = _stats(client)["misses"]
    _read_tiles(client, aid, tiles, factor, workers)
    return {
        "chunks": done["total"],
        "computed": done["computed"],
        "warm_requests": warm_requests,
        "zoom_requests": host.count(),
        "zoom_misses": _stats(client)["misses"] - misses,
    }


# ---- the peers -----------------------------------------------------------------------------------
def _each_tile(read: Callable[[int, tuple[slice, slice]], np.ndarray], views: dict, workers: int) -> dict:
    """``--reads tiles``: each view assembled from its tiles, each tile one ``read(factor,
    level selection)``, ``workers`` in flight (what a viewer reading the host directly does)."""
    out = {}
    for name, (f, tiles) in views.items():
        box = _box(tiles, f)
        whole = np.empty((box[0].stop - box[0].start, box[1].stop - box[1].start), np.uint16)

        def one(t: tuple, f: int = f, box: tuple = box, whole: np.ndarray = whole) -> None:
            ys, xs = slice(t[0] // f, (t[0] + t[2]) // f), slice(t[1] // f, (t[1] + t[3]) // f)
            whole[
                ys.start - box[0].start : ys.stop - box[0].start, xs.start - box[1].start : xs.stop - box[1].start
            ] = read(f, (ys, xs))

        with cf.ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, tiles))
        out[name] = whole
    return out


def _zarr_peer(url: str, views: dict, reads: str, workers: int) -> tuple[Callable[[], None], Callable[[], dict]]:
    """(open, view): zarr-python over fsspec's HTTP filesystem; a view one selection, or (tiles)
    one selection a tile."""
    import zarr
    from zarr.storage import FsspecStore

    arrays: dict[int, Any] = {}

    def open_() -> None:
        store = FsspecStore.from_url(url, read_only=True)
        group = zarr.open_group(store, mode="r")
        for factor, _ in views.values():
            arrays[factor] = group[str(factor.bit_length() - 1)]

    def view() -> dict:
        if reads == "tiles":
            return _each_tile(lambda f, box: np.asarray(arrays[f][box]), views, workers)
        return {name: np.asarray(arrays[f][_box(tiles, f)]) for name, (f, tiles) in views.items()}

    return open_, view


def _tiff_peer(url: str, views: dict, reads: str, workers: int) -> tuple[Callable[[], None], Callable[[], dict]]:
    """(open, view): tifffile over an ``fsspec.open`` file (fsspec's default read-ahead cache of
    5 MiB blocks: a tile read fetches its neighbours' bytes too); a view ``asarray`` of a whole
    level or a selection of its zarr store, or (tiles) one selection of the store a tile."""
    import fsspec
    import tifffile
    import zarr

    state: dict[str, Any] = {}

    def open_() -> None:
        state["fh"] = fsspec.open(url, "rb").open()
        state["tf"] = tifffile.TiffFile(state["fh"])
        state["series"] = state["tf"].series[0]
        levels = {f.bit_length() - 1 for f, _ in views.values()}
        state["zarr"] = {k: zarr.open_array(state["series"].aszarr(level=k), mode="r") for k in levels}

    def view() -> dict:
        if reads == "tiles":
            out = _each_tile(lambda f, box: np.asarray(state["zarr"][f.bit_length() - 1][box]), views, workers)
            state["fh"].close()
            return out
        out = {}
        for name, (f, tiles) in views.items():
            k = f.bit_length() - 1
            box = _box(tiles, f)
            if (box[0].stop - box[0].start, box[1].stop - box[1].start) == tuple(state["series"].levels[k].shape):
                out[name] = state["series"].levels[k].asarray()
            else:
                out[name] = np.asarray(state["zarr"][k][box])
        state["fh"].close()
        return out

    return open_, view


def _peer(host: Any, make: Callable, url: str, views: dict, reads: str, workers: int) -> dict[str, Any]:
    host.reset()
    open_, view = make(url, views, reads, workers)
    open_()
    opened = host.count()
    host.reset()
    t0 = time.perf_counter()
    pixels = view()
    return {"ms": (time.perf_counter() - t0) * 1e3, "open_requests": opened, "requests": host.count(), "pixels": pixels}


# ---- the run -------------------------------------------------------------------------------------
def _views(tile: int, levels: int, shape: tuple[int, int], reads: str) -> dict[str, Any]:
    """The first view's two views and the next level's, each (factor, tiles); ``reads``
    "views": each view's tiles as one region (one read, as the peers read)."""
    coarse = 2 ** (levels - 1)
    nxt = 2 ** (levels - 2)

    def view(factor: int, corner: str) -> tuple[int, list[tuple[int, int, int, int]]]:
        tiles = tiles_of(tile, factor, (shape[0] // factor, shape[1] // factor), corner)
        if reads == "views":
            (ys, xs) = _box(tiles, factor)
            tiles = [
                (ys.start * factor, xs.start * factor, (ys.stop - ys.start) * factor, (xs.stop - xs.start) * factor)
            ]
        return factor, tiles

    return {
        "first": {"coarsest": view(coarse, "top-left"), "level-0 corner": view(1, "top-left")},
        "next": view(nxt, "bottom-right"),
    }


@contextmanager
def _hosted(tile: int, levels: int, latency: float) -> Iterator[tuple[Any, list[np.ndarray]]]:
    from tensor_server.testing.range_host import range_host

    with tempfile.TemporaryDirectory(prefix="ts-bench-remote-") as work:
        folder = Path(work) / "host"
        folder.mkdir()
        pyramid = write_images(folder, tile, levels)
        with range_host(folder, latency=latency) as host:
            host.work = Path(work)
            yield host, pyramid


def _same(ours: dict, theirs: dict, views: dict) -> bool:
    """Whether the tiles ours answered equal the peer's view, pixel for pixel."""
    for name, (factor, tiles) in views.items():
        box = _box(tiles, factor)
        for t, got in ours[name].items():
            y, x = t[0] // factor - box[0].start, t[1] // factor - box[1].start
            if not np.array_equal(got, theirs[name][y : y + got.shape[0], x : x + got.shape[1]]):
                return False
    return True


#: the sessions over one home (module docstring): name -> chunk cache folder, target ratio, the
#: kinds read (the local copies' cold read fills the chunk cache their second read is answered by)
SESSIONS = {
    "cold": ("chunks-1", TARGETS["cold"], ("zarr", "tiff", "zarr local", "tiff local")),
    "second": ("chunks-1", TARGETS["second"], ("zarr", "tiff", "zarr local", "tiff local")),
    "second, bytes only": ("chunks-2", None, ("zarr", "tiff")),
}


def measure(tile: int, levels: int, latency: float, concurrency: int = 8, reads: str = "tiles") -> dict[str, Any]:
    """Every contender's first view, request counts and the warm check (module docstring)."""
    ns = argparse.Namespace(concurrency=concurrency)
    with _hosted(tile, levels, latency) as (host, pyramid):
        urls = {"zarr": f"{host.url}/{ZARR}", "tiff": f"{host.url}/{TIFF}"}
        local = host.work / "local"
        shutil.copytree(host.root, local)
        roots = {**urls, "zarr local": str(local / ZARR), "tiff local": str(local / TIFF)}
        views = _views(tile, levels, pyramid[0].shape, reads)
        sessions = {
            name: _session(host, roots, host.work / "home", host.work / chunks, views, ns, name)
            for name, (chunks, *_) in SESSIONS.items()
        }
        peers = {
            "zarr": _peer(host, _zarr_peer, urls["zarr"], views["first"], reads, concurrency),
            "tiff": _peer(host, _tiff_peer, urls["tiff"], views["first"], reads, concurrency),
        }
    warm = {k: sessions["cold"][k]["warm"] for k in ("zarr", "tiff")}
    return {"rows": _rows(sessions, peers, views["first"]), "warm": warm, "shape": pyramid[0].shape}


def _rows(sessions: dict[str, dict], peers: dict[str, dict], views: dict) -> list[dict[str, Any]]:
    """The table: per format, each session of ours against the peer and against our floor (the
    local copy's second session), the floor, then the peer."""
    rows = []
    for kind, peer_name in (("zarr", "zarr-python + fsspec"), ("tiff", "tifffile + fsspec")):
        peer = peers[kind]
        floor = sessions["second"][f"{kind} local"]
        contenders = [
            (f"ours, {name}", got[kind], got["open_requests"][kind], SESSIONS[name][1])
            for name, got in sessions.items()
        ]
        contenders.append(("ours, local file, second (floor)", floor, 0, None))
        for contender, ours, opened, target in contenders:
            total = sum(ours["ms"].values())
            rows.append(
                {
                    "format": kind,
                    "contender": contender,
                    **{f"{v} ms": round(ms, 1) for v, ms in ours["ms"].items()},
                    "first view ms": round(total, 1),
                    "vs peer": f"{total / peer['ms']:.3f}x",
                    "vs floor": f"{total / sum(floor['ms'].values()):.2f}x",
                    "target": "" if target is None else f"<= {target}x",
                    "open requests": opened,
                    "view requests": ours["requests"],
                    "equal": _same(ours["pixels"], peer["pixels"], views),
                }
            )
        rows.append(
            {
                "format": kind,
                "contender": peer_name,
                **{f"{v} ms": "" for v in views},
                "first view ms": round(peer["ms"], 1),
                "vs peer": "1x",
                "vs floor": f"{peer['ms'] / sum(floor['ms'].values()):.2f}x",
                "target": "peer",
                "open requests": peer["open_requests"],
                "view requests": peer["requests"],
                "equal": True,
            }
        )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=tuple(SIZES), default="small", help="small: 3584 × 4608; full: 14336 × 18432")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the host waits per request")
    parser.add_argument("--concurrency", type=int, default=8, help="tiles in flight from the viewer")
    parser.add_argument(
        "--reads", choices=("views", "tiles"), default="views", help="ours: a read per view (as the peers), or per tile"
    )
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(ns: argparse.Namespace) -> int:
    tile, levels = SIZES[ns.size]
    load = os.getloadavg()
    result = measure(tile, levels, ns.latency, ns.concurrency, ns.reads)
    print(
        f"{result['shape'][0]} x {result['shape'][1]} uint16, {levels} levels, {tile}² tiles, a host on loopback "
        f"at {ns.latency * 1e3:.0f} ms per request; ours read {'per tile, ' + str(ns.concurrency) + ' in flight' if ns.reads == 'tiles' else 'per view'}; load average before the run "
        f"{load[0]:.1f} ({os.cpu_count()} cores)"
    )
    rows = result["rows"]
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    for kind, w in result["warm"].items():
        print(
            f"{kind}: warm of the next level's {w['chunks']} chunks made {w['warm_requests']} requests; the zoom "
            f"to them made {w['zoom_requests']} requests and {w['zoom_misses']} chunk-cache misses"
        )
    write_json(ns.json_path, "remote", f"{ns.size}-{ns.reads}", [*rows, {"warm": result["warm"]}])
    return 0
