"""Interrupted exports continue with --resume to the same bytes as an uninterrupted one: after
a cancel (in process), after Ctrl-C and after kill -9 (real subprocesses); the progress record
is verified, so a torn record line or a changed shard is written again, never trusted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from tensor_server.adapters.registry import open_source
from tensor_server.errors import FailedPrecondition, ReadCancelled
from tensor_server.export import ExportOptions, export_tensor
from tensor_server.export.store import RECORD
from tests.export.helpers import REPO, GeneratedPlane, run_cli

OPTIONS = dict(levels=3, chunks=(128, 128), shards=(256, 256))


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _stop_after(n: int):
    seen = []

    def progress(record):
        if record["event"] == "unit":
            seen.append(record["unit"])

    return progress, (lambda: len(seen) >= n), seen


def test_cancel_then_resume_gives_the_uninterrupted_bytes_and_rechecks_the_record(tmp_path):
    t = GeneratedPlane((1500, 1700))
    export_tensor(t, tmp_path / "clean.zarr", ExportOptions(**OPTIONS))
    progress, cancelled, seen = _stop_after(4)
    dest = tmp_path / "cut.zarr"
    with pytest.raises(ReadCancelled, match="--resume"):
        export_tensor(t, dest, ExportOptions(**OPTIONS, workers=1), progress=progress, cancelled=cancelled)
    staging = dest.with_name("cut.zarr.partial")
    assert not dest.exists() and (staging / RECORD).is_file()
    lines = (staging / RECORD).read_text().splitlines()
    entries = [json.loads(line) for line in lines[1:]]
    assert len(entries) >= 4
    # a written shard changed after it was recorded, and a torn last line: neither is trusted
    victim = next(k for e in entries for k, v in e["files"].items() if v)
    (staging / victim).write_bytes((staging / victim).read_bytes()[:-3])
    with open(staging / RECORD, "a") as f:
        f.write('{"unit": 99, "files": {')
    with pytest.raises(FailedPrecondition, match="interrupted export"):
        export_tensor(t, dest, ExportOptions(**OPTIONS))
    records = []
    summary = export_tensor(t, dest, ExportOptions(**OPTIONS, mode="resume"), progress=records.append)
    assert summary["units_resumed"] == len(entries) - 1
    assert records[0]["event"] == "start" and records[0]["units_resumed"] == len(entries) - 1
    assert all(json.loads(json.dumps(r)) == r for r in records)  # JSON-ready, as an action streams them
    assert not staging.exists()
    assert tree(dest) == tree(tmp_path / "clean.zarr")


def test_resume_refuses_other_options_and_overwrite_keeps_the_old_image_until_done(tmp_path):
    t = GeneratedPlane((900, 700))
    dest = tmp_path / "o.zarr"
    export_tensor(t, dest, ExportOptions(**OPTIONS))
    old = tree(dest)
    with pytest.raises(FailedPrecondition, match="exists; pass --overwrite"):
        export_tensor(t, dest, ExportOptions(**OPTIONS))
    progress, cancelled, _ = _stop_after(1)
    with pytest.raises(ReadCancelled):
        export_tensor(
            t,
            dest,
            ExportOptions(**{**OPTIONS, "levels": 2}, mode="overwrite", workers=1),
            progress=progress,
            cancelled=cancelled,
        )
    assert tree(dest) == old  # the finished image is whole until its replacement is
    with pytest.raises(FailedPrecondition, match="other options"):
        export_tensor(t, dest, ExportOptions(**OPTIONS, mode="resume"))
    export_tensor(t, dest, ExportOptions(**{**OPTIONS, "levels": 2}, mode="resume"))
    assert sorted(zarr.open_group(str(dest), mode="r").array_keys()) == ["0", "1"]
    assert not dest.with_name("o.zarr.partial").exists()


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """A 40 MiB zarr plane: enough units that a subprocess can be stopped part way."""
    d = tmp_path_factory.mktemp("src")
    y, x = np.ogrid[:4096, :5120]
    noise = np.random.default_rng(5).integers(0, 64, (4096, 5120), dtype=np.uint16)
    zarr.create_array(str(d / "plane.zarr"), data=(y * 3 + x).astype(np.uint16) + noise, chunks=(512, 512))
    clean = d / "clean.zarr"
    with open_source(d / "plane.zarr") as src:
        export_tensor(src.tensor(), clean, ExportOptions(levels=4, chunks=(64, 64), shards=(512, 512)))
    return d / "plane.zarr", clean


def _start(source: Path, dest: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "export",
            str(source),
            str(dest),
            "--levels",
            "4",
            "--chunks",
            "64,64",
            "--shards",
            "512,512",
            "--workers",
            "1",
            "--progress",
            "json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_units(proc: subprocess.Popen, n: int) -> None:
    for line in proc.stdout:
        record = json.loads(line)
        if record["event"] == "unit" and record["units_done"] >= n:
            return
    raise AssertionError(f"the export ended before {n} units: {proc.stderr.read()[-500:]}")


@pytest.mark.parametrize("how", ["kill -9", "ctrl-c"])
def test_an_interrupted_subprocess_resumes_to_identical_bytes(big_source, tmp_path, how):
    source, clean = big_source
    dest = tmp_path / "out.zarr"
    proc = _start(source, dest)
    _wait_for_units(proc, 3)
    proc.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGINT)
    proc.stdout.read()
    rc = proc.wait(timeout=120)
    stderr = proc.stderr.read()
    if how == "kill -9":
        assert rc == -signal.SIGKILL
    else:
        assert rc == 130 and "--resume" in stderr, stderr
    staging = dest.with_name("out.zarr.partial")
    assert not dest.exists() and (staging / RECORD).is_file()
    done = run_cli(
        str(source),
        str(dest),
        "--levels",
        "4",
        "--chunks",
        "64,64",
        "--shards",
        "512,512",
        "--resume",
        "--progress",
        "json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["event"] == "done" and 3 <= summary["units_resumed"] < summary["units_total"]
    assert tree(dest) == tree(clean)
