"""``make run`` installs the viewer page's OpenSeadragon before it starts the server, so the
catalog page draws on a fresh clone (the page otherwise says how to get it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_make_run_installs_the_viewer_assets_before_serving():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    plan = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO), "run"], capture_output=True, text=True, check=True
    ).stdout
    install = plan.find("npm install")
    serve = plan.find("-m tensor_server run")
    assert install != -1 and serve != -1, plan
    assert install < serve, "the assets are installed before the server starts"
    assert ".viewer-assets" in plan[install : plan.find("\n", install)]
