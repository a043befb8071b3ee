"""``python -m tensor_server.bench distributed``: a scaled read of a 4 GiB tensor computed by
1, 2 and 4 dask process workers through the biopb SDK against one in-process reader.

Throughput is source megabytes reduced per second of wall time (the whole tensor is read
at full resolution by the server and reduced there; workers receive the reduced chunks and
sum them). Peers in the same run: the same read by the SDK in this process (dask's threaded
scheduler, no cluster) and the engine directly (no network, no dask). No chunk cache, so
every run computes; runs alternate between configurations and the median is reported.

The source is procedural (pixels computed from their coordinates, a few ns each): 4 GiB of
real files would measure the disk, and this machine's RAM is shared. Its cost stands in for a
fast decoder.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["run_distributed"]


def _synthetic(shape: tuple[int, ...]) -> Any:
    from tensor_server.core.adapter_base import TensorAdapter, TensorInfo

    class SyntheticVolume(TensorAdapter):
        """uint16 pixels ``7z + 3y + x`` (wrapping): deterministic, no memory held."""

        def read_region(self, bounds):
            z, y, x = (np.arange(s.start, s.stop, dtype=np.uint16) for s in bounds.to_slices())
            out = np.empty(bounds.shape, np.uint16)
            np.add((z * np.uint16(7))[:, None, None], (y * np.uint16(3))[None, :, None], out=out)
            out += x[None, None, :]
            return out

    return SyntheticVolume(TensorInfo(shape, np.uint16, dim_labels="zyx"))


def run_distributed(
    gib: float = 4.0,
    workers: tuple[int, ...] = (1, 2, 4),
    repeats: int = 2,
    scale: tuple[int, int, int] = (1, 8, 8),
    json_path: str | None = None,
) -> list[dict[str, Any]]:
    from biopb.tensor import TensorFlightClient
    from dask.distributed import Client, LocalCluster

    from tensor_server.adapters.memory import MemorySource
    from tensor_server.catalog import Catalog
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.engine import ReadEngine
    from tensor_server.testing import start_serving

    warm_up()
    logging.getLogger("distributed").setLevel(logging.WARNING)  # the scheduler's INFO lines
    planes = max(1, round(gib * (1 << 30) / (8192 * 16384 * 2)))
    tensor = _synthetic((planes, 8192, 16384))
    source_mb = tensor.dtype.itemsize * int(np.prod(tensor.shape)) / 1e6
    cat = Catalog([])
    cat.add_source(MemorySource(tensor, source_id="synthetic"))
    server = start_serving(cat)
    sdk = TensorFlightClient(server.location, cache_bytes=0)
    expected = _expected_plane_sums(tensor, scale)

    def via_sdk(compute) -> None:
        level = sdk.get_tensor("synthetic", scale_hint=list(scale), reduction_method="area")
        sums = compute(level.astype(np.float64).sum(axis=(1, 2)))
        if not all(np.isclose(sums[z], want) for z, want in expected.items()):
            raise AssertionError("the distributed result differs from the oracle")

    configs: dict[str, Any] = {
        "engine in this process (no network, no dask)": lambda: ReadEngine().read(tensor, None, scale, "area"),
        "SDK in this process (dask threads)": lambda: via_sdk(lambda a: a.compute()),
    }
    clusters = []
    try:
        for n in workers:
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
            )
            client = Client(cluster)
            clusters.append((cluster, client))
            # workers import the SDK and connect once before timing
            client.compute(
                sdk.get_tensor("synthetic", slice_hint=(slice(0, 1), slice(0, 64), slice(0, 64))).sum()
            ).result()
            configs[f"dask cluster, {n} process worker{'s' * (n > 1)}"] = lambda client=client: via_sdk(
                lambda a: client.compute(a).result()
            )
        times: dict[str, list[float]] = {k: [] for k in configs}
        for r in range(repeats):
            order = list(configs) if r % 2 == 0 else list(reversed(configs))  # alternate
            for name in order:
                t0 = time.perf_counter()
                configs[name]()
                times[name].append(time.perf_counter() - t0)
    finally:
        for cluster, client in clusters:
            client.close()
            cluster.close()
        server.stop()
        cat.close()
    rows = [
        {"config": name, "seconds": statistics.median(ts), "mb_per_s": source_mb / statistics.median(ts)}
        for name, ts in times.items()
    ]
    print(f"scaled read {scale} area of a {source_mb / 1e3:.2f} GB uint16 tensor {tensor.shape}, median of {repeats}")
    print_table(
        ["configuration", "s", "MB/s of source reduced"], [[r["config"], r["seconds"], r["mb_per_s"]] for r in rows]
    )
    write_json(json_path, "distributed", f"{gib:g}GiB", rows)
    return rows


def _expected_plane_sums(tensor: Any, scale: tuple[int, int, int]) -> dict[int, float]:
    """Sums of the first and last reduced planes, read by the engine in this process (the
    engine's equality with the oracle is the test suite's business)."""
    from tensor_server.core.engine import ReadEngine

    last = tensor.shape[0] - 1
    return {
        z: float(
            ReadEngine()
            .read(tensor, [slice(z, z + 1), slice(None), slice(None)], scale, "area")
            .astype(np.float64)
            .sum()
        )
        for z in (0, last)
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gib", type=float, default=4.0, help="tensor size in GiB (default 4)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="cluster sizes (default 1 2 4)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(args: argparse.Namespace) -> int:
    run_distributed(args.gib, tuple(args.workers), args.repeats, json_path=args.json_path)
    return 0
