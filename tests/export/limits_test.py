"""The export's bounds (export/options.py): chunks and shards at least 64 px in Y and X, at most
100,000 files, at most 64 MiB per unit of work (default shards shrink to fit, asked shards or
too-deep pyramids are refused naming the option); a unit holds no more than that, a process
exporting the largest shards that fit stays within a few units of it, and a stop is seen
within a unit, between its chunks, not after it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensor_server.core.adapter_base import TensorAdapter, TensorInfo
from tensor_server.errors import InvalidArgument, ReadCancelled
from tensor_server.export import ExportOptions, export_tensor
from tensor_server.export import run as export_run
from tensor_server.export.chunk_files import ChunkFiles
from tensor_server.export.layout import check_file_count, plan_layout
from tensor_server.export.options import MAX_FILES, MAX_UNIT_BYTES, MIN_CHUNK_EDGE
from tensor_server.export.store import RECORD
from tests.export.helpers import REPO, GeneratedPlane, run_cli


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


class Unread(TensorAdapter):
    """A tensor of any shape and dtype that is planned, never read."""

    def __init__(self, shape, dtype, labels) -> None:
        super().__init__(TensorInfo(tuple(shape), np.dtype(dtype), dim_labels=tuple(labels)))
        self.array_id = "unread"

    def read_region(self, bounds):
        raise AssertionError("a refused or planned export reads nothing")


@pytest.mark.parametrize(
    "shape,options,message",
    [
        ((4096, 4096), dict(chunks=(1, 1)), "chunks [1, 1]: the y edge 1 is below the minimum of 64 pixels"),
        ((4096, 4096), dict(chunks=(64, 32)), "chunks [64, 32]: the x edge 32 is below the minimum of 64"),
        ((4096, 4096), dict(shards=(32, 4096)), "shards [32, 4096]: the y edge 32 is below the minimum of 64"),
        ((40, 4096), dict(chunks=(32, 64)), "the y edge 32 is below the minimum of 64 pixels (or the whole axis, 40,"),
    ],
)
def test_chunks_and_shards_below_the_minimum_edge_are_refused_naming_the_option(shape, options, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        plan_layout(Unread(shape, np.uint16, "yx"), levels=1, **options)


def test_a_short_axis_may_have_chunks_as_short_as_itself():
    layout = plan_layout(Unread((40, 4096), np.uint16, "yx"), levels=1, chunks=(40, 64), shards=(40, 128))
    assert layout.levels[0].chunk == (40, 64) and MIN_CHUNK_EDGE == 64


def test_one_pixel_chunks_are_refused_by_the_command_before_anything_is_written(tmp_path):
    """The red team's export: 1×1 chunks of a 2048² plane wrote a file per pixel (4.2 M files)."""
    import zarr

    zarr.create_array(str(tmp_path / "src.zarr"), data=np.zeros((2048, 2048), np.uint16))
    done = run_cli(str(tmp_path / "src.zarr"), str(tmp_path / "o.zarr"), "--chunks", "1,1", "--ngff", "0.4")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "chunks [1, 1]: the y edge 1 is below the minimum of 64 pixels" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.zarr"]


@pytest.mark.parametrize(
    "ngff,options", [("0.4", dict(chunks=(64, 64))), ("0.5", dict(chunks=(64, 64), shards=(64, 64)))]
)
def test_an_export_of_too_many_files_is_refused_before_anything_is_written(tmp_path, ngff, options):
    """65536² in 64² files is 1,048,576 files at level 0 alone: refused up front, counted."""
    dest = tmp_path / "o.zarr"
    with pytest.raises(InvalidArgument, match="this export would write 1,048,576 .* files .* more than the 100,000"):
        export_tensor(Unread((65536, 65536), np.uint16, "yx"), dest, ExportOptions(levels=1, ngff=ngff, **options))
    assert list(tmp_path.iterdir()) == []


def test_the_file_count_sums_every_level_and_stops_at_the_limit():
    tensor = Unread((65536, 65536), np.uint16, "yx")
    one = plan_layout(tensor, levels=1, chunks=(256, 256))
    assert check_file_count([one], sharded=False) == 65536 <= MAX_FILES  # (65536 / 256)², allowed
    two = plan_layout(tensor, levels=2, chunks=(256, 256))
    assert check_file_count([two], sharded=False) == 65536 + 16384
    assert check_file_count([two], sharded=True) == 32 * 32 + 32 * 32  # 2048² shards; 1024² at level 1 (one unit's)
    with pytest.raises(InvalidArgument, match="would write 131,072 chunk files .* use larger --chunks, or --ngff 0.5"):
        check_file_count([one, one], sharded=False)  # an image and a label image of that geometry


def test_shards_whose_unit_exceeds_the_memory_cap_are_refused_naming_them():
    """An 8192² uint16 shard is 128 MiB at level 0 (168 MiB with two more levels; +173 MB resident)."""
    tensor = Unread((16384, 16384), np.uint16, "yx")
    with pytest.raises(
        InvalidArgument,
        match=re.escape(
            "shards [8192, 8192]: a unit of work (one shard, with its pyramid levels) would hold 168.0 MiB of uint16 "
            "pixels, and an export holds at most 64.0 MiB per unit of work: ask for smaller shards (at most"
        ),
    ):
        plan_layout(tensor, levels=3, shards=(8192, 8192))
    with pytest.raises(
        InvalidArgument,
        match=re.escape(
            "chunks [16384, 16384]: a unit of work (one shard, with its pyramid levels) would hold 672.0 MiB"
        ),
    ):
        plan_layout(tensor, levels=3, chunks=(16384, 16384))  # the default shard is one such chunk
    fits = plan_layout(tensor, levels=3, shards=(4096, 4096))
    assert fits.unit == (4096, 4096) and fits.unit_bytes() <= MAX_UNIT_BYTES


def test_levels_whose_coarsest_block_exceeds_the_memory_cap_are_refused_naming_what_fits():
    """16 levels of a 32768² plane need its whole 2 GiB in one unit (the coarsest level's one pixel)."""
    tensor = Unread((32768, 32768), np.uint16, "yx")
    with pytest.raises(
        InvalidArgument,
        match=r"levels: the coarsest level's scale \[32768, 32768\] makes each unit "
        r"of work \[32768, 32768\] pixels .* ask for at most 13 levels",
    ):
        plan_layout(tensor, levels=16)
    with pytest.raises(InvalidArgument, match="at most 13 levels"):
        plan_layout(tensor, levels=14)  # a 8192² unit: 128 MiB at level 0
    assert plan_layout(tensor, levels=13).unit == (4096, 4096)


def test_default_shards_shrink_to_the_cap_for_wide_pixels():
    """2048² float64 RGBA shards would be 128 MiB: the default halves them, staying whole chunks."""
    layout = plan_layout(Unread((8192, 8192, 4), np.float64, "yxs"), levels=3)
    out = layout.axes.out_shape
    assert out(layout.levels[0].shard) == (4, 1024, 1024) and out(layout.levels[0].chunk) == (4, 256, 256)
    assert layout.unit_bytes() <= MAX_UNIT_BYTES


def test_a_unit_never_holds_more_than_the_cap(tmp_path, monkeypatch):
    """The largest shards that fit (4096² uint16, 42 MiB with their levels): every unit the
    pass reduces holds at most ``MAX_UNIT_BYTES``, every level counted."""
    held = []
    real = export_run.unit_levels

    def counted(data, *args, **kw):
        blocks = real(data, *args, **kw)
        held.append(sum(b.nbytes for b in blocks))
        return blocks

    monkeypatch.setattr(export_run, "unit_levels", counted)
    export_tensor(
        GeneratedPlane((4096, 8192)), tmp_path / "o.zarr", ExportOptions(levels=3, shards=(4096, 4096), codec="zstd")
    )
    assert len(held) == 2 and max(held) == (4096 * 4096 + 2048 * 2048 + 1024 * 1024) * 2 <= MAX_UNIT_BYTES


RSS_SCRIPT = """
import json, sys
from tests.export.helpers import GeneratedPlane, peak_rss as peak
from tensor_server.export import ExportOptions, export_tensor
export_tensor(GeneratedPlane((600, 700)), sys.argv[1] + "/warm.zarr", ExportOptions(codec="zstd", levels=3))
base = peak()
export_tensor(GeneratedPlane((8192, 8192)), sys.argv[1] + "/big.zarr",
              ExportOptions(codec="zstd", levels=3, shards=(4096, 4096)))
print(json.dumps({"base": base, "growth": peak() - base}))
"""


def test_the_largest_shards_that_fit_keep_resident_memory_within_a_few_units(tmp_path):
    """Exporting 8192² in 4096² shards (42 MiB units, the most that fit) grows the process by
    less than three units at the cap (it grew by 92 MiB; 8192² shards grew it by 173 MiB
    before they were refused)."""
    env = {
        "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "MALLOC_ARENA_MAX": "2",
    }  # as the command sets
    done = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.splitlines()[-1])
    assert 0 < measured["growth"] < 3 * MAX_UNIT_BYTES, measured


@pytest.fixture
def counted_chunks(monkeypatch):
    """Every chunk an export encodes, counted (threads append; list.append is atomic)."""
    encoded: list[int] = []
    real = ChunkFiles._chunk

    def counting(self, piece):
        encoded.append(1)
        return real(self, piece)

    monkeypatch.setattr(ChunkFiles, "_chunk", counting)
    return encoded


def test_a_stop_is_seen_between_a_units_chunks_and_resume_rewrites_the_unit(tmp_path, counted_chunks):
    """One 4096² unit of 64² chunks is 4096 + 1024 chunks to encode; asked to stop after 200,
    the pass encodes at most one more per writer, records no unit, and a resume writes the
    very bytes of an uninterrupted export."""
    t = GeneratedPlane((4096, 4096))
    options = dict(levels=2, chunks=(64, 64), shards=(4096, 4096), codec="zstd")
    export_tensor(t, tmp_path / "clean.zarr", ExportOptions(**options))
    per_unit = len(counted_chunks)
    assert per_unit == 4096 + 1024
    counted_chunks.clear()
    dest = tmp_path / "cut.zarr"
    with pytest.raises(ReadCancelled, match="0 of 1 units written"):
        export_tensor(t, dest, ExportOptions(**options, workers=2), cancelled=lambda: len(counted_chunks) >= 200)
    assert 200 <= len(counted_chunks) <= 200 + 2 * 2
    record = dest.with_name("cut.zarr.partial") / RECORD
    assert len(record.read_text().splitlines()) == 1  # the header: the unit part way is not trusted
    summary = export_tensor(t, dest, ExportOptions(**options, mode="resume"))
    assert summary["units_resumed"] == 0 and tree(dest) == tree(tmp_path / "clean.zarr")
