"""Format adapters. Importing this package registers every builtin format.

Each module registers itself (``registry.register_format``) and imports its format library
only when a file is opened, so importing all of them is cheap. Add a format by adding its
module name to ``_BUILTIN``.
"""
from __future__ import annotations

import importlib

_BUILTIN = ("memory",)

for _name in _BUILTIN:
    importlib.import_module(f"{__name__}.{_name}")
