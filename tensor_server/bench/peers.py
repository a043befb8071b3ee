"""``python -m tensor_server.bench peers``: the same plane reads done by what a user would
pick instead, measured in the same run, with the ratio ours/peer per row (< 1: we are faster).

Peers: TensorStore's ``downsample`` driver over the same zarr (mean / stride), zarr-python +
NumPy reshape-mean / stride, tifffile + NumPy for the TIFF. Ours is the adapter path
(``tensor_server.open(...).tensor().get_scaled_data``), warm and cold as in plane-latency.
Every row also times the *decode floor* (``decode_floor.py``: only decoding the plane's chunks
or tiles on all cores, the limit a scaled read can approach) and ours/floor. Ours, the peer
and the floor are timed alternately, repeat by repeat, so background load hits all three.
A second table (``--tables zarr``, in ``all`` too) runs ours against TensorStore on every zarr
layout of issue 25 (``fixtures.zarr_layouts``: v2 and v3, half- and eighth-plane chunks, v3
shards of thirty-second chunks), warm and cold, with the decode floor (libblosc2 / numcodecs) timed in each
row; once per layout the floor's other candidates (TensorStore's and ``zarrs``' whole reads)
are timed against it, and the table says which decoder is the floor's best.
Peers reduce with their own edge rules (TensorStore: partial blocks averaged over the
valid part; NumPy: the ragged edge cropped); at these sizes every scale divides the plane,
so all compute the same pixels.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from tensor_server.bench.decode_floor import tiff_decode_floor, zarr_decode_floor, zarr_floor_candidates
from tensor_server.bench.timing import Progress, add_common_arguments, alternating_median_ms, print_table, write_json

__all__ = ["run_peers"]

SCALES = (4, 16, 32)


def _numpy_reduce(a: np.ndarray, s: int, method: str) -> np.ndarray:
    if method == "nearest":
        return a[::s, ::s].copy()
    n0, n1 = (a.shape[0] // s) * s, (a.shape[1] // s) * s
    return a[:n0, :n1].reshape(n0 // s, s, n1 // s, s).mean(axis=(1, 3))


_HEADERS = [
    "format",
    "peer",
    "scale",
    "method",
    "ours cold",
    "peer cold",
    "ours/peer",
    "floor cold",
    "ours/floor",
    "ours warm",
    "peer warm",
    "ours/peer",
    "floor warm",
    "ours/floor",
]


def _time_row(
    fx,
    peer_fn: Callable[[], Any],
    floor_fn: Callable[[], Any],
    s: int,
    method: str,
    cold_repeats: int,
    warm_repeats: int,
) -> dict[str, float]:
    """One row: ours (open + scaled read), the peer and the floor, alternately, cold then warm."""
    import tensor_server
    from tensor_server.bench.fixtures import drop_page_cache
    from tensor_server.core import Bounds

    holder = {}

    def reopen():
        if "t" in holder:
            holder["t"].close()
        holder["t"] = tensor_server.open(fx.path).tensor()

    reopen()
    b = Bounds.full(holder["t"].shape)
    timed = {"ours": lambda: holder["t"].get_scaled_data(b, (s, s), method), "peer": peer_fn, "floor": floor_fn}

    def cold_start(name):
        drop_page_cache(fx.files)
        if name == "ours":
            reopen()

    cold = alternating_median_ms(timed, cold_repeats, before=cold_start)
    for f in timed.values():
        f()
    warm = alternating_median_ms(timed, warm_repeats)
    holder["t"].close()
    row = {}
    for when, t in (("cold", cold), ("warm", warm)):
        row.update(
            {
                f"ours_{when}_ms": t["ours"],
                f"peer_{when}_ms": t["peer"],
                f"floor_{when}_ms": t["floor"],
                f"ratio_{when}": t["ours"] / t["peer"],
                f"ratio_floor_{when}": t["ours"] / t["floor"],
            }
        )
    return row


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print_table(
        _HEADERS,
        [
            [
                r["format"],
                r["peer"],
                r["scale"],
                r["method"],
                *[
                    v
                    for when in ("cold", "warm")
                    for v in (
                        r[f"ours_{when}_ms"],
                        r[f"peer_{when}_ms"],
                        f"{r[f'ratio_{when}']:.2f}",
                        r[f"floor_{when}_ms"],
                        f"{r[f'ratio_floor_{when}']:.2f}",
                    )
                ],
            ]
            for r in rows
        ],
    )


def run_zarr_peers(
    size: str = "small", data_dir: str | None = None, cold_repeats: int = 3, warm_repeats: int = 5
) -> list[dict[str, Any]]:
    """The zarr table (module docstring): ours vs TensorStore and the decode floor per layout."""
    import os

    import tensorstore as ts

    from tensor_server.bench.fixtures import drop_page_cache, zarr_layouts

    layouts = zarr_layouts(size, data_dir)
    rows, floors = [], []
    progress = Progress(len(layouts) * len(SCALES) * 2)
    for fx in layouts:
        candidates = zarr_floor_candidates(fx.path)
        for f in candidates.values():
            f()
        best = {
            "warm": alternating_median_ms(candidates, warm_repeats),
            "cold": alternating_median_ms(candidates, cold_repeats, before=lambda name: drop_page_cache(fx.files)),
        }
        floors.append([fx.name, *[f"{name} {best[w][name]:.0f}" for w in ("cold", "warm") for name in candidates]])
        driver = "zarr3" if (fx.path / "zarr.json").is_file() else "zarr"
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(fx.path)}}
        for s in SCALES:
            for method in ("area", "nearest"):

                def tsread(s=s, method=method):
                    store = ts.open(spec, read=True).result()
                    return ts.downsample(store, [s, s], "stride" if method == "nearest" else "mean").read().result()

                row = {
                    "format": fx.name,
                    "peer": "tensorstore downsample",
                    "scale": s,
                    "method": method,
                    "load_average": os.getloadavg()[0],
                }
                row.update(
                    _time_row(fx, tsread, candidates["libblosc2/numcodecs"], s, method, cold_repeats, warm_repeats)
                )
                rows.append(row)
                progress.step(f"{fx.name} x{s} {method}")
    progress.close()
    print(
        "\nzarr layouts: decode-floor candidates (median ms, cold then warm; the floor column is libblosc2/numcodecs)"
    )
    for line in floors:
        print("  " + "; ".join(line))
    _print_rows(rows)
    return rows


def run_peers(
    size: str = "small",
    data_dir: str | None = None,
    json_path: str | None = None,
    cold_repeats: int = 3,
    warm_repeats: int = 5,
    tables: str = "all",
    formats: tuple[str, ...] = ("ome-zarr", "ome-tiff"),
) -> list[dict[str, Any]]:
    import os

    from tensor_server.core.downsample import warm_up

    warm_up()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    if tables in ("all", "plane"):
        rows += _run_plane_peers(size, data_dir, cold_repeats, warm_repeats, formats)
    if tables in ("all", "zarr"):
        rows += run_zarr_peers(size, data_dir, cold_repeats, warm_repeats)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    write_json(json_path, "peers", size, rows)
    return rows


def _run_plane_peers(
    size: str, data_dir: str | None, cold_repeats: int, warm_repeats: int, formats: tuple[str, ...]
) -> list[dict[str, Any]]:
    import tifffile
    import zarr

    from tensor_server.bench.fixtures import make_fixtures

    fixtures = {f.name: f for f in make_fixtures(size, data_dir, with_czi=False)}
    jobs: list[tuple[str, str, int, str, Callable[[], Any]]] = []
    zfx, tfx = fixtures["ome-zarr"], fixtures["ome-tiff"]
    try:
        import tensorstore as ts
    except ImportError:  # peers that are not installed are skipped, not fatal
        ts = None
    for s in SCALES:
        for method in ("nearest", "area"):
            if ts is not None and "ome-zarr" in formats:

                def tsread(s=s, method=method):
                    store = ts.open(
                        {"driver": "zarr", "kvstore": {"driver": "file", "path": str(zfx.path / "0")}}, read=True
                    ).result()
                    return ts.downsample(store, [s, s], "stride" if method == "nearest" else "mean").read().result()

                jobs.append(("ome-zarr", "tensorstore downsample", s, method, tsread))

            def zread(s=s, method=method):
                return _numpy_reduce(zarr.open_array(str(zfx.path / "0"), mode="r")[...], s, method)

            if "ome-zarr" in formats:
                jobs.append(("ome-zarr", "zarr-python + numpy", s, method, zread))

            def tread(s=s, method=method):
                return _numpy_reduce(tifffile.imread(tfx.path), s, method)

            if "ome-tiff" in formats:
                jobs.append(("ome-tiff", "tifffile + numpy", s, method, tread))

    floors = {"ome-zarr": zarr_decode_floor(zfx.path / "0"), "ome-tiff": tiff_decode_floor(tfx.path)}
    rows = []
    progress = Progress(len(jobs))
    for fmt, peer, s, method, fn in jobs:
        row = {"format": fmt, "peer": peer, "scale": s, "method": method}
        row.update(_time_row(fixtures[fmt], fn, floors[fmt], s, method, cold_repeats, warm_repeats))
        rows.append(row)
        progress.step(f"{peer} x{s} {method}")
    progress.close()
    _print_rows(rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument(
        "--tables",
        choices=("all", "plane", "zarr"),
        default="all",
        help="plane: the OME-Zarr/OME-TIFF plane vs each peer; zarr: every zarr layout vs TensorStore",
    )
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=("ome-zarr", "ome-tiff"),
        help="the plane table: only these fixtures' rows (repeatable; default both)",
    )


def main(args: argparse.Namespace) -> int:
    run_peers(
        args.size,
        args.data_dir,
        args.json_path,
        tables=args.tables,
        formats=tuple(args.formats or ("ome-zarr", "ome-tiff")),
    )
    return 0
