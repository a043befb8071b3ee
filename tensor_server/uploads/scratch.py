"""The scratch source: the fixed id ``scratch`` every server with a write_dir serves.

A result that belongs to no source of the user's goes here. It holds no bytes and no tensors
of its own (everything on it is an uploaded field under ``<write_dir>/fields/scratch/``,
attached like any other), keeps no directory, has no metadata (so a tensor on it that needs a
physical scale belongs on the source that has one), and is never reclaimed: empty is its
resting state. Its fixed id is the point: a producer writes ``zarr://scratch/@fields/<name>``
with nothing to mint first.
"""

from __future__ import annotations

import json
from pathlib import Path

from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.identity import NO_DEFAULT_TENSOR
from tensor_server.errors import TensorNotFound

__all__ = ["SCRATCH_SOURCE_ID", "ScratchSource"]

SCRATCH_SOURCE_ID = "scratch"


class ScratchSource(SourceAdapter):
    format_name = "scratch"

    def __init__(self) -> None:  # a source with no tensors of its own
        # SourceAdapter requires a tensor; the scratch source by definition has none, so it
        # sets the attributes the catalog reads instead of calling the base constructor.
        self.path = None
        self.source_id = SCRATCH_SOURCE_ID
        self.type = self.format_name
        self.metadata = {}
        self.tensors: dict[str, TensorAdapter] = {}
        self.member_paths: set[Path] = set()
        #: content this adapter does not serve: every member carries its own token
        self.content_version = None

    @property
    def url(self) -> str:
        return f"scratch://{SCRATCH_SOURCE_ID}"

    def tensor(self, field: str | None = None) -> TensorAdapter:
        raise TensorNotFound(
            f"the scratch source holds no tensor of its own; its tensors are '{SCRATCH_SOURCE_ID}/@fields/<name>'",
            slug=NO_DEFAULT_TENSOR,
        )

    def metadata_json(self, field: str | None = None) -> str:
        return json.dumps({"type": self.type, "dim_label": [], "metadata": {}})
