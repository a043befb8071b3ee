"""Uploads: tensors added to a source by ``add_tensor`` and written chunk by chunk, in two
store formats (``zarr://`` and ``cache://``), with the scratch source for results that belong
to no source. A floor above the cache and the catalog, below flight."""

from tensor_server.uploads.manager import (
    DEFAULT_SCRATCH_TTL,
    DEFAULT_UPLOAD_TTL,
    UploadManager,
    WriteDirHeld,
)
from tensor_server.uploads.names import parse_upload_id
from tensor_server.uploads.scratch import SCRATCH_SOURCE_ID
from tensor_server.uploads.upload import Upload, UploadClosed, UploadNotReadable

__all__ = [
    "UploadManager",
    "WriteDirHeld",
    "Upload",
    "UploadClosed",
    "UploadNotReadable",
    "DEFAULT_UPLOAD_TTL",
    "DEFAULT_SCRATCH_TTL",
    "SCRATCH_SOURCE_ID",
    "parse_upload_id",
]
