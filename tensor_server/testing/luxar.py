"""Luxar's own encoder and decoder, for tests and the ``encoded`` benchmark (the peer).

luxar (PyPI) declares Python >= 3.12 and a large dependency tree, and its package
``__init__`` imports the whole scene compiler. Its ``encoding`` subpackage needs only NumPy,
zarr, numcodecs, xxhash (and arbol/hilbertcurve at import), so ``make setup`` installs it with
``--no-deps --ignore-requires-python`` and this module imports ``luxar.encoding`` with the
top-level package pre-registered as an empty namespace (its ``__init__`` never runs).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

__all__ = ["luxar_encoding"]


def luxar_encoding() -> Any | None:
    """A namespace with ``ArrayEncoder``, ``ArrayDecoder``, ``SemanticType``,
    ``EncodingMode`` and ``open_group`` (luxar's zarr facade), or None when luxar is absent."""
    if "luxar" not in sys.modules:
        spec = importlib.util.find_spec("luxar")
        if spec is None or not spec.submodule_search_locations:
            return None
        pkg = types.ModuleType("luxar")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["luxar"] = pkg
    from luxar._zarr_compat import open_group
    from luxar.encoding.decoder import ArrayDecoder
    from luxar.encoding.encoder import ArrayEncoder
    from luxar.encoding.modes import EncodingMode
    from luxar.encoding.semantic_types import SemanticType

    return types.SimpleNamespace(
        ArrayEncoder=ArrayEncoder,
        ArrayDecoder=ArrayDecoder,
        SemanticType=SemanticType,
        EncodingMode=EncodingMode,
        open_group=open_group,
    )
