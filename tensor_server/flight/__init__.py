"""Arrow Flight server speaking the biopb tensor protocol (wire-protocol.md).

The top floor: nothing else in the package imports it. ``pyarrow.flight`` is imported here,
so importing ``tensor_server`` alone never loads it.
"""

from __future__ import annotations

from tensor_server.flight.server import TensorFlightServer

__all__ = ["TensorFlightServer"]
