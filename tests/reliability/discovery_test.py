"""Nothing a root contains may stop discovery (issue 12, High 7): FIFOs, sockets, symlink
loops and huge sparse files are skipped or given up on with a reason, the scan goes on,
health reports it, and ``python -m tensor_server list`` does not crash."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow.flight as flight

from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tensor_server.testing.deadline import finishes_within
from tests.flight.conftest import client_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hostile_root(root):
    """A FIFO and a socket named like sources, a symlink loop, a dangling link, and real
    sources sorted before and after each of them."""
    np.save(root / "a_first.npy", np.arange(6).reshape(2, 3))
    os.mkfifo(root / "b_pipe.npy")
    (root / "c_loop.tif").symlink_to(root / "c_loop2.tif")
    (root / "c_loop2.tif").symlink_to(root / "c_loop.tif")
    (root / "d_self").symlink_to(root / "d_self")
    (root / "e_dangling.npy").symlink_to(root / "nowhere.npy")
    sub = root / "f_sub"
    sub.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sub / "g_socket.npy"))
    np.save(sub / "h_last.npy", np.arange(4))
    return sock


def test_fifos_sockets_and_symlink_loops_do_not_stop_the_scan(tmp_path):
    sock = _hostile_root(tmp_path)
    try:
        cat = Catalog([tmp_path])
        summary = finishes_within(cat.scan, 30)
        names = sorted(r.path.name for r in cat.records())
        assert names == ["a_first.npy", "h_last.npy"] and all(r.is_resolved for r in cat.records())
        skipped = {p.name: why for p, why in cat.skipped}
        assert set(skipped) == {"b_pipe.npy", "c_loop.tif", "c_loop2.tif", "d_self", "e_dangling.npy", "g_socket.npy"}
        assert "FIFO" in skipped["b_pipe.npy"] and "FIFO" in skipped["g_socket.npy"]
        assert skipped["c_loop.tif"] == "symlink loop" and skipped["d_self"] == "symlink loop"
        assert "dangling" in skipped["e_dangling.npy"]
        assert summary["skipped"] == 6 and cat.scan_error.startswith("6 entries skipped")
        # a rescan (the periodic one) goes through the same entries again without hanging
        assert finishes_within(cat.scan, 30)["total"] == 2
        cat.close()
    finally:
        sock.close()


def test_health_reports_the_scan_error(tmp_path):
    np.save(tmp_path / "ok.npy", np.zeros(3))
    os.mkfifo(tmp_path / "pipe.npy")
    cat = Catalog([tmp_path])
    finishes_within(cat.scan, 30)
    with serving(cat) as srv:
        raw = flight.FlightClient(srv.location)
        health = json.loads(next(iter(raw.do_action(flight.Action("health", b"")))).body.to_pybytes())
        assert health["status"] == "SERVING" and health["source_count"] == 1
        assert "pipe.npy" in health["scan_error"] and "FIFO" in health["scan_error"]
        np.testing.assert_array_equal(client_for(srv).get_array(cat.records()[0].source_id), np.zeros(3))
    cat.close()
    clean = Catalog([tmp_path / "ok.npy"])
    clean.scan()
    assert clean.scan_error is None


def test_list_command_survives_a_hostile_root(tmp_path):
    sock = _hostile_root(tmp_path)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tensor_server", "list", str(tmp_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "kernels")])},
        )
    finally:
        sock.close()
    assert out.returncode == 0, out.stderr
    assert "a_first" in out.stdout and "h_last" in out.stdout
    assert "SKIPPED" in out.stdout and "symlink loop" in out.stdout and "FIFO" in out.stdout


def test_huge_sparse_file_is_given_up_on_and_the_scan_goes_on(tmp_path):
    huge = tmp_path / "huge.dcm"
    with open(huge, "wb") as fh:
        fh.truncate(1 << 40)  # 1 TiB of zeros, no blocks on disk
    np.save(tmp_path / "later.npy", np.arange(5))
    cat = Catalog([tmp_path], open_timeout_seconds=2)
    finishes_within(cat.scan, 30)
    rows = {r.path.name: r for r in cat.records()}
    assert rows["later.npy"].is_resolved
    assert not rows["huge.dcm"].is_resolved and "gave up" in rows["huge.dcm"].unresolved_reason
    # the abandoned reader stops itself at the same deadline (it does not parse for days)
    deadline = time.monotonic() + 20
    while any(t.name == "tensor-server-open" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(t.name == "tensor-server-open" for t in threading.enumerate())
    cat.close()
