"""``python -m tensor_server.bench share``: what the credentials of issue 45 cost on the read
path, and what GeoJSON costs.

Warm OME-Zarr chunks over HTTP, in interleaved rounds, presented three ways: the server token
(the baseline), a share link (``/s/<capability>/``: its signature checked once, then the link
list and the clock each request) and an OIDC sign-in token (an RS256 JWT against a JWKS made
here: its signature checked once, then kept until its ``exp``); the target is at most 5 % more
a chunk than the token. Then a GeoJSON export of ``--rois`` octagons and an import of the
most a tensor holds (10,000), through the conversion and its checks (``catalog/roi_geojson.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["add_arguments", "main"]

TOKEN = "bench-share-token"
ISSUER, AUDIENCE = "https://login.bench.example", "tensor-server"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of 16 warm chunks each (default 15)")
    parser.add_argument("--rois", type=int, default=100_000, help="octagons exported and imported (default 100000)")


def _octagons(n: int, rng: np.random.Generator) -> list:
    from biopb.image.annotation_pb2 import RoiAnnotation

    out = []
    for i in range(n):
        a = RoiAnnotation(roi_id=f"r{i}", label="cell")
        cx, cy = rng.uniform(100, 99_000, 2)
        for k in range(8):
            p = a.roi.polygon.points.add()
            p.x, p.y = cx + 20 * np.cos(k * np.pi / 4), cy + 20 * np.sin(k * np.pi / 4)
        out.append(a)
    return out


def _oidc_token(folder: Path) -> tuple[str, Path]:
    from joserfc import jwt
    from joserfc.jwk import RSAKey

    key = RSAKey.generate_key(2048, parameters={"kid": "bench"}, private=True)
    jwks = folder / "jwks.json"
    jwks.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "bench", "exp": now + 3600}
    return jwt.encode({"alg": "RS256", "kid": "bench"}, claims, key), jwks


def _tiles(rounds: int) -> None:
    import httpx

    from tensor_server.adapters.memory import ArrayAdapter, MemorySource
    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.testing import serving

    image = (np.arange(1024 * 1024, dtype=np.uint32) % 65521).astype(np.uint16).reshape(1024, 1024)
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(image, "yx", chunk_shape=(256, 256)), source_id="img"))
    cat.first_scan_done.set()
    with tempfile.TemporaryDirectory() as tmp:
        jwt_token, jwks = _oidc_token(Path(tmp))
        cache = CacheManager(Path(tmp) / "cache")
        options = {"oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_jwks_file": str(jwks)}
        with serving(cat, http=True, token=TOKEN, cache=cache, precache_bytes=0, **options) as srv:
            _, capability = srv.runtime.shares.mint("img", "read", 3600, "")
            ways = {
                "server token": (f"{srv.http_url}/zarr/img/0/", {"Authorization": f"Bearer {TOKEN}"}),
                "share link": (f"{srv.http_url}/s/{capability}/zarr/img/0/", {}),
                "OIDC JWT": (f"{srv.http_url}/zarr/img/0/", {"Authorization": f"Bearer {jwt_token}"}),
            }
            keys = [f"{i}.{j}" for i in range(4) for j in range(4)]
            times: dict[str, list[float]] = {name: [] for name in ways}
            with httpx.Client(timeout=60) as client:
                for rnd in range(rounds + 1):  # round 0 warms the cache and each credential's check
                    order = list(ways.items())[rnd % 3 :] + list(ways.items())[: rnd % 3]
                    for name, (url, headers) in order:
                        for key in keys:
                            t0 = time.perf_counter()
                            answer = client.get(url + key, headers=headers)
                            if rnd:
                                times[name].append(time.perf_counter() - t0)
                            if answer.status_code != 200:
                                raise SystemExit(f"{name}: {answer.status_code} {answer.text[:200]}")
        cache.close()
    base = statistics.median(times["server token"])
    print("warm 128 KiB OME-Zarr chunk over HTTP (median, p90, vs the server token):")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"  {name:<13} {med * 1e3:6.3f} ms  {np.percentile(t, 90) * 1e3:6.3f} ms  {med / base - 1:+6.1%}")


def _geojson(n: int) -> None:
    from types import SimpleNamespace

    from tensor_server.catalog.roi_geojson import ImageFrame, feature_collection, rois_from_geojson
    from tensor_server.catalog.rois import MAX_ROIS_PER_TENSOR

    frame = ImageFrame.of(SimpleNamespace(array_id="x", shape=(100_000, 100_000), dim_labels=("y", "x")))
    rois = _octagons(n, np.random.default_rng(0))
    t0 = time.perf_counter()
    body = feature_collection(rois, frame)
    t1 = time.perf_counter()
    print(f"GeoJSON export of {n} octagons: {t1 - t0:.2f} s ({len(body) / 1e6:.1f} MB)")
    one_import = feature_collection(rois[:MAX_ROIS_PER_TENSOR], frame)
    t2 = time.perf_counter()
    back = rois_from_geojson(one_import, frame)
    t3 = time.perf_counter()
    print(f"GeoJSON import of {len(back)} (a tensor's most; parse and shapely checks): {t3 - t2:.2f} s")


def main(args: argparse.Namespace) -> int:
    _tiles(args.rounds)
    _geojson(args.rois)
    return 0
