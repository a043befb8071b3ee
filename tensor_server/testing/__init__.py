"""Test support shipped with the package (like ``zarr.testing``).

``AdapterTests`` is the conformance suite every adapter's tests subclass. It needs pytest,
which is imported only here, not by ``import tensor_server``.
"""
from __future__ import annotations

from tensor_server.testing.adapter_tests import AdapterTests
from tensor_server.testing.deadline import finishes_within

__all__ = ["AdapterTests", "finishes_within"]
