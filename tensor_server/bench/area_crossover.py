"""``python -m tensor_server.bench area-crossover``: where integer ``area`` should switch from the
strided-add kernel to the reshape-sum kernel (``_STRIDED_ADD_MAX_BLOCK`` in
``tensor_server_kernels/plan.py``).

For each block size (power-of-two scales, 2-D and 3-D, uint16 and uint8), both kernels reduce
the same C-order input, timed in interleaved rounds (``bench kernels``' timer) on one thread;
the path is forced by moving the gate for the call. The table gives both medians and
reshape/strided (> 1: strided-add is faster). The constant's comment keeps the figures of the
run that set it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

# (label, dtype, shape, scales): every scale tuple's block is a power of two.
CASES = (
    (
        "8192^2 u16",
        "uint16",
        (8192, 8192),
        ((2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16), (16, 32), (32, 32), (32, 64), (64, 64)),
    ),
    ("8192^2 u8", "uint8", (8192, 8192), ((2, 2), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16), (32, 32))),
    ("512x1024^2 u8", "uint8", (512, 1024, 1024), ((2, 2, 2), (2, 4, 4), (4, 4, 4), (4, 4, 8), (8, 8, 8))),
)
QUICK_SHAPES = {(8192, 8192): (1024, 1024), (512, 1024, 1024): (64, 256, 256)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small arrays (smoke run; not representative)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per cell (>= 5)")


@contextmanager
def forced_area_path(path: str) -> Iterator[None]:
    """Route every integer power-of-two area call to ``path`` ("strided-add" / "reshape-sum")."""
    from tensor_server_kernels import plan

    saved = plan._STRIDED_ADD_MAX_BLOCK
    plan._STRIDED_ADD_MAX_BLOCK = 2**62 if path == "strided-add" else 0
    try:
        yield
    finally:
        plan._STRIDED_ADD_MAX_BLOCK = saved


def main(args: argparse.Namespace) -> int:
    from tensor_server_kernels.plan import _STRIDED_ADD_MAX_BLOCK, area_path

    from tensor_server.bench.kernels import _interleaved_ms
    from tensor_server.core.downsample import downsample_block

    repeats = max(5, args.repeats)
    rng = np.random.default_rng(0)
    print(f"current gate: strided-add for blocks <= {_STRIDED_ADD_MAX_BLOCK}; median of {repeats} rounds, ms")
    print(f"{'input':<15} {'scale':<11} {'block':>5} {'strided':>8} {'reshape':>8} {'r/s':>5}  now")
    for label, dtype, shape, scales in CASES:
        shape = QUICK_SHAPES[shape] if args.quick else shape
        x = rng.integers(0, np.iinfo(dtype).max, size=shape, dtype=dtype, endpoint=True)
        for scale in scales:

            def run(path: str, scale=scale, x=x):
                with forced_area_path(path):
                    return downsample_block(x, scale, "area")

            assert np.array_equal(run("strided-add"), run("reshape-sum"))
            ms = _interleaved_ms({p: (lambda p=p: run(p)) for p in ("strided-add", "reshape-sum")}, repeats)
            block = int(np.prod(scale))
            print(
                f"{label:<15} {str(scale):<11} {block:>5} {ms['strided-add']:>8.1f} {ms['reshape-sum']:>8.1f} "
                f"{ms['reshape-sum'] / ms['strided-add']:>5.2f}  {area_path(dtype, scale)}"
            )
        del x
    return 0
