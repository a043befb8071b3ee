"""One test-file convention: a module that holds tests is ``<subject>_test.py``, in the folder
that mirrors the package folder of its subject (``tests/core/`` for ``tensor_server/core``).
Checked here, so a ``test_*.py`` file (which pytest would still collect) or a loose file at the
top level is caught when it is added; ``test_the_check_can_fail`` keeps this honest."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: top-level test modules: their subjects are top-level too (the README, the command line and its
#: start-up block, logging and workers, the package's install, import graph and token owners, the error
#: taxonomy, the suite's own summary, this convention)
TOP_LEVEL = {
    "readme_test.py",
    "cli_test.py",
    "cli_share_test.py",
    "cli_banner_test.py",
    "cli_logging_test.py",
    "cli_workers_test.py",
    "cli_workers_load_test.py",
    "cli_workers_reads_test.py",
    "install_test.py",
    "layering_test.py",
    "import_hygiene_test.py",
    "token_owners_test.py",
    "errors_test.py",
    "skip_summary_test.py",
    "naming_test.py",
}


def misnamed(path: Path, source: str) -> str | None:
    """Why ``path`` breaks the convention, or None."""
    holds_tests = re.search(r"^\s*(async\s+)?def test_|^class Test", source, re.M) is not None
    if holds_tests and not path.name.endswith("_test.py"):
        return f"{path}: holds tests but is not named <subject>_test.py"
    if path.parent == TESTS and path.name.endswith("_test.py") and path.name not in TOP_LEVEL:
        return f"{path}: a loose test module at tests/; move it to the folder of its subject's package"
    return None


def test_every_test_module_follows_the_convention():
    bad = [why for p in sorted(TESTS.rglob("*.py")) if (why := misnamed(p, p.read_text(encoding="utf-8")))]
    assert bad == [], "\n".join(bad)


def test_the_check_can_fail():
    assert misnamed(TESTS / "http" / "test_zarr_http.py", "def test_x():\n    pass\n")
    assert misnamed(TESTS / "stream_reduce_test.py", "def test_x():\n    pass\n")
    assert misnamed(TESTS / "core" / "plan_test.py", "def test_x():\n    pass\n") is None
    assert misnamed(TESTS / "flight" / "conftest.py", "def client_for():\n    pass\n") is None
