"""READY means every file is there, and a damaged store never stops a start.

* ``set_upload_status(READY)`` is refused (FAILED_PRECONDITION naming the file; the upload
  stays PENDING) while a file the store's metadata names is missing.
* A READY store damaged while the server was down (a metadata file deleted, a chunk file or
  segment cut short, its marker or descriptor garbage) comes back as a DISCARDED tombstone
  whose reason names the folder and what is wrong, with one warning line; its files are kept,
  and every other upload is adopted as usual. Real servers: an in-process Flight door for
  each case, and ``python -m tensor_server serve`` for the start that used to die with a
  traceback (issue 40).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient
from pyarrow import flight

from tests.uploads.conftest import upload_server

_REPO = Path(__file__).resolve().parents[2]
ARR = (np.arange(64 * 96, dtype=np.uint16) * 7 + 1).reshape(64, 96)


def _store(server, array_id: str) -> Path:
    return server.runtime.uploads.get(array_id).member.path


# ---- READY ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scheme, lost",
    [("zarr", "0/.zarray"), ("zarr", ".zgroup"), ("cache", "descriptor.json"), ("cache", "seg_0000.arrow")],
)
def test_ready_is_refused_while_a_file_of_the_store_is_missing(client, server, scheme, lost):
    desc = client.setup_array_upload(f"{scheme}://scratch/@fields/lost", ARR, chunk_shape=(32, 96))
    client.upload_array(desc, ARR, slice_hint=(slice(0, 64), slice(None)))  # every chunk, not yet READY
    (_store(server, desc.array_id) / lost).unlink()  # behind the server's back
    with pytest.raises(flight.FlightServerError, match=f"is missing {re.escape(lost)}") as err:
        client.set_upload_status(desc.array_id, "READY")
    assert '"FAILED_PRECONDITION"' in bytes(err.value.extra_info).decode()
    assert client.get_upload_status(desc.array_id)["state"] == "PENDING"  # nothing was announced
    assert client.set_upload_status(desc.array_id, "DISCARDED")["state"] == "DISCARDED"


def test_ready_records_the_files_it_fsynced(client, server):
    import json

    desc = client.setup_array_upload("zarr://scratch/@fields/listed", ARR, chunk_shape=(32, 96))
    client.upload_array(desc, ARR)
    store = _store(server, desc.array_id)
    listed = json.loads((store / "files.json").read_text())["files"]
    assert {".zgroup", "0/.zarray"} <= set(listed) and listed["0/.zarray"] == (store / "0/.zarray").stat().st_size
    chunks = sorted(p.relative_to(store).as_posix() for p in (store / "0").iterdir() if not p.name.startswith("."))
    assert chunks and set(chunks) <= set(listed)


# ---- boot ----------------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _first_chunk(store: Path) -> Path:
    return next(p for p in sorted((store / "0").iterdir()) if not p.name.startswith("."))


DAMAGE = {
    "zarr: 0/.zarray deleted": ("zarr", lambda s: (s / "0" / ".zarray").unlink(), "0/.zarray is missing"),
    "zarr: .zgroup deleted": ("zarr", lambda s: (s / ".zgroup").unlink(), ".zgroup is missing"),
    "zarr: a chunk file truncated": ("zarr", lambda s: _truncate(_first_chunk(s)), "where READY wrote"),
    "zarr: garbage .zattrs": (
        "zarr",
        lambda s: (s / ".zattrs").write_text("{not json"),
        ".zattrs holds no readable upload marker",
    ),
    "zarr: garbage 0/.zarray": ("zarr", lambda s: (s / "0" / ".zarray").write_text("]["), "damaged"),
    "cache: garbage descriptor.json": (
        "cache",
        lambda s: (s / "descriptor.json").write_bytes(b"\x00\xff"),
        "descriptor.json holds no readable upload marker",
    ),
    "cache: descriptor without a shape": (
        "cache",
        lambda s: _drop_key(s / "descriptor.json", "shape"),
        "descriptor.json has no valid shape, dtype and chunk_shape",
    ),
    "cache: a segment truncated": ("cache", lambda s: _truncate(s / "seg_0000.arrow"), "where READY wrote"),
    "cache: a segment deleted": ("cache", lambda s: (s / "seg_0000.arrow").unlink(), "seg_0000.arrow is missing"),
}


def _drop_key(path: Path, key: str) -> None:
    import json

    doc = json.loads(path.read_text())
    del doc[key]
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_store_damaged_while_down_is_discarded_with_its_reason_at_boot(tmp_path, caplog, case):
    scheme, damage, why = DAMAGE[case]
    with upload_server(tmp_path) as srv:
        c = TensorFlightClient(srv.location)
        for name in ("victim", "healthy"):
            desc = c.setup_array_upload(f"{scheme}://scratch/@fields/{name}", ARR, chunk_shape=(32, 96))
            assert c.upload_array(desc, ARR)["state"] == "READY"
        store = _store(srv, "scratch/@fields/victim")
    damage(store)
    kept = sorted(p.relative_to(store) for p in store.rglob("*"))
    caplog.set_level(logging.WARNING, logger="tensor_server.uploads")
    with upload_server(tmp_path) as srv:  # starts: the damage is one upload's, not the server's
        c = TensorFlightClient(srv.location)
        st = c.get_upload_status("scratch/@fields/victim")
        assert st["state"] == "DISCARDED" and str(store) in st["reason"] and why in st["reason"]
        with pytest.raises(flight.FlightError, match="was discarded"):
            c.get_array("scratch/@fields/victim")
        assert c.get_array("scratch/@fields/healthy").tobytes() == ARR.tobytes()
        with pytest.raises(flight.FlightServerError, match="already exists as"):  # the name stays taken
            c.setup_array_upload(f"{scheme}://scratch/@fields/victim", ARR)
        assert srv.runtime.uploads.boot_summary == {"adopted": 1, "removed": 0, "damaged": 1}
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == kept  # nothing of it was deleted
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(store) in warnings[0] and why in warnings[0] and "\n" not in warnings[0]


def test_a_damaged_pending_store_left_by_a_crash_is_removed_at_boot(tmp_path):
    """PENDING at boot is a crash's leftover of this write dir (held by this server): removed
    as before, damaged or not, and its name is free again."""
    with upload_server(tmp_path) as srv:
        c = TensorFlightClient(srv.location)
        desc = c.setup_array_upload("zarr://scratch/@fields/crashed", ARR, chunk_shape=(32, 96))
        store = _store(srv, desc.array_id)
    (store / "0" / ".zarray").unlink()
    with upload_server(tmp_path) as srv:
        assert srv.runtime.uploads.boot_summary == {"adopted": 0, "removed": 1, "damaged": 0}
        assert not store.exists()
        c = TensorFlightClient(srv.location)
        assert c.setup_array_upload("zarr://scratch/@fields/crashed", ARR).array_id == "scratch/@fields/crashed"


def test_a_member_folder_without_a_marker_is_kept_and_named_by_its_place(tmp_path):
    stray = tmp_path / "write" / "fields" / "scratch" / "half-made"
    stray.mkdir(parents=True)
    (stray / "data.bin").write_bytes(b"someone's bytes")
    with upload_server(tmp_path) as srv:
        st = TensorFlightClient(srv.location).get_upload_status("scratch/@fields/half-made")
        assert st["state"] == "DISCARDED" and "no upload marker" in st["reason"]
    assert (stray / "data.bin").read_bytes() == b"someone's bytes"


def test_serve_starts_over_a_store_missing_its_zarray(tmp_path):
    """The start that died with a 40-line ArrayNotFoundError traceback from ``_adopt``: it
    serves, says why in one warning line, and the upload reads as DISCARDED with the reason."""
    (tmp_path / "root").mkdir()
    write = tmp_path / "write"
    with upload_server(tmp_path) as srv:  # a READY zarr upload in the write dir
        c = TensorFlightClient(srv.location)
        desc = c.setup_array_upload("zarr://scratch/@fields/hurt", ARR, chunk_shape=(32, 96))
        c.upload_array(desc, ARR)
        store = _store(srv, desc.array_id)
    (store / "0" / ".zarray").unlink()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_REPO), str(_REPO / "kernels")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensor_server",
            "serve",
            str(tmp_path / "root"),
            "--port",
            "0",
            "--write-dir",
            str(write),
            "--writable",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines, location = [], None
        deadline = time.monotonic() + 60
        while location is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
            m = re.search(r"listening on (grpc://\S+)", line)
            location = m and m.group(1)
        assert location, "".join(lines)
        text = "".join(lines)
        assert "Traceback" not in text
        warned = [ln for ln in lines if "scratch/@fields/hurt" in ln]
        assert len(warned) == 1 and "0/.zarray is missing" in warned[0] and str(store) in warned[0]
        st = TensorFlightClient(location).get_upload_status("scratch/@fields/hurt")
        assert st["state"] == "DISCARDED" and "0/.zarray is missing" in st["reason"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
