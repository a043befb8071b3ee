"""Test support shipped with the package (like ``zarr.testing``).

``AdapterTests`` is the conformance suite every adapter's tests subclass; ``DoorTests`` the
one every door's tests subclass (the same rules asserted through Flight, HTTP and the
in-process API); ``serving`` runs a runtime and its doors in-process for tests, benchmarks
and asv. They need pytest, which is imported only here, not by ``import tensor_server``.
"""

from __future__ import annotations

from tensor_server.testing.adapter_tests import AdapterTests
from tensor_server.testing.deadline import finishes_within
from tensor_server.testing.servers import Served, serving, start_serving

__all__ = ["AdapterTests", "Served", "finishes_within", "serving", "start_serving"]
