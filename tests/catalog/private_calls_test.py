"""The catalog's modules use one another through public names only: no module reaches for an
underscore-private attribute or method of an object it does not own (``self.catalog._count``),
nor imports another module's private name (``from ...catalog import _under``). What a module
needs of another part becomes a public method of the part that owns it, with a docstring
saying who calls it and why. Checked over the source with ``ast``; ``test_the_check_can_fail``
feeds the checker the calls the catalog made before its split, so this cannot pass vacuously.
The modules also stay under the house limit of 800 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layering_test import parse_source

CATALOG = Path(__file__).resolve().parents[2] / "tensor_server" / "catalog"
#: the house limit on a module's length (CONTRIBUTING.md)
MAX_LINES = 800


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(source: str, where: str) -> list[str]:
    """``where:line what`` for every private attribute ``source`` reads of an object other than
    ``self`` or ``cls``, and every private name it imports from a tensor_server module."""
    bad = []
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                bad.append(f"{where}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tensor_server"):
            bad += [f"{where}:{node.lineno} imports {node.module}.{a.name}" for a in node.names if _is_private(a.name)]
    return bad


def test_no_catalog_module_reaches_into_another_objects_privates() -> None:
    bad = []
    for path in sorted(CATALOG.glob("*.py")):
        bad += private_reaches(path.read_text(encoding="utf-8"), f"catalog/{path.name}")
    assert bad == [], "private names used across objects (make them public on their owner):\n" + "\n".join(bad)


def test_every_catalog_module_stays_under_the_line_limit() -> None:
    lengths = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(CATALOG.glob("*.py"))}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert lengths["catalog.py"] < 600  # the records and lookups only: scanning, persistence, SQL moved out


@pytest.mark.parametrize(
    "source",
    [
        "class Opening:\n    def offer(self, claim):\n        return self.catalog._prepare_claim(claim, self.covered)\n",
        "def took(opening):\n    opening.catalog._count('files_seen', -1)\n",
        "pool.submit(self.catalog._open_claim, claim, sid, sig)\n",
        "from tensor_server.catalog.catalog import Catalog, _stat_signature, _under\n",
    ],
)
def test_the_check_can_fail(source: str) -> None:
    assert private_reaches(source, "probe.py"), f"a private reach was not caught: {source!r}"


def test_own_privates_and_dunders_pass() -> None:
    source = (
        "class Catalog:\n"
        "    def close(self):\n"
        "        self._records.clear()\n"
        "        return type(self).__name__, cls._numbers\n"
        "from tensor_server.catalog.record import stat_signature\n"
        "from biopb.tensor._roi_rows import rois_to_table\n"
    )
    assert private_reaches(source, "probe.py") == []
