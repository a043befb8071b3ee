from __future__ import annotations

import threading

import pytest

from tensor_server.testing import finishes_within


def test_returns_value_and_reraises():
    assert finishes_within(lambda: 42) == 42
    with pytest.raises(KeyError):
        finishes_within(lambda: {}["missing"])


def test_a_hang_fails_instead_of_stalling():
    release = threading.Event()
    with pytest.raises(AssertionError, match="did not finish within 0.2 s"):
        finishes_within(lambda: release.wait(30), seconds=0.2)
    release.set()
