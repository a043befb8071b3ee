"""``--overwrite`` (and ``resume``) only ever remove what an export made: a user's folder at
DEST, a user's ``DEST.replaced``, the target of a symbolic link at DEST or DEST.partial, and a
resumed staging folder holding a link are left alone, each refusal naming the path; one export
at a time writes a given DEST."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from tensor_server.errors import FailedPrecondition
from tensor_server.export import ExportOptions, export_tensor
from tensor_server.export.store import MARKER, RECORD, written_export
from tests.export.helpers import GeneratedPlane, run_cli

OPTIONS = dict(levels=2, chunks=(64, 64), shards=(128, 128))


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def user_folder(path: Path) -> Path:
    """A folder of someone's own that looks like a zarr image (a group, an array "0") and
    holds a file of theirs."""
    group = zarr.open_group(str(path), mode="w")
    group.create_array("0", shape=(4, 4), dtype="u1")[...] = 7
    (path / "notes.txt").write_text("mine")
    return path


@pytest.fixture
def exported(tmp_path):
    t = GeneratedPlane((300, 260))
    dest = tmp_path / "o.zarr"
    export_tensor(t, dest, ExportOptions(**OPTIONS))
    return t, dest


def test_an_export_carries_the_writers_mark(exported):
    t, dest = exported
    mark = written_export(dest)
    assert mark["kind"] == "tensor-server export" and mark["fingerprint"]["array_id"] == "generated"
    assert zarr.open_group(str(dest), mode="r").attrs[MARKER] == mark


@pytest.mark.parametrize("ngff", ["0.5", "0.4"])
def test_overwrite_replaces_an_export_and_keeps_a_users_dest_replaced(tmp_path, ngff):
    t = GeneratedPlane((300, 260))
    dest = tmp_path / "o.zarr"
    export_tensor(t, dest, ExportOptions(**OPTIONS, ngff=ngff))
    theirs = user_folder(tmp_path / "o.zarr.replaced")
    before = tree(theirs)
    export_tensor(t, dest, ExportOptions(**{**OPTIONS, "levels": 1}, ngff=ngff, mode="overwrite"))
    assert sorted(zarr.open_group(str(dest), mode="r").array_keys()) == ["0"]
    assert tree(theirs) == before  # a sibling it did not make is never touched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.zarr", "o.zarr.replaced"]  # its own temp name is gone


def test_overwrite_refuses_a_users_folder_at_dest_and_leaves_it_whole(tmp_path):
    dest = user_folder(tmp_path / "o.zarr")
    before = tree(dest)
    with pytest.raises(FailedPrecondition, match="o.zarr exists and is not an image this export tool wrote"):
        export_tensor(GeneratedPlane((300, 260)), dest, ExportOptions(**OPTIONS, mode="overwrite"))
    assert tree(dest) == before and not dest.with_name("o.zarr.partial").exists()


def test_overwrite_refuses_an_export_a_user_added_to(exported):
    t, dest = exported
    (dest / "analysis.csv").write_text("mine")
    with pytest.raises(FailedPrecondition, match=r"holds \['analysis.csv'\], which no export writes"):
        export_tensor(t, dest, ExportOptions(**OPTIONS, mode="overwrite"))
    assert (dest / "analysis.csv").read_text() == "mine"


@pytest.mark.parametrize("mode", ["create", "overwrite", "resume"])
def test_a_link_at_dest_is_refused_and_its_target_left_whole(tmp_path, mode):
    """DEST a symbolic link to a user's folder — even to an export: the link is not replaced
    and what it points to is never deleted."""
    target = tmp_path / "elsewhere"
    export_tensor(GeneratedPlane((300, 260)), target, ExportOptions(**OPTIONS))
    (target / "notes.txt").write_text("mine")  # ... which the user then made their own
    before = tree(target)
    dest = tmp_path / "o.zarr"
    dest.symlink_to(target)
    with pytest.raises(FailedPrecondition, match="o.zarr (exists|is a symbolic link)"):
        export_tensor(GeneratedPlane((300, 260)), dest, ExportOptions(**OPTIONS, mode=mode))
    assert dest.is_symlink() and tree(target) == before


def test_overwrite_refuses_a_link_at_dest_pointing_at_an_export(tmp_path):
    target = tmp_path / "elsewhere.zarr"
    export_tensor(GeneratedPlane((300, 260)), target, ExportOptions(**OPTIONS))
    before = tree(target)
    dest = tmp_path / "o.zarr"
    dest.symlink_to(target)
    with pytest.raises(FailedPrecondition, match="o.zarr is a symbolic link; an export never writes through one"):
        export_tensor(GeneratedPlane((300, 260)), dest, ExportOptions(**OPTIONS, mode="overwrite"))
    assert tree(target) == before


@pytest.mark.parametrize("mode", ["create", "overwrite", "resume"])
def test_a_link_at_the_staging_folder_is_refused_and_its_target_left_whole(tmp_path, mode):
    """DEST.partial a link to a folder holding what looks like a progress record: neither
    deleted (overwrite) nor written into (resume)."""
    target = user_folder(tmp_path / "theirs")
    (target / RECORD).write_text(json.dumps({"kind": "tensor-server export progress"}) + "\n")
    before = tree(target)
    (tmp_path / "o.zarr.partial").symlink_to(target)
    with pytest.raises(FailedPrecondition, match="o.zarr.partial is a symbolic link"):
        export_tensor(GeneratedPlane((300, 260)), tmp_path / "o.zarr", ExportOptions(**OPTIONS, mode=mode))
    assert tree(target) == before


def test_a_resumed_staging_folder_holding_a_link_is_not_written_into(tmp_path):
    t = GeneratedPlane((600, 520))
    dest = tmp_path / "o.zarr"
    seen = []
    with pytest.raises(Exception, match="stopped"):
        export_tensor(
            t,
            dest,
            ExportOptions(**OPTIONS, workers=1),
            progress=seen.append,
            cancelled=lambda: sum(r["event"] == "unit" for r in seen) >= 2,
        )
    staging = dest.with_name("o.zarr.partial")
    outside = user_folder(tmp_path / "outside")
    before = tree(outside)
    shutil.rmtree(staging / "1" / "c")
    os.symlink(outside, staging / "1" / "c")  # a level's chunk folder, sent elsewhere
    with pytest.raises(FailedPrecondition, match=r"holds a symbolic link \(1/c\), which an export never writes"):
        export_tensor(t, dest, ExportOptions(**OPTIONS, mode="resume"))
    assert tree(outside) == before
    export_tensor(t, dest, ExportOptions(**OPTIONS, mode="overwrite"))  # starting over removes the link, not its target
    assert tree(outside) == before and written_export(dest) is not None


def test_overwrite_refuses_a_staging_folder_that_is_not_an_exports(tmp_path):
    theirs = user_folder(tmp_path / "o.zarr.partial")
    before = tree(theirs)
    with pytest.raises(FailedPrecondition, match="is not an export's staging folder"):
        export_tensor(GeneratedPlane((300, 260)), tmp_path / "o.zarr", ExportOptions(**OPTIONS, mode="overwrite"))
    assert tree(theirs) == before


def test_resume_of_a_finished_dest_does_nothing_only_when_it_is_this_export(exported):
    t, dest = exported
    before = tree(dest)
    summary = export_tensor(t, dest, ExportOptions(**OPTIONS, mode="resume"))
    assert summary["already_complete"] is True
    with pytest.raises(FailedPrecondition, match="is not this export, finished \\(another source or other options\\)"):
        export_tensor(t, dest, ExportOptions(**{**OPTIONS, "levels": 1}, mode="resume"))
    assert tree(dest) == before


def test_resume_refuses_a_users_folder_at_dest(tmp_path):
    dest = user_folder(tmp_path / "o.zarr")
    with pytest.raises(FailedPrecondition, match="not an image this export tool wrote"):
        export_tensor(GeneratedPlane((300, 260)), dest, ExportOptions(**OPTIONS, mode="resume"))


def test_one_export_at_a_time_writes_a_dest(tmp_path):
    """A second export to the same DEST while one runs is refused (two would delete each
    other's staging folder); the first finishes untouched."""
    t = GeneratedPlane((600, 520))
    dest = tmp_path / "o.zarr"
    first_started, release = threading.Event(), threading.Event()

    def progress(record):
        if record["event"] == "unit":
            first_started.set()
            assert release.wait(30)

    first = threading.Thread(
        target=export_tensor, args=(t, dest, ExportOptions(**OPTIONS)), kwargs={"progress": progress}
    )
    first.start()
    try:
        assert first_started.wait(30)
        with pytest.raises(FailedPrecondition, match="o.zarr: another export to it is running"):
            export_tensor(t, dest, ExportOptions(**OPTIONS, mode="overwrite"))
    finally:
        release.set()
        first.join(60)
    assert written_export(dest) is not None and not dest.with_name("o.zarr.partial").exists()


def test_the_command_refuses_a_link_at_dest_in_one_line(tmp_path):
    zarr.create_array(str(tmp_path / "src.zarr"), data=np.zeros((128, 128), np.uint16))
    target = user_folder(tmp_path / "theirs")
    (tmp_path / "o.zarr").symlink_to(target)
    done = run_cli(str(tmp_path / "src.zarr"), str(tmp_path / "o.zarr"), "--overwrite")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is a symbolic link" in done.stderr
    assert (target / "notes.txt").read_text() == "mine"


def test_a_folder_that_appears_at_dest_during_an_export_is_not_replaced_and_the_work_is_kept(tmp_path):
    """Checked again at the very end: a user's folder made at DEST while the export ran is
    left whole, and the finished staging folder can still be resumed once it is moved away."""
    t = GeneratedPlane((600, 520))
    dest = tmp_path / "o.zarr"

    def progress(record):
        if record["event"] == "unit" and not dest.exists():
            user_folder(dest)

    with pytest.raises(FailedPrecondition, match="not an image this export tool wrote"):
        export_tensor(t, dest, ExportOptions(**OPTIONS), progress=progress)
    assert (dest / "notes.txt").read_text() == "mine"
    (dest).rename(tmp_path / "moved")
    summary = export_tensor(t, dest, ExportOptions(**OPTIONS, mode="resume"))
    assert summary["units_resumed"] == summary["units_total"] and written_export(dest) is not None
