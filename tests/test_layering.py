"""Imports flow one way: kernels ← core ← adapters; cache and catalog above them; uploads
above cache; flight (and the http front end, when present) on top.

Read from the source with ``ast`` (every import, including the ones inside functions and
under TYPE_CHECKING), so an edge against the layering fails here before it becomes a cycle
or a cache that reaches into an adapter. ``test_the_check_can_fail`` feeds the checker a
forbidden edge so this test cannot pass vacuously.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tensor_server"
KERNELS = ROOT / "kernels" / "tensor_server_kernels"

#: floor -> the tensor_server floors it may never import
FORBIDDEN = {
    "core": {"adapters", "cache", "catalog", "uploads", "flight", "http", "bench", "testing", "cli", "demo", "config"},
    "adapters": {"cache", "catalog", "uploads", "flight", "http", "bench", "testing", "cli", "demo", "config"},
    "cache": {"adapters", "catalog", "uploads", "flight", "http", "bench", "testing", "cli", "demo"},
    "catalog": {"uploads", "flight", "http", "bench", "testing", "cli", "demo"},
    "uploads": {"flight", "http", "bench", "testing", "cli", "demo"},
    "flight": {"bench", "testing", "cli", "demo"},
    # the exporter reads through core and adapters only; the doors (cli, flight) call it
    "export": {"cache", "catalog", "uploads", "service", "flight", "http", "bench", "testing", "cli", "demo", "config"},
}


def _parse(source: str) -> ast.AST:
    """``ast.parse`` on a fresh thread. CPython 3.11.7's AST validator compares the thread's
    C recursion depth before and after, and a RecursionError caught earlier in the same
    thread (the hostile-input tests parse 100k-deep JSON) can leave that count skewed:
    "SystemError: AST constructor recursion depth mismatch". A new thread starts at zero."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(ast.parse, source).result()


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import statement in ``source``."""
    out = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "tensor_server"]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"line {node.lineno}: relative import; this package spells imports absolutely")
    return out


def violations(floor: str, source: str, where: str) -> list[str]:
    bad = []
    for line, module in imported_modules(source):
        parts = module.split(".")
        if parts[0] == "tensor_server" and len(parts) > 1 and parts[1] in FORBIDDEN.get(floor, ()):
            bad.append(f"{where}:{line} ({floor}) imports {module}")
    return bad


def test_package_imports_follow_the_layering() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        floor = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        bad += violations(floor, path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert bad == [], "imports against the layering:\n" + "\n".join(bad)


def test_kernels_import_nothing_of_the_server() -> None:
    bad = []
    for path in sorted(KERNELS.rglob("*.py")):
        for line, module in imported_modules(path.read_text(encoding="utf-8")):
            if module.split(".")[0] == "tensor_server":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(
    "floor, source",
    [
        ("core", "from tensor_server.cache import CacheManager\n"),
        ("core", "def f():\n    import tensor_server.adapters.zarr\n"),
        ("adapters", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tensor_server.catalog import Catalog\n"),
        ("cache", "from tensor_server.adapters.memory import ArrayAdapter\n"),
        ("catalog", "from tensor_server import flight\n"),
    ],
)
def test_the_check_can_fail(floor: str, source: str) -> None:
    assert violations(floor, source, "probe.py"), f"{floor} importing upwards was not caught"


def test_allowed_edges_pass() -> None:
    assert violations("adapters", "from tensor_server.core.bounds import Bounds\n", "probe.py") == []
    assert violations("flight", "from tensor_server.cache import CacheManager\n", "probe.py") == []
