"""Zarr stores (v2 and v3, sharded or not) and OME-Zarr (NGFF 0.1-0.5) served as tensors.

One walker (``_zarr_store.py``: what becomes a tensor) serves both formats, registered twice:
``ome-zarr`` (priority 10) claims folders whose root group carries NGFF metadata
(``multiscales``, ``plate``, ``well`` or ``bioformats2raw.layout``; under the ``ome`` key of
``zarr.json`` attributes from 0.5 on) and ``zarr`` (priority 20) claims any other zarr folder.
A source holds OME-Zarr images with their stored levels and label images, the images of a
bioformats2raw layout or of an HCS plate (and the plate as one image) or well, or the arrays of a plain group; each array
is a ``ZarrAdapter`` (``_zarr_array.py``), importable from here for the upload subsystem's
zarr members.
"""

from __future__ import annotations

from pathlib import Path

from tensor_server.adapters._zarr_array import ZarrAdapter
from tensor_server.adapters._zarr_chunks import decoder_name
from tensor_server.adapters._zarr_store import OME_KEYS, StoreWalker, is_zarr_folder, read_node, root_is_ome
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.core.adapter_base import SourceAdapter
from tensor_server.errors import UnreadableSource

__all__ = ["UPLOAD_MEMBER_KEY", "ZarrAdapter", "ZarrSource", "decoder_name"]

#: The attribute block the upload subsystem writes on its zarr:// members (uploads/marker.py
#: takes the key from here). Both zarr claims decline a group carrying it: what lies under a
#: write_dir is registered by the upload subsystem, never discovered, even when a write_dir
#: was misplaced inside a served root.
UPLOAD_MEMBER_KEY = "tensor_server_upload"


def is_upload_member(path: Path) -> bool:
    """The folder is an upload subsystem's zarr:// member (never raises)."""
    try:
        node = read_node(path, "")
        return node is not None and UPLOAD_MEMBER_KEY in node.attributes
    except Exception:
        return False


# ---- the source and its registration -----------------------------------------------------------
class ZarrSource(SourceAdapter):
    """A zarr or OME-Zarr folder (type ``ome-zarr`` when its root carries NGFF metadata)."""

    format_name = "zarr"

    def __init__(self, path: str | Path, *, require_ome: bool = False) -> None:
        root = Path(path)
        walker = StoreWalker(root)
        tensors, metadata, is_ome = walker.build()
        if require_ome and not is_ome:
            raise UnreadableSource(root, f"no OME-Zarr metadata ({', '.join(OME_KEYS)}) in the root group")
        super().__init__(root, tensors, metadata=metadata, source_type="ome-zarr" if is_ome else "zarr")
        self.former_fields = walker.former_fields


register_format(
    FormatEntry(
        name="ome-zarr",
        opener=lambda path: ZarrSource(path, require_ome=True),
        sniff=lambda path, head: path.is_dir() and root_is_ome(path) and not is_upload_member(path),
        extensions=(".ome.zarr",),
        priority=10,
        folders=True,
        files=False,
        description="OME-Zarr (NGFF 0.1-0.5): multiscale images, labels, HCS plates, bioformats2raw",
    )
)
register_format(
    FormatEntry(
        name="zarr",
        opener=ZarrSource,
        sniff=lambda path, head: path.is_dir() and is_zarr_folder(path) and not is_upload_member(path),
        extensions=(".zarr",),
        priority=20,
        folders=True,
        files=False,
        description="Zarr v2/v3 store (sharded v3 included): one tensor per array",
    )
)
