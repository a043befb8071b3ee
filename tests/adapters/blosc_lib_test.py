"""libblosc2 through ctypes (``adapters/_blosc_lib.py``) decodes what numcodecs writes, bit for
bit, on several threads at once; refuses what it cannot decode (the caller then asks
numcodecs); and is used only when its parameter struct matches the header the wheel ships."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from tensor_server.adapters import _blosc_lib


@pytest.fixture(scope="module")
def decode():
    fn = _blosc_lib.decompressor()
    assert fn is not None, "libblosc2 from the blosc2 wheel did not load"  # a project dependency
    return fn


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32", "int64"])
@pytest.mark.parametrize("cname", ["zstd", "lz4", "lz4hc", "blosclz", "zlib"])
def test_every_numcodecs_blosc_frame_decodes_to_the_same_bits(decode, cname, dtype):
    x = (np.random.default_rng(3).normal(size=(100, 130)) * 50).astype(dtype)
    for shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE):
        frame = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle).encode(x)
        out = np.full_like(x, 7)
        assert decode(frame, out), f"{cname} shuffle {shuffle}"
        assert out.tobytes() == x.tobytes(), f"{cname} shuffle {shuffle}"
        assert decode(memoryview(frame)[:], out)  # a slice of a shard's bytes works too


def test_frames_it_cannot_decode_are_refused_not_guessed(decode):
    x = np.arange(4096, dtype=np.uint16)
    frame = numcodecs.Blosc(cname="zstd").encode(x)
    out = np.empty_like(x)
    assert not decode(frame[:20], out)  # truncated header
    assert not decode(frame, np.empty(4095, np.uint16))  # not the target's size
    with pytest.raises(RuntimeError):
        numcodecs.Blosc().decode(frame[:20])  # what the caller then raises


def test_threads_decode_at_once_each_with_its_own_context(decode):
    frames = [(numcodecs.Blosc(cname="zstd").encode(np.full(65536, i, np.uint16)), i) for i in range(64)]

    def run(item):
        frame, value = item
        out = np.empty(65536, np.uint16)
        return decode(frame, out) and bool((out == value).all())

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, frames * 4))


def test_the_struct_is_checked_against_the_shipped_header():
    root = Path(next(iter(importlib.util.find_spec("blosc2").submodule_search_locations)))
    header = (root / "include" / "blosc2.h").read_text(errors="replace")
    assert _blosc_lib._header_fields(header) == _blosc_lib._DPARAMS_FIELDS
    grown = header.replace("} blosc2_dparams;", "  int32_t added;\n} blosc2_dparams;")
    assert _blosc_lib._header_fields(grown) != _blosc_lib._DPARAMS_FIELDS  # would keep numcodecs
    assert _blosc_lib._header_fields("no such struct") is None


def test_one_context_per_thread_whatever_it_decodes(decode, monkeypatch):
    """A context keeps its block buffers: one per (array, thread) would grow with the arrays
    a server has read."""
    made = []
    real = _blosc_lib._Context.__init__
    monkeypatch.setattr(_blosc_lib._Context, "__init__", lambda self, lib: made.append(1) or real(self, lib))
    assert _blosc_lib.decompressor() is decode  # every array's pipeline shares it
    frames = [numcodecs.Blosc(cname=c).encode(np.arange(5000, dtype=d)) for c, d in (("zstd", "u2"), ("lz4", "f4"))]

    def run(_):
        return all(decode(f, np.empty(5000, d)) for f, d in zip(frames, ("u2", "f4")) for _ in range(3))

    with ThreadPoolExecutor(3) as pool:
        assert all(pool.map(run, range(3)))
    assert 1 <= len(made) <= 3
