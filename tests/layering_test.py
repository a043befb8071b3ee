"""Imports flow one way: kernels ← core ← adapters; cache and catalog above them; uploads
above cache; the service floor (the serving runtime) above those; the doors (flight, http,
cli) on top, never importing each other.

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

#: floor -> the tensor_server floors it may never import. The doors (flight, http, cli) sit
#: on the service floor and never import each other; testing (the conformance suites and
#: in-process servers) and bench sit above everything. ``cli_banner``, ``cli_logging`` and ``cli_parser`` (what
#: the command line prints at start, its log and progress lines, its parser) are part of the cli door.
_CLI = {"cli", "cli_banner", "cli_inspect", "cli_logging", "cli_parser", "cli_share", "cli_workers"}
_ABOVE_SERVICE = {"flight", "http", "bench", "testing", "demo"} | _CLI
FORBIDDEN = {
    "config": {"adapters", "cache", "catalog", "uploads", "service", "render", "export"} | _ABOVE_SERVICE,
    "core": {"adapters", "cache", "catalog", "uploads", "service", "render", "export", "config"} | _ABOVE_SERVICE,
    "adapters": {"cache", "catalog", "uploads", "service", "render", "export", "config"} | _ABOVE_SERVICE,
    # rendering to 8-bit images: transport-free, over core only (the viewer doors call it)
    "render": {"adapters", "cache", "catalog", "uploads", "service", "export", "config"} | _ABOVE_SERVICE,
    "cache": {"adapters", "catalog", "uploads", "service", "render", "export"} | _ABOVE_SERVICE,
    "catalog": {"uploads", "service", "render", "export"} | _ABOVE_SERVICE,
    "uploads": {"service", "render", "export"} | _ABOVE_SERVICE,
    # the exporter reads through core and adapters only; the doors (cli, flight) call it
    "export": {"cache", "catalog", "uploads", "service", "render", "config"} | _ABOVE_SERVICE,
    # deployment configuration (nginx.conf): text for the load balancer, nothing of the server
    "deploy": {"core", "adapters", "cache", "catalog", "uploads", "service", "render", "export", "config"}
    | _ABOVE_SERVICE,
    "service": _ABOVE_SERVICE,
    "flight": {"http", "bench", "testing", "demo"} | _CLI,
    "http": {"flight", "bench", "testing", "demo"} | _CLI,
    "testing": {"bench", "demo"} | _CLI,
    # the cli's parts import nothing of the server: the cli gathers what they print
    "cli_banner": _ABOVE_SERVICE - {"cli_banner"},
    "cli_logging": _ABOVE_SERVICE - {"cli_logging"},
    "cli_parser": _ABOVE_SERVICE - {"cli_parser"},
}


def parse_source(source: str) -> ast.AST:
    """``ast.parse`` on a fresh thread, or, failing that, in a fresh interpreter. CPython
    3.11.7's AST validator compares the thread's C recursion depth before and after, and a
    RecursionError caught earlier in the process (the hostile-input tests parse 100k-deep
    JSON) can leave that count skewed: "SystemError: AST constructor recursion depth
    mismatch". A new thread usually starts clean; a new process always does."""
    import concurrent.futures
    import pickle
    import subprocess
    import sys

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(ast.parse, source).result()
        except SystemError:
            pass
    code = "import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps(ast.parse(sys.stdin.read())))"
    done = subprocess.run([sys.executable, "-c", code], input=source.encode(), capture_output=True, check=True)
    return pickle.loads(done.stdout)


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import statement in ``source``."""
    out = []
    for node in ast.walk(parse_source(source)):
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
        (
            "adapters",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tensor_server.catalog import Catalog\n",
        ),
        ("cache", "from tensor_server.adapters.memory import ArrayAdapter\n"),
        ("catalog", "from tensor_server import flight\n"),
        ("uploads", "from tensor_server.service import ServingRuntime\n"),
        ("service", "from tensor_server.flight.errors import flight_error\n"),
        ("service", "def f():\n    from tensor_server.http.app import build_app\n"),
        ("flight", "from tensor_server.http.paths import resolve_zarr_path\n"),
        ("http", "from tensor_server.flight import TensorFlightServer\n"),
        ("http", "import tensor_server.cli\n"),
        ("deploy", "from tensor_server.service import ServingRuntime\n"),
    ],
)
def test_the_check_can_fail(floor: str, source: str) -> None:
    assert violations(floor, source, "probe.py"), f"{floor} importing upwards was not caught"


def test_allowed_edges_pass() -> None:
    assert violations("adapters", "from tensor_server.core.bounds import Bounds\n", "probe.py") == []
    assert violations("flight", "from tensor_server.cache import CacheManager\n", "probe.py") == []
    assert violations("flight", "from tensor_server.service import ServingRuntime\n", "probe.py") == []
    assert violations("http", "from tensor_server.service import Caller\n", "probe.py") == []
    assert violations("testing", "from tensor_server.flight import TensorFlightServer\n", "probe.py") == []
