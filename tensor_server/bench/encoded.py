"""``python -m tensor_server.bench encoded``: range reads of encoded (Luxar) zarr arrays.

Two stores written by luxar's own encoder: a scalar LUT array (``lut_uint8`` indices) and a
per-channel array (``linear_perchannel_u16``, COORDINATE), 10⁸ decoded elements each with
``--size full`` (10⁷ with ``small``). For 1 %, 10 % and 100 % of the rows (a contiguous
range from the middle), the adapter's ``get_data(bounds)`` (reads only the codes under the
bounds, decodes those) is timed against the peer, luxar's ``ArrayDecoder.decode`` on the
whole array, which is the only read that decoder offers; plus a nearest read of every 10th
row of the whole array (decimated: only the picked codes decode). Medians over ``--repeats``,
ours and the peer alternating in one run; every timed result is checked bit-identical
against the peer's decode of the same rows once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from tensor_server.bench.timing import add_common_arguments, print_table, write_json

__all__ = ["run_encoded", "add_arguments", "main"]

ELEMENTS = {"small": 10**7, "full": 10**8}
FRACTIONS = (0.01, 0.10, 1.0)
#: rows step of the nearest read of the whole array (a strided read: only picked codes decode)
NEAREST_STEP = 10


def _fixtures(lx: Any, work: Path, elements: int) -> dict[str, tuple[Path, str]]:
    """The two stores (written once per size into ``work``): name -> (store, field)."""
    out = {}
    rng = np.random.default_rng(0)
    lut_store = work / f"lut-{elements}.zarr"
    if not (lut_store / "done").exists():
        root = lx.open_group(str(lut_store), mode="w")
        values = np.round(rng.uniform(0.1, 5.0, 200), 3).astype(np.float32)
        data = values[rng.integers(0, 200, elements)]
        lx.ArrayEncoder().encode(
            data=data,
            zarr_group=root,
            name="v",
            semantic_type=lx.SemanticType.POSITIVE_SCALAR,
            chunks=(1 << 20,),
            deduplicate=False,
        )
        (lut_store / "done").touch()
    out["lut_uint8 (N,)"] = (lut_store, "v")
    pc_store = work / f"perchannel-{elements}.zarr"
    if not (pc_store / "done").exists():
        root = lx.open_group(str(pc_store), mode="w")
        rows = elements // 3
        data = (rng.standard_normal((rows, 3)) * [100.0, 30.0, 5.0]).astype(np.float32)
        lx.ArrayEncoder().encode(
            data=data,
            zarr_group=root,
            name="v",
            semantic_type=lx.SemanticType.COORDINATE,
            chunks=(1 << 18, 3),
            deduplicate=False,
        )
        (pc_store / "done").touch()
    out["linear_perchannel_u16 (N,3)"] = (pc_store, "v")
    return out


def run_encoded(
    size: str = "small", json_path: str | None = None, repeats: int = 5, data_dir: str | None = None
) -> list[dict[str, Any]]:
    import tempfile

    import tensor_server
    from tensor_server.core.bounds import Bounds
    from tensor_server.testing.luxar import luxar_encoding

    lx = luxar_encoding()
    if lx is None:
        raise SystemExit("luxar is not installed: `make setup` installs it (luxar==2026.10.22 --no-deps)")
    work = Path(data_dir) if data_dir else Path(tempfile.gettempdir()) / "ts-bench-encoded"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for label, (store, field) in _fixtures(lx, work, ELEMENTS[size]).items():
        tensor = tensor_server.open(store).tensors[field]
        zroot = lx.open_group(str(store), mode="r")
        decoder = lx.ArrayDecoder()
        whole = decoder.decode(zroot[field], zroot)
        n = tensor.shape[0]
        peer_times: list[float] = []
        ours_times: dict[float, list[float]] = {f: [] for f in FRACTIONS}
        spans = {}
        for f in FRACTIONS:
            k = max(1, int(n * f))
            start = (n - k) // 2
            spans[f] = Bounds((start,) + (0,) * (tensor.ndim - 1), (start + k,) + tensor.shape[1:])
            got = tensor.get_data(spans[f])
            assert np.array_equal(got, whole[spans[f].to_slices()]), f"{label} {f:.0%}: not bit-identical"
        step = (NEAREST_STEP,) + (1,) * (tensor.ndim - 1)
        got = tensor.get_scaled_data(spans[1.0], step, "nearest")
        assert np.array_equal(got, whole[::NEAREST_STEP]), f"{label} nearest: not bit-identical"
        del whole, got
        nearest_times: list[float] = []
        for _ in range(repeats):  # alternate: peer, then ours at each fraction
            t0 = time.perf_counter()
            decoder.decode(zroot[field], zroot)
            peer_times.append((time.perf_counter() - t0) * 1e3)
            for f in FRACTIONS:
                t0 = time.perf_counter()
                tensor.get_data(spans[f])
                ours_times[f].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            tensor.get_scaled_data(spans[1.0], step, "nearest")
            nearest_times.append((time.perf_counter() - t0) * 1e3)
        peer = statistics.median(peer_times)
        for f in FRACTIONS:
            ours = statistics.median(ours_times[f])
            rows.append(
                {
                    "array": label,
                    "elements": int(np.prod(tensor.shape)),
                    "range": f"{f:.0%}",
                    "ours_ms": ours,
                    "peer": "luxar ArrayDecoder.decode (whole array)",
                    "peer_ms": peer,
                    "speedup": peer / ours,
                }
            )
        ours = statistics.median(nearest_times)
        rows.append(
            {
                "array": label,
                "elements": int(np.prod(tensor.shape)),
                "range": f"nearest 1/{NEAREST_STEP}",
                "ours_ms": ours,
                "peer": "luxar ArrayDecoder.decode (whole array), then [::step]",
                "peer_ms": peer,
                "speedup": peer / ours,
            }
        )
        tensor.close()
    print_table(
        ["array", "range", "ours ms", "luxar whole ms", "peer/ours"],
        [[r["array"], r["range"], r["ours_ms"], r["peer_ms"], f"{r['speedup']:.2f}x"] for r in rows],
    )
    write_json(json_path, "encoded", size, rows)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")


def main(args: argparse.Namespace) -> int:
    run_encoded(args.size, args.json_path, args.repeats, args.data_dir)
    return 0
