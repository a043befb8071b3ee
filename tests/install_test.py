"""The serving install (``pip install tensor-server``, what ``make run`` installs) serves without
the extras: in a venv that holds only the package and its base dependencies, ``python -I``
(no PYTHONPATH, no user site) starts ``serve`` on a TIFF and the biopb client reads its pixels.

Two ways to build that venv:

* in the suite: the closure of ``[project].dependencies`` (pyproject.toml, markers and the
  extras they name, such as ``biopb[tensor]``) is resolved from this environment's installed
  metadata, and each distribution's files (with their bytecode) are linked into an empty venv,
  the project's packages from this checkout. Seconds, no network: a faithful check that no
  import on the serving path needs a test, bench or optional package. It does not check that
  pip resolves the same versions from the index.
* ``TENSOR_SERVER_INSTALL_TEST=1``: a real ``pip install .`` into an empty venv. It is 1.5-3
  minutes and 1 GB from the package index on this project's machines (pip's cache does not
  keep what it fetches here), so it is not part of every run; it skips with this reason.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

import numpy as np
import pytest
import tifffile
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: what only the extras bring; none may be importable in the serving venv (so the check is real)
EXTRAS_ONLY = ["pytest", "napari", "moto", "s3fs", "asv", "tensorstore", "selenium", "distributed"]


def base_closure() -> dict[str, importlib.metadata.Distribution]:
    """Every installed distribution the package's base dependencies reach (name -> dist)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [(Requirement(r), {""}) for r in project["dependencies"]]
    dists: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, parent_extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in parent_extras):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(req.name)
        dists[key[0]] = dist
        todo += [(Requirement(r), {""} | set(req.extras)) for r in dist.requires or []]
    return dists


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _link_distribution(dist: importlib.metadata.Distribution, site: Path) -> None:
    """Link each of ``dist``'s installed files (and the bytecode beside them) into ``site``."""
    for file in dist.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue  # scripts in bin/, and bytecode (linked per folder below)
        source, target = Path(str(dist.locate_file(file))), site / file
        if not source.exists() or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)
        cache = source.parent / "__pycache__"
        if cache.is_dir() and not (target.parent / "__pycache__").exists():
            (target.parent / "__pycache__").symlink_to(cache)


def serving_venv(path: Path) -> Path:
    """An empty venv holding only the base closure and this checkout's packages; its python."""
    venv.EnvBuilder(with_pip=False).create(path)
    site = _site_packages(path)
    for name, dist in base_closure().items():
        if name != "tensor-server":
            _link_distribution(dist, site)
    (site / "tensor_server").symlink_to(ROOT / "tensor_server")
    (site / "tensor_server_kernels").symlink_to(ROOT / "kernels" / "tensor_server_kernels")
    return path / "bin" / "python"


_CLIENT = """
import json, sys
from biopb.tensor import TensorFlightClient
client = TensorFlightClient(sys.argv[1])
rows = client.query("SELECT t.array_id FROM (SELECT unnest(tensors) AS t FROM sources WHERE is_resolved)",
                    format="records")
full = client.get_array(rows[0]["array_id"])
crop = client.get_array(rows[0]["array_id"], slice_hint=(slice(10, 20), slice(30, 50)))
print(json.dumps({"ids": [r["array_id"] for r in rows], "shape": list(full.shape), "dtype": str(full.dtype),
                  "full": full.tolist(), "crop": crop.tolist()}))
"""


def _missing_extras(python: Path) -> list[str]:
    code = (
        "import importlib.util, json, sys; "
        f"print(json.dumps([m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m) is not None]))"
    )
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def assert_serves_a_tiff(python: Path, tmp: Path) -> None:
    """``python -I -m tensor_server serve`` on a folder with one TIFF; the biopb client, run by
    the same python, reads it whole and cropped, pixel for pixel."""
    assert _missing_extras(python) == [], "the serving venv holds extras' packages: the check would not be real"
    data = tmp / "data"
    data.mkdir()
    pixels = (np.arange(64 * 96, dtype=np.uint16).reshape(64, 96) * 7) % 65521
    tifffile.imwrite(data / "plane.tif", pixels)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["TENSOR_SERVER_HOME"] = str(tmp / "home")
    server = subprocess.Popen(
        [str(python), "-I", "-m", "tensor_server", "serve", str(data), "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        location, said = None, []
        deadline = time.monotonic() + 120
        while location is None and time.monotonic() < deadline:
            line = server.stdout.readline() if server.stdout else ""
            if not line:
                break
            said.append(line)
            found = re.search(r"grpc://127\.0\.0\.1:\d+", line)
            location = found.group(0) if found else None
        assert location, "the server printed no grpc:// location:\n" + "".join(said)
        done = subprocess.run(
            [str(python), "-I", "-c", _CLIENT, location], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert len(got["ids"]) == 1 and got["ids"][0].startswith("plane-")
    assert (got["shape"], got["dtype"]) == ([64, 96], "uint16")
    np.testing.assert_array_equal(np.array(got["full"], dtype=np.uint16), pixels)
    np.testing.assert_array_equal(np.array(got["crop"], dtype=np.uint16), pixels[10:20, 30:50])


def test_the_base_closure_leaves_the_extras_out():
    names = set(base_closure())
    assert {"numpy", "numba", "pyarrow", "tifffile", "duckdb", "biopb", "dask", "uvicorn", "httptools"} <= names
    assert not names & {
        "pytest",
        "napari",
        "moto",
        "s3fs",
        "asv",
        "tensorstore",
        "selenium",
        "distributed",
        "watchfiles",
        "websockets",
    }


@pytest.mark.slow
def test_the_serving_closure_serves_a_tiff_without_the_extras(tmp_path):
    assert_serves_a_tiff(serving_venv(tmp_path / "venv"), tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TENSOR_SERVER_INSTALL_TEST") != "1",
    reason="a real pip install from the package index (1.5-3 min, 1 GB): set TENSOR_SERVER_INSTALL_TEST=1 to run it",
)
def test_pip_install_dot_serves_a_tiff_without_the_extras(tmp_path):
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_serves_a_tiff(python, tmp_path)
