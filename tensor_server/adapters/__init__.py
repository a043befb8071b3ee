"""Format adapters. Importing this package registers every builtin format.

Each module here registers itself (``registry.register_format``) and imports its format
library only when a file is opened, so importing all of them is cheap. A new format is a new
module in this folder; nothing else needs editing.
"""

from __future__ import annotations

import importlib
import pkgutil

_NOT_FORMATS = frozenset({"registry"})

for _mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _mod.name not in _NOT_FORMATS and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")
