"""``python -m tensor_server.bench object-store``: a scaled read of an 8192² plane from an
S3 bucket vs the same zarr store on local disk, first (empty chunk cache) and cached.

The bucket is moto's S3 server on 127.0.0.1 (``moto[server]`` and ``s3fs``, the test extra),
so the S3 numbers are the protocol's cost (HTTP requests, XML listing, per-object GETs)
without a network's latency: a real bucket adds a round trip per request, which zarr's
concurrent fetches overlap. Each "first" read has a fresh cache and server; the two stores
alternate, medians of ``--repeats``. Reads go through the biopb SDK like a client's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import print_table, write_json

__all__ = ["run_object_store"]


def run_object_store(
    n: int = 8192, chunk: int = 1024, scale: int = 8, repeats: int = 3, json_path: str | None = None
) -> list[dict[str, Any]]:
    import logging

    import s3fs
    import zarr
    from biopb.tensor import TensorFlightClient
    from moto.server import ThreadedMotoServer

    from tensor_server.adapters._remote_bytes import reset_remote_bytes
    from tensor_server.bench.fixtures import plane as _plane
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.core.downsample import warm_up
    from tensor_server.testing import start_serving

    warm_up()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="ts-bench-s3-"))
    plane = _plane(n)
    zarr.open_array(
        str(work / "local" / "plane.zarr"), mode="w", shape=plane.shape, chunks=(chunk, chunk), dtype=plane.dtype
    )[...] = plane
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    s3fs.S3FileSystem.clear_instance_cache()
    results: dict[str, list[float]] = {}
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir("bench")
        fs.put(str(work / "local" / "plane.zarr"), "bench/plane.zarr", recursive=True)
        cat = Catalog(["s3://bench", work / "local"])
        cat.scan()
        ids = {("s3" if r.url.startswith("s3://") else "local"): r.source_id for r in cat.records()}
        want = None
        for r in range(repeats):
            for where in ("s3", "local") if r % 2 == 0 else ("local", "s3"):
                reset_remote_bytes()  # "first" is first for the S3 store's raw-byte cache too
                with CacheManager(work / f"cache-{where}-{r}") as cache:
                    server = start_serving(cat, cache=cache, precache_bytes=0)
                    try:
                        sdk = TensorFlightClient(server.location, cache_bytes=0)
                        for kind in ("first", "cached"):
                            t0 = time.perf_counter()
                            got = sdk.get_tensor(
                                ids[where], scale_hint=[scale, scale], reduction_method="area"
                            ).compute()
                            results.setdefault(f"{where} {kind}", []).append(time.perf_counter() - t0)
                            want = got if want is None else want
                            if not np.array_equal(got, want):
                                raise AssertionError(f"{where} {kind} read differs")
                    finally:
                        server.stop()
        cat.close()
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rows = [{"read": k, "ms": statistics.median(v) * 1e3} for k, v in sorted(results.items())]
    print(
        f"scaled read ({scale}, {scale}) area of a {n}² uint16 plane, zarr chunks {chunk}², "
        f"via the SDK, median of {repeats}"
    )
    print_table(["store / read", "ms"], [[r["read"], r["ms"]] for r in rows])
    write_json(json_path, "object-store", f"{n}", rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=8192, help="plane edge in pixels (default 8192)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")


def main(args: argparse.Namespace) -> int:
    run_object_store(args.size, repeats=args.repeats, json_path=args.json_path)
    return 0
