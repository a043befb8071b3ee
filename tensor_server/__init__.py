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


def open(  # noqa: A001
    path: str | os.PathLike[str], format: str | None = None, *, montage_gap: float | None = None
) -> SourceAdapter:
    """Open ``path`` with the adapter that recognises it (content first, then extension).
    ``montage_gap``: the gap between a plate's wells or a file's positions in their montage,
    a fraction of a cell (None: the server's default, 1/16).

    Raises ``tensor_server.errors.UnreadableSource`` (naming the path and the cause) when no
    adapter recognises it or the file is damaged.
    """
    from tensor_server.adapters.registry import open_source

    if montage_gap is None:
        return open_source(path, format=format)
    return open_source(path, format=format, montage_gap=montage_gap)
