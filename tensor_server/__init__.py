"""tensor-server: serve bio-imaging files as N-D tensors over Arrow Flight, at any zoom.

``tensor_server.open(path)`` opens any supported file or folder as a SourceAdapter. This
module stays light: it imports no numba, no pyarrow.flight and no format library.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["open", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import SourceAdapter


def open(path: str | os.PathLike[str], format: str | None = None) -> SourceAdapter:  # noqa: A001
    """Open ``path`` with the adapter that recognises it (content first, then extension).

    Raises ``tensor_server.errors.UnreadableSource`` (naming the path and the cause) when no
    adapter recognises it or the file is damaged.
    """
    from tensor_server.adapters.registry import open_source

    return open_source(path, format=format)
