"""``python -m tensor_server.bench cache``: what the chunk cache buys.

1. One 8 MiB chunk through the biopb SDK on loopback: cold (nothing cached, source page cache
   dropped) vs warm, once over DoGet (fast path disabled) and once through the fast path.
2. A cache-sourced scaled read (scaled-read-path.md §6): one scale-16 chunk of an 8192²
   uint16 zarr chunked at 4096 (``--size small``: 2048² chunked at 1024), nearest and area,
   assembled from cached full-resolution chunks vs decoded from the source. The reference
   server reports 99 → 9 ms (nearest) and 141 → 56 ms (area) for the full-size case.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, median_ms, print_table, write_json

__all__ = ["run_cache_reads"]


def run_cache_reads(size: str = "small", json_path: str | None = None, repeats: int = 7) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ts-bench-cache-") as work:
        return _measure(Path(work), size, json_path, repeats)


def _measure(work: Path, size: str, json_path: str | None, repeats: int) -> list[dict[str, Any]]:
    import numcodecs
    import zarr

    import tensor_server
    from tensor_server.bench.fixtures import SIZES, drop_page_cache, plane
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.core import plan_read
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.engine import ReadEngine
    from tensor_server.testing import start_serving

    warm_up()
    n = SIZES[size]
    z = zarr.open_array(
        str(work / "img.zarr"),
        mode="w",
        shape=(n, n),
        chunks=(n // 2, n // 2),
        dtype=np.uint16,
        zarr_format=2,
        compressor=numcodecs.Blosc("zstd", 5, numcodecs.Blosc.SHUFFLE),
    )
    z[...] = plane(n)
    files = tuple(p for p in (work / "img.zarr").rglob("*") if p.is_file())
    rows: list[dict[str, Any]] = []

    # -- 2. cache-sourced scaled read, adapter level ---------------------------------------------
    t = tensor_server.open(work / "img.zarr").tensor()
    cache = CacheManager(work / "cache-a")
    cached_engine, source_engine = ReadEngine(cache), ReadEngine()
    for pc in plan_read(t).chunks:
        cached_engine.chunk(pc.chunk_id, t)
    scaled_chunk = plan_read(t, None, (16, 16), "area").chunks[0].chunk_id.bounds
    for method in ("nearest", "area"):
        source_engine.read(t, scaled_chunk, (16, 16), method)
        src = median_ms(lambda: source_engine.read(t, scaled_chunk, (16, 16), method), repeats)
        cached = median_ms(lambda: cached_engine.read(t, scaled_chunk, (16, 16), method), repeats)
        a = source_engine.read(t, scaled_chunk, (16, 16), method)
        b = cached_engine.read(t, scaled_chunk, (16, 16), method)
        assert np.array_equal(a, b), "cache-sourced read must be bit-identical"
        rows.append(
            {
                "case": f"scale-16 chunk {method}",
                "detail": f"{n}² zarr, {n // 2}² chunks",
                "baseline": "source",
                "baseline_ms": src,
                "ours": "cache-sourced",
                "ours_ms": cached,
            }
        )
    cache.close()

    # -- 1. one chunk through the SDK: cold vs warm, DoGet vs fast path --------------------------
    from biopb.tensor import TensorFlightClient

    cat = Catalog([work / "img.zarr"])
    cat.scan()
    cache = CacheManager(work / "cache-b")
    srv = start_serving(cat, cache=cache)
    array_id = cat.records()[0].source.tensor().array_id
    c0 = t.chunk_shape
    one = (slice(0, c0[0]), slice(0, c0[1]))
    try:
        for label, disabled in (("DoGet", "1"), ("fast path", "0")):
            os.environ["BIOPB_CACHEFILE_TRANSFER_DISABLED"] = disabled
            client = TensorFlightClient(srv.location)

            def read() -> None:
                client.get_array(array_id, slice_hint=one)

            def cold() -> None:
                cache.clear()
                client.cache_clear()
                drop_page_cache(files)

            cold_ms = median_ms(read, repeats, before=cold)
            read()
            warm_ms = median_ms(read, repeats, before=client.cache_clear)
            rows.append(
                {
                    "case": f"one {c0[0]}² uint16 chunk via SDK",
                    "detail": label,
                    "baseline": "cold",
                    "baseline_ms": cold_ms,
                    "ours": "warm (cached)",
                    "ours_ms": warm_ms,
                }
            )
    finally:
        os.environ.pop("BIOPB_CACHEFILE_TRANSFER_DISABLED", None)
        srv.stop()
        cache.close()
    print_table(
        ["case", "detail", "baseline", "ms", "ours", "ms", "ratio"],
        [
            [
                r["case"],
                r["detail"],
                r["baseline"],
                r["baseline_ms"],
                r["ours"],
                r["ours_ms"],
                f"{r['ours_ms'] / r['baseline_ms']:.2f}",
            ]
            for r in rows
        ],
    )
    write_json(json_path, "cache", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, data_dir=False)


def main(args: argparse.Namespace) -> int:
    run_cache_reads(args.size, args.json_path)
    return 0
