"""Bad input gets a clear error naming the path, and nothing that claims to be complete: an
unreadable source, an existing destination, malformed options, a full disk (a 1 MiB tmpfs
in a private mount namespace); and memory stays bounded on an image larger than the bound."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import zarr

from tensor_server.errors import InvalidArgument
from tensor_server.export import ExportOptions
from tensor_server.export.layout import plan_layout
from tests.export.helpers import REPO, GeneratedPlane, run_cli
from tests.reliability.server_process import TMPFS_WRAPPER, can_mount_tmpfs


def test_an_unreadable_source_is_refused_naming_it(tmp_path):
    bad = tmp_path / "broken.tif"
    bad.write_bytes(b"II*\x00garbage")
    done = run_cli(str(bad), str(tmp_path / "o.zarr"))
    assert done.returncode == 2
    assert str(bad) in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "o.zarr.partial").exists()


def test_an_existing_destination_is_refused_without_overwrite_or_resume(tmp_path):
    zarr.create_array(str(tmp_path / "src.zarr"), data=np.arange(64 * 80, dtype=np.uint8).reshape(64, 80))
    (tmp_path / "o.zarr").mkdir()
    done = run_cli(str(tmp_path / "src.zarr"), str(tmp_path / "o.zarr"))
    assert done.returncode == 2 and "o.zarr exists; pass --overwrite" in done.stderr
    (tmp_path / "o.zarr" / "notes.txt").write_text("mine")
    done = run_cli(str(tmp_path / "src.zarr"), str(tmp_path / "o.zarr"), "--overwrite")
    assert done.returncode == 2 and "is not an image this export tool wrote" in done.stderr
    assert "not replacing it" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "o.zarr" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(levels=0), "levels must be"),
        (dict(levels="deep"), "levels must be"),
        (dict(codec="lz4"), "codec 'lz4'"),
        (dict(ngff="0.6"), "ngff version"),
        (dict(chunks=(0, 4)), "chunks must be positive"),
        (dict(chunks=(64, 64), shards=(100, 128)), "whole number of chunks"),
        (dict(workers=1000), "workers must be"),
    ],
)
def test_malformed_options_are_refused(options, match):
    with pytest.raises(InvalidArgument, match=match):
        ExportOptions(**options)


def test_options_from_a_json_body_and_a_geometry_that_does_not_fit():
    opts = ExportOptions.from_mapping({"levels": "3", "chunks": "128,128", "shards": [256, 256], "ngff": "0.4"})
    assert (opts.levels, opts.chunks, opts.shards, opts.zarr_format) == (3, (128, 128), (256, 256), 2)
    with pytest.raises(InvalidArgument, match="unknown export option"):
        ExportOptions.from_mapping({"level": 3})
    t = GeneratedPlane((40, 40))
    with pytest.raises(InvalidArgument, match="has 3 values; the output has 2 axes"):
        plan_layout(t, chunks=(1, 8, 8))
    with pytest.raises(InvalidArgument, match="past one pixel"):
        plan_layout(t, levels=9)


@pytest.fixture()
def tmpfs_ok(tmp_path):
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root)")


def test_a_full_disk_is_a_clear_error_and_nothing_claims_to_be_complete(tmp_path, tmpfs_ok):
    src = tmp_path / "noise.zarr"  # 4 MiB that do not compress, onto a 1 MiB disk
    zarr.create_array(str(src), data=np.random.default_rng(0).integers(0, 2**16, (1024, 2048), dtype=np.uint16))
    disk = tmp_path / "disk"
    disk.mkdir()
    export = [sys.executable, "-m", "tensor_server", "export", str(src), str(disk / "o.zarr"), "--progress", "none"]
    # inside the namespace: the export, then what is on the disk (the tmpfs is gone after)
    script = " ".join(f"'{a}'" for a in export) + f"; echo rc=$?; ls -a '{disk}'"
    done = subprocess.run(
        TMPFS_WRAPPER + [str(disk), "1m", "true", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": f"{REPO}:{REPO / 'kernels'}", "PATH": "/usr/bin:/bin"},
    )
    assert "rc=2" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "no space left on the device" in done.stderr and str(disk / "o.zarr.partial") in done.stderr
    assert "--resume" in done.stderr and "Traceback" not in done.stderr
    listing = done.stdout.split("rc=2", 1)[1].split()
    assert "o.zarr" not in listing and "o.zarr.partial" in listing


RSS_SCRIPT = """
import json, resource, sys
import numpy as np
from tests.export.helpers import GeneratedPlane, peak_rss
from tensor_server.export import ExportOptions, export_tensor
# the same levels on a small image first: compiling the kernels costs memory once, not per image
export_tensor(GeneratedPlane((600, 700)), sys.argv[1] + "/warm.zarr", ExportOptions(codec="zstd", levels=4))
base = peak_rss()
edge, limit = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # the process may not even address the image
try:
    np.empty((edge, edge), np.uint16)
    held = True
except MemoryError:
    held = False
s = export_tensor(GeneratedPlane((edge, edge)), sys.argv[1] + "/big.zarr", ExportOptions(codec="zstd"),
                  progress=lambda r: r["event"] == "start" and print(json.dumps(r)))
peak = peak_rss()
print(json.dumps({"base": base, "peak": peak, "levels": s["levels"], "image_fits": held}))
"""


def test_peak_memory_does_not_grow_with_the_image(tmp_path):
    """A 1.125 GiB image (24576², uint16) exported with the default geometry by a process
    whose address space is limited to 1 GiB (it cannot allocate the image: checked), and its
    peak RSS grows by less than the stated bound, (read_ahead + write_ahead + 2) units plus
    one shard's encode buffers per writer — far less than the image."""
    edge, limit = 24576, 1 << 30
    done = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path), str(edge), str(limit)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={
            "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "MALLOC_ARENA_MAX": "2",
        },
    )  # as the command sets
    assert done.returncode == 0, done.stderr[-2000:]
    start, result = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    image = edge * edge * 2
    assert image > limit and not result["image_fits"]
    options = ExportOptions()
    shard_bytes = 2048 * 2048 * 2
    bound = (options.read_ahead + options.write_ahead + 2) * start["unit_bytes"] + 2 * options.workers * shard_bytes
    growth = result["peak"] - result["base"]
    assert result["levels"][0] == [edge, edge] and result["levels"][-1] == [384, 384]  # down to one 512² tile
    assert growth < bound < image / 2, (growth, bound, image)
