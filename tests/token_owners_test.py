"""Tokens are compared in one place and read in one place, checked over the package's source
(in the style of ``layering_test.py``): ``hmac.compare_digest`` only in ``service/access.py``
(which also reads ``Authorization: Bearer`` for every door), and the HTTP forms (``/t/<token>/``,
``?token=``, the cookie) only in ``http/credentials.py``. ``test_the_check_can_fail`` feeds the
checker a forbidden line so this test cannot pass vacuously."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tensor_server"

#: pattern -> the one module (relative to the package) allowed to hold it
OWNERS = {
    r"compare_digest": "service/access.py",
    # the scheme with its space, as a parser slices it off (``WWW-Authenticate: Bearer`` has none)
    r"[\"'](?i:bearer) [\"']": "service/access.py",
    r"SimpleCookie": "http/credentials.py",
    r"[\"']/t/[\"']": "http/credentials.py",
}


def misplaced(rel: str, source: str) -> list[str]:
    """``rel:line pattern`` for every owned pattern ``source`` holds outside its owner."""
    bad = []
    for pattern, owner in OWNERS.items():
        if rel == owner:
            continue
        for m in re.finditer(pattern, source):
            bad.append(f"{rel}:{source.count(chr(10), 0, m.start()) + 1} {pattern} (only in {owner})")
    return bad


def test_tokens_are_compared_and_read_in_one_place_each() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        bad += misplaced(path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8"))
    assert bad == [], "token handling outside its owner:\n" + "\n".join(bad)


def test_the_owners_hold_what_they_own() -> None:
    for pattern, owner in OWNERS.items():
        assert re.search(pattern, (PACKAGE / owner).read_text(encoding="utf-8")), (pattern, owner)


@pytest.mark.parametrize(
    "rel, source",
    [
        ("http/security.py", "import hmac\nok = hmac.compare_digest(a, b)\n"),
        ("http/metrics_door.py", "token = h[len('Bearer ') :] if h.startswith('Bearer ') else None\n"),
        ("flight/auth.py", 'if v.startswith("Bearer "):\n'),
        ("http/security.py", "from http.cookies import SimpleCookie\n"),
        ("http/app.py", "PREFIX = '/t/'\n"),
    ],
)
def test_the_check_can_fail(rel: str, source: str) -> None:
    assert misplaced(rel, source), f"{source!r} in {rel} was not caught"
