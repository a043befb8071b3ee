"""``python -m tensor_server.bench plane-latency``: first-read latency of one plane.

Per fixture, at full resolution and at scales 4, 16, 32 with nearest and area, through the
adapter alone and through the full server path (the biopb SDK on loopback). *Cold*: the
fixture's files are dropped from the page cache (posix_fadvise DONTNEED), the adapter is
opened fresh, the server's chunk cache is empty and the SDK's client-side cache is cleared.
*Warm*: the same read repeated (server path: served from the chunk cache through the
localhost fast path). Medians.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from tensor_server.bench.timing import Progress, add_common_arguments, median_ms, print_table, write_json

__all__ = ["run_plane_latency", "CASES"]

CASES = [(1, "-"), (4, "nearest"), (4, "area"), (16, "nearest"), (16, "area"), (32, "nearest"), (32, "area")]


def _plane_request(tensor) -> tuple[tuple[slice, ...], callable]:
    """The first Y/X plane of a tensor and a scale builder for it."""
    labels = tensor.dim_labels
    sl = tuple(slice(None) if d in ("y", "x") else slice(0, 1) for d in labels)

    def scale(s: int) -> list[int]:
        return [s if d in ("y", "x") else 1 for d in labels]

    return sl, scale


def run_plane_latency(
    size: str = "small",
    data_dir: str | None = None,
    json_path: str | None = None,
    cold_repeats: int = 3,
    warm_repeats: int = 5,
    server: bool = True,
) -> list[dict[str, Any]]:
    import tensor_server
    from tensor_server.bench.fixtures import drop_page_cache, make_fixtures
    from tensor_server.core import Bounds
    from tensor_server.core.downsample import warm_up

    warm_up()
    fixtures = make_fixtures(size, data_dir)
    rows: list[dict[str, Any]] = []
    progress = Progress(len(fixtures) * len(CASES) * (2 if server else 1))
    srv = cache = None
    if server:
        from biopb.tensor import TensorFlightClient

        from tensor_server.cache import CacheManager
        from tensor_server.catalog import Catalog
        from tensor_server.testing import start_serving

        cache_dir = tempfile.mkdtemp(prefix="ts-bench-cache-")
        catalog = Catalog([f.path for f in fixtures])
        catalog.scan()
        cache = CacheManager(cache_dir)
        srv = start_serving(catalog, cache=cache)
        client = TensorFlightClient(srv.location)
        by_path = {str(r.path.resolve()): r for r in catalog.records() if r.path is not None}
    try:
        for fx in fixtures:
            holder: dict[str, Any] = {}

            def reopen() -> None:
                drop_page_cache(fx.files)
                holder["t"] = tensor_server.open(fx.path).tensor()

            reopen()
            sl, scale_of = _plane_request(holder["t"])
            bounds = Bounds.from_slices(sl, holder["t"].shape)
            for s, method in CASES:
                scale = scale_of(s)
                m = "nearest" if method == "-" else method

                def adapter_read() -> None:
                    holder["t"].get_scaled_data(bounds, scale, m)

                cold = median_ms(adapter_read, cold_repeats, before=reopen)
                holder["t"] = tensor_server.open(fx.path).tensor()
                adapter_read()
                warm = median_ms(adapter_read, warm_repeats)
                rows.append(
                    {
                        "format": fx.name,
                        "layout": fx.layout,
                        "path": "adapter",
                        "scale": s,
                        "method": method,
                        "cold_ms": cold,
                        "warm_ms": warm,
                    }
                )
                progress.step(f"{fx.name} adapter x{s} {method}")
                if srv is None:
                    continue
                array_id = by_path[str(fx.path.resolve())].source.tensor().array_id

                def server_read() -> None:
                    client.get_array(array_id, slice_hint=sl, scale_hint=scale, reduction_method=m)

                def server_cold() -> None:
                    cache.clear()
                    client.cache_clear()
                    drop_page_cache(fx.files)

                cold = median_ms(server_read, cold_repeats, before=server_cold)
                server_read()
                warm = median_ms(server_read, warm_repeats, before=client.cache_clear)
                rows.append(
                    {
                        "format": fx.name,
                        "layout": fx.layout,
                        "path": "server",
                        "scale": s,
                        "method": method,
                        "cold_ms": cold,
                        "warm_ms": warm,
                    }
                )
                progress.step(f"{fx.name} server x{s} {method}")
    finally:
        progress.close()
        if srv is not None:
            srv.stop()
            cache.close()
    print_table(
        ["format", "layout", "path", "scale", "method", "cold ms", "warm ms"],
        [[r["format"], r["layout"], r["path"], r["scale"], r["method"], r["cold_ms"], r["warm_ms"]] for r in rows],
    )
    write_json(json_path, "plane-latency", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--no-server", action="store_true", help="adapter path only")


def main(args: argparse.Namespace) -> int:
    run_plane_latency(args.size, args.data_dir, args.json_path, server=not args.no_server)
    return 0
