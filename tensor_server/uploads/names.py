"""What ``add_tensor`` may be asked to create: the id grammar and the name rules.

An uploaded tensor's id always carries a marked segment (``@fields`` or ``@labels``), so it
can never shadow a tensor a format minted (``<source_id>/0`` is a native id, while
``<source_id>/@fields/0`` cannot be one). A name is also a directory the server creates and,
on discard, deletes whole, on any platform that may later serve the same write_dir, so the
rules refuse what any of Linux, Windows or macOS would refuse, and collisions are judged on
the case-folded NFC form (NTFS/APFS/HFS+ are case-insensitive; HFS+ stores NFD).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from tensor_server.core.identity import LABEL_SETS, ArrayId
from tensor_server.errors import InvalidArgument

__all__ = ["FIELDS", "LABELS", "STORE_FORMATS", "UploadTarget", "parse_upload_id", "name_problem", "fold_name"]

FIELDS = "@fields"
LABELS = LABEL_SETS
#: add_tensor scheme -> store format; the scheme names the format and nothing else.
STORE_FORMATS = ("zarr", "cache")

_MAX_NAME_BYTES = 255
_DEVICE_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL"] + [f"COM{d}" for d in range(1, 10)] + [f"LPT{d}" for d in range(1, 10)]
)
_NTFS_FORBIDDEN = '<>"|?*'
_GRAMMAR = (
    f"'<zarr|cache>://<source_id>/{FIELDS}/<name>' (a tensor of a source) or "
    f"'zarr://<array_id>/{LABELS}/<name>' (a label set of a tensor)"
)


class UploadNameError(InvalidArgument):
    """An add_tensor id that names nothing the upload path may create."""


@dataclass(frozen=True)
class UploadTarget:
    """A parsed add_tensor id. ``field`` is the id after ``source_id/`` (``@fields/x`` or
    ``<image field>/@labels/x``); ``image_id`` is set for a label set."""

    store_format: str
    source_id: str
    field: str
    name: str
    image_id: str | None = None

    @property
    def array_id(self) -> str:
        return f"{self.source_id}/{self.field}"

    @property
    def is_label_set(self) -> bool:
        return self.image_id is not None


def fold_name(name: str) -> str:
    """The form two names are compared in: NFC, case-folded (stored as written)."""
    return unicodedata.normalize("NFC", name).casefold()


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an uploaded field or label set name, or None if it can."""
    if not name:
        return "is empty"
    if len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        return f"is longer than {_MAX_NAME_BYTES} UTF-8 bytes"
    if name.startswith("@"):
        return f"opens with '@', the server's marker namespace ({FIELDS}, {LABELS}, @ome)"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if ":" in name:
        return "contains ':', which names a drive or a stream on Windows"
    if name.startswith("."):
        return "starts with '.', which hides it (and zarr's own metadata is .zattrs etc.)"
    if name[-1] in " .":
        return "ends with a space or '.', which Windows strips silently"
    if any(ch in _NTFS_FORBIDDEN for ch in name):
        return f"contains one of {_NTFS_FORBIDDEN}, forbidden on NTFS"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "contains a control character"
    stem = name.split(".")[0].upper()
    if stem in _DEVICE_NAMES:
        return f"is {stem}, a Windows device name (reserved with any extension)"
    return None


def parse_upload_id(request_id: str) -> UploadTarget:
    """Parse ``<scheme>://...`` into an UploadTarget; refuse anything else with the reason."""
    scheme, sep, rest = request_id.partition("://")
    if not sep:
        raise UploadNameError(f"{request_id!r} names no store format; use {_GRAMMAR}")
    if scheme not in STORE_FORMATS:
        raise UploadNameError(f"{request_id!r}: unknown store format {scheme + '://'!r}; use {_GRAMMAR}")
    # right to left, so a set literally named 'labels' (.../@labels/labels) stays legal
    head, marker, name = rest.rpartition(f"/{LABELS}/")
    if marker:
        if scheme != "zarr":
            raise UploadNameError(f"{request_id!r}: a label set is an OME-Zarr label image; use 'zarr://'")
        _check_name(name, request_id)
        source_id, image_field = ArrayId.parse(head)
        if not source_id:
            raise UploadNameError(f"{request_id!r} names no image; use {_GRAMMAR}")
        field = f"{image_field}/{LABELS}/{name}" if image_field else f"{LABELS}/{name}"
        return UploadTarget(scheme, source_id, field, name, image_id=head)
    source_id, field = ArrayId.parse(rest)
    seg, slash, name = field.partition("/")
    if not source_id or seg != FIELDS or not slash:
        raise UploadNameError(
            f"{request_id!r} is not an uploadable id: an uploaded tensor is addressed under a "
            f"marked segment (a bare '<source_id>/<field>' is a native tensor id); use {_GRAMMAR}"
        )
    _check_name(name, request_id)
    return UploadTarget(scheme, source_id, f"{FIELDS}/{name}", name)


def _check_name(name: str, request_id: str) -> None:
    why = name_problem(name)
    if why is not None:
        raise UploadNameError(f"{request_id!r}: the name {name!r} {why}")
