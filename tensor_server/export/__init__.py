"""Export any tensor to a pyramidal, sharded OME-Zarr (NGFF 0.5, or 0.4) in one streamed pass.

Entry points: ``export_tensor(tensor, dest, options, progress=, cancelled=)`` (export/run.py),
``ExportOptions`` (export/options.py), and ``add_arguments``/``run`` for the CLI's ``export``
command (export/command.py). Imports only ``core``, ``adapters`` and third-party packages, so any
door (the CLI, a service action) can call it. docs/export.md describes the output.
"""

from __future__ import annotations

from tensor_server.export.options import ExportOptions
from tensor_server.export.run import export_tensor

__all__ = ["ExportOptions", "export_tensor"]
