"""Shared fixtures. Real third-party sample files live in ../shared/testdata (beside the
repository); every test that needs them goes through the ``testdata`` fixture, which skips
with a clear message when the folder is absent (e.g. a clone without the shared data)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_REPO = Path(__file__).resolve().parent.parent


def _testdata_dir() -> Path | None:
    env = os.environ.get("TENSOR_SERVER_TESTDATA")
    candidates = [Path(env)] if env else []
    candidates.append(_REPO.parent / "shared" / "testdata")
    for c in candidates:
        if (c / "expected.json").is_file():
            return c
    return None


#: how every real-sample test skips; the run's summary counts the skips by it
NO_SAMPLES = "real sample files not found"


@pytest.fixture(scope="session")
def testdata() -> Path:
    """The real-sample folder (``../shared/testdata``); skips when it is absent."""
    d = _testdata_dir()
    if d is None:
        pytest.skip(
            f"{NO_SAMPLES}: expected ../shared/testdata/expected.json "
            "beside the repository (or set TENSOR_SERVER_TESTDATA)"
        )
    return d


def real_sample_skips(skipped: list) -> str | None:
    """The summary line for the real-sample tests among ``skipped`` reports (None: none skipped).
    Why a line of its own: in a plain clone they are most of the skips, and "361 skipped" alone
    does not say that a folder beside the repository would run them."""
    count = sum(NO_SAMPLES in str(getattr(report, "longrepr", "")) for report in skipped)
    if not count:
        return None
    return (
        f"{count} real-sample tests skipped: set TENSOR_SERVER_TESTDATA=/path/to/testdata (a folder with "
        "expected.json) or put it at ../shared/testdata beside the repository (its SOURCES.md says "
        "where each sample comes from)"
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the other summaries (outermost wrapper: -ra's skip list comes first), so the line
    sits just above the final counts."""
    try:
        return (yield)
    finally:
        line = real_sample_skips(terminalreporter.stats.get("skipped", []))
        if line:
            terminalreporter.write_line(line, yellow=True)


@pytest.fixture(scope="session")
def expected(testdata: Path) -> dict:
    """``expected.json``: per sample file, reader, shape, dtype, axes, min, max and sum."""
    return json.loads((testdata / "expected.json").read_text())


@pytest.fixture(scope="session")
def luxar():
    """luxar's encoding modules (encoder, decoder, enums, zarr facade); skips when luxar is
    not installed (``make setup`` installs it; see tensor_server/testing/luxar.py)."""
    from tensor_server.testing.luxar import luxar_encoding

    lx = luxar_encoding()
    if lx is None:
        pytest.skip("luxar is not installed: run `make setup` (installs luxar==2026.10.22 --no-deps)")
    return lx


@pytest.fixture(scope="session", autouse=True)
def _private_server_home(tmp_path_factory):
    """Servers the tests start (in-process defaults and ``python -m tensor_server`` children)
    keep their catalog, chunk caches and annotations in a folder of this session, one per
    pytest-xdist worker: never in the user's ~/.cache or ~/.local/share (a test server would
    rewrite the user's catalog), never in a file another worker holds."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TENSOR_SERVER_HOME", str(tmp_path_factory.mktemp("server-home")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _root_log_handlers_restored():
    """A test that runs the command line installs its stderr handler on the root logger, bound
    to that test's captured stream, which pytest closes after it. Left in place, a record logged
    later (aiohttp's "Unclosed client session" at the worker's exit) prints "Logging error"
    tracebacks into the run's output; the handlers are put back as they were."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def zarr_folder(tmp_path) -> Iterator[tuple[Path, Any]]:
    """A folder holding ``img.zarr`` (zarr v2, 128² uint16 counting up, 2x2 chunks of 64²), and
    its scanned ``Catalog`` (closed after the test): a store on disk whose chunk files a test
    can rewrite under a running server."""
    import numpy as np
    import zarr

    from tensor_server.catalog import Catalog

    root = tmp_path / "data"
    root.mkdir()
    z = zarr.open_array(str(root / "img.zarr"), mode="w", shape=(128, 128), chunks=(64, 64), dtype="u2", zarr_format=2)
    z[...] = np.arange(128 * 128, dtype=np.uint16).reshape(128, 128)
    cat = Catalog([root])
    cat.scan()
    yield root, cat
    cat.close()
