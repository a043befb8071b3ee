"""The serving runtime: the transport-free floor every door (Flight, HTTP, ...) calls.

``ServingRuntime`` (``runtime.py``) owns lookup with every read rule, every verb, and the
action registry (``actions.py``); ``Caller`` (``caller.py``) is what a door knows of who
asks. Errors are the classes of ``tensor_server.errors``; each door maps them to its own
statuses and decides nothing else (``docs/service.md``).
"""

from __future__ import annotations

from tensor_server.service.caller import IN_PROCESS, Caller
from tensor_server.service.runtime import Described, ServingRuntime

__all__ = ["ServingRuntime", "Caller", "Described", "IN_PROCESS"]
