"""``finishes_within``: run a call in a thread so that a hang fails the test instead of
stalling the whole run (bad-input tests must prove that nothing hangs)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["finishes_within"]


def finishes_within(fn: Callable[[], Any], seconds: float = 20.0) -> Any:
    """``fn()``'s result; its exception is re-raised here; AssertionError if it runs longer than
    ``seconds`` (the daemon thread is abandoned, the test run goes on)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not finish within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")
