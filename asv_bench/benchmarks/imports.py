"""Import time of the package (must stay light: no numba, Flight or format libraries)."""

from __future__ import annotations


def timeraw_import_tensor_server():
    return "import tensor_server"


def timeraw_import_tensor_server_core():
    return "import tensor_server.core"
