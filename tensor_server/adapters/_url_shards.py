"""A read of a remote sharded zarr array fetches its inner chunks at once, adjacent ones merged.

zarr-python reads the inner chunks of one shard one after the other (``ShardingCodec.
_decode_partial_single`` awaits each range in turn), so over a host at 50 ms a request a read
of 4 inner chunks of a shard took 5 round trips (the index, then each chunk). Before zarr
reads, ``prefetch_shards`` reads the index of every shard the read touches (in parallel;
each cached, so once per shard), then fetches the touched chunks' byte ranges in parallel,
ranges that are adjacent or within ``GAP`` bytes of each other as one request, stored chunk by
chunk under the very ranges zarr then asks for: its reads are cache hits
(``_remote_bytes.py``). A shard the read covers whole is left to zarr, which fetches it in
one request; an index encoding other than the default is left to zarr too.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any

import numpy as np

from tensor_server.adapters._remote_bytes import FETCHERS, remote_bytes
from tensor_server.adapters._zarr_chunks import ShardIndexFormat
from tensor_server.core.bounds import Bounds

__all__ = ["GAP", "prefetch_shards"]

#: ranges this close are fetched as one: at 50 ms a round trip and 40 MB/s, 256 KiB more in one
#: answer costs ~6 ms, a second request 50
GAP = 256 << 10
_EMPTY = 2**64 - 1


def touched_chunks(array: Any, bounds: Bounds, per_shard: tuple[int, ...]) -> dict[tuple[int, ...], list[int]]:
    """shard -> the flat indexes (in the shard's index) of the inner chunks ``bounds`` touches."""
    chunks = tuple(int(c) for c in array.chunks)
    axes = [range(a // c, -(-b // c)) for a, b, c in zip(bounds.start, bounds.stop, chunks)]
    out: dict[tuple[int, ...], list[int]] = {}
    for idx in product(*axes):
        shard = tuple(i // p for i, p in zip(idx, per_shard))
        inner = tuple(i % p for i, p in zip(idx, per_shard))
        out.setdefault(shard, []).append(int(np.ravel_multi_index(inner, per_shard)))
    return out


def prefetch_shards(base: str, array: Any, bounds: Bounds) -> None:
    """Have the inner chunks of ``array`` (at the URL ``base``) under ``bounds`` cached (the
    module docstring); nothing for an array that is not sharded."""
    if array.shards is None:
        return
    layout = ShardIndexFormat(array)
    if not layout.supported:
        return
    whole = math.prod(layout.per_shard)
    prefix = f"{base}/{array.path}".rstrip("/")
    wanted = {
        f"{prefix}/{array.metadata.encode_chunk_key(shard)}": flat
        for shard, flat in touched_chunks(array, bounds, layout.per_shard).items()
        if len(flat) < whole
    }
    index_range = f"-{layout.size}" if layout.at_end else f"0-{layout.size - 1}"

    def ranges_of(url: str) -> tuple[str, list[tuple[int, int]], str] | None:
        raw, validator = remote_bytes().read(url, index_range)
        if raw is None:
            return None  # no such shard: zarr reads it as the fill value
        index = layout.parse(raw, url)
        spans = [(int(index[i, 0]), int(index[i, 0] + index[i, 1])) for i in wanted[url] if index[i, 0] != _EMPTY]
        return url, spans, validator

    jobs = [job for job in FETCHERS.map(ranges_of, wanted) if job is not None and job[1]]
    remote_bytes().prefetch_all(jobs, gap=GAP)
