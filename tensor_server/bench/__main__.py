"""``python -m tensor_server.bench <command> [options]``: the benchmark scripts.

Adding a command: write a module in this package that defines ``add_arguments(parser)`` and
``main(args) -> int``, and add one line to ``COMMANDS``. A command's module is imported only when
that command runs, so one command's heavy imports (numba, tensorstore, pyarrow) never slow or
break another.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "kernels": (
        "tensor_server.bench.kernels",
        "downsampling kernels vs NumPy, scikit-image, tinybrain and TensorStore",
    ),
    "area-crossover": (
        "tensor_server.bench.area_crossover",
        "integer area: strided-add vs reshape-sum kernel per block size (the gate)",
    ),
    "plane-latency": (
        "tensor_server.bench.plane_latency",
        "first-read latency of one plane, cold and warm, adapter and server paths",
    ),
    "peers": (
        "tensor_server.bench.peers",
        "the same plane reads by TensorStore, zarr-python + NumPy, tifffile + NumPy",
    ),
    "throughput": (
        "tensor_server.bench.throughput",
        "8 MiB chunks/s through DoGet and the fast path vs a bare pyarrow Flight server",
    ),
    "nearest": (
        "tensor_server.bench.nearest_paths",
        "each format's own nearest path (decimated read, CZI zoom) vs the default streamed path",
    ),
    "cache": (
        "tensor_server.bench.cache_reads",
        "cold vs warm chunk reads via the SDK; cache-sourced scaled reads vs the source",
    ),
    "plate-open": (
        "tensor_server.bench.plate_open",
        "opening a big HCS plate (metadata only): fresh-interpreter open and server listing, per checkout",
    ),
    "guards": (
        "tensor_server.bench.catalog_guards",
        "cost of the catalog guards: per-query SQL database, stale-data check, chunk-file stats at open",
    ),
    "http": (
        "tensor_server.bench.http",
        "the same chunks over HTTP (OME-Zarr) and Flight DoGet, cold and warm; precache vs a client burst",
    ),
    "distributed": (
        "tensor_server.bench.distributed",
        "a scaled read of a 4 GiB tensor by 1, 2 and 4 dask process workers via the SDK",
    ),
    "object-store": (
        "tensor_server.bench.object_store",
        "first and cached scaled read of an 8192² plane from S3 (moto, loopback) vs local disk",
    ),
    "load": (
        "tensor_server.bench.load",
        "8 SDK clients of mixed reads, alone and beside a hostile client: errors, p50/p99, RSS",
    ),
    "encoded": (
        "tensor_server.bench.encoded",
        "range reads of encoded (Luxar) zarr arrays vs luxar's decoder on the whole array",
    ),
    "uploads": (
        "tensor_server.bench.uploads",
        "upload_array MB/s to cache:// and zarr:// vs a bare pyarrow DoPut that discards",
    ),
    "special": (
        "tensor_server.bench.special",
        "uniform (special) chunks in closed form vs decoding them; zarr+NumPy and blosc2 peers",
    ),
    "render-spec": (
        "tensor_server.bench.render_spec",
        "warm IIIF tiles of 4 and 16 of 60 channels from a render spec, 1 and 8 clients, vs NumPy and 3 channels",
    ),
    "crowd": (
        "tensor_server.bench.crowd",
        "63-tile viewports by 1-8 concurrent clients, HTTP and Flight, warm and cold, beside a bare uvicorn floor",
    ),
    "share": (
        "tensor_server.bench.share",
        "warm chunk latency with a share link and an OIDC JWT vs the server token; GeoJSON of many ROIs",
    ),
    "tls": (
        "tensor_server.bench.tls",
        "TLS vs plaintext in one run: 8 MiB and 64 KiB DoGet, 1 MiB HTTP chunks (MB/s, median latency)",
    ),
    "iiif": (
        "tensor_server.bench.iiif",
        "512² IIIF JPEG tiles of every level of an image with no pyramid, cold and warm, vs tifffile + Pillow",
    ),
    "viewport": (
        "tensor_server.bench.viewport",
        "63 512² tiles per level of an image with no pyramid, concurrently, over Flight and IIIF vs TensorStore",
    ),
    "catalog-start": (
        "tensor_server.bench.catalog_start",
        "a root of 10,000 small + 100 large files: first scan vs one-at-a-time, restart, rescan, serve",
    ),
    "hdf5-whole": (
        "tensor_server.bench.hdf5_whole",
        "a (60, 1065, 1030) HDF5 dataset read whole: engine and SDK vs a direct h5py read",
    ),
    "export": (
        "tensor_server.bench.export",
        "writing a pyramidal OME-Zarr: ours vs ngff-zarr and ome-zarr-py write_image over dask, and the floor",
    ),
    "metrics": (
        "tensor_server.bench.metrics",
        "small cached chunk DoGet and HTTP GET p50 with metrics on and off (target <= 3 % slower)",
    ),
    "plate": (
        "tensor_server.bench.plate",
        "first whole-plate overview (IIIF and SDK, cold and warm) vs ome-zarr-py and napari-ome-zarr",
    ),
    "remote": (
        "tensor_server.bench.remote",
        "first view of an OME-Zarr and an OME-TIFF by URL at 50 ms a request, cold and restarted, vs zarr/tifffile+fsspec",
    ),
    "live": (
        "tensor_server.bench.live",
        "frame-to-client latency of a live acquisition at 10 and 100 frames/s: SDK watch vs zarr-python polling",
    ),
    "gate": (
        "tensor_server.bench.gate",
        "the performance gate (make perf-gate): vs the previous commit, and floors vs peers",
    ),
}


def top_parser() -> argparse.ArgumentParser:
    """The parser of the command's name (each command's own parser is built when it runs)."""
    top = argparse.ArgumentParser(
        prog="python -m tensor_server.bench", description="Benchmarks of tensor-server (not timed tests)."
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="command")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ns = top_parser().parse_args(argv[:1])
    module_name, help_text = COMMANDS[ns.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("tensor_server", "tensor_server_kernels"):
            raise
        # the serving install has none of the peers a bench compares with
        print(
            f"python -m tensor_server.bench {ns.command}: needs {exc.name}, which the serving install leaves "
            "out; install the bench and test extras: pip install 'tensor-server[bench,test]' (make setup does)",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog=f"python -m tensor_server.bench {ns.command}", description=help_text)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
