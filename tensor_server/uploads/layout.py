"""Where a member lives in the write dir, both ways: the folder an upload id gets
(``member_dir``), every member folder boot finds (``member_dirs``), and the id a folder stands
for by its place alone (``layout_array_id``), for a member whose marker cannot be read.

A field is ``fields/<source_id>/<name>``; a label set is
``fields/<source_id>/@labels/<image>/<name>``, its image field quoted into one component
(``@default`` for the image of a single-tensor source).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote

from tensor_server.uploads.names import FIELDS, LABELS

__all__ = ["layout_array_id", "member_dir", "member_dirs"]


def member_dir(write_dir: Path, source_id: str, target_field: str) -> Path:
    """The folder of the upload ``<source_id>/<target_field>`` under ``write_dir``."""
    base = write_dir / "fields" / source_id
    image, marker, name = target_field.rpartition(f"{LABELS}/")
    if not marker:
        return base / target_field.split("/", 1)[1]
    return base / LABELS / quote(image.rstrip("/") or "@default", safe="") / name


def member_dirs(write_dir: Path) -> list[Path]:
    """Every folder under ``write_dir`` where a member lives (``member_dir``'s two shapes),
    marker or not, in sorted order."""
    fields = write_dir / "fields"
    out = []
    for source in sorted(p for p in fields.iterdir() if p.is_dir()):
        for d in sorted(p for p in source.iterdir() if p.is_dir()):
            if d.name != LABELS:
                out.append(d)
                continue
            for image in sorted(p for p in d.iterdir() if p.is_dir()):
                out += sorted(p for p in image.iterdir() if p.is_dir())
    return out


def layout_array_id(path: Path, fields_dir: Path) -> str:
    """The id a member directory stands for by its place under ``fields/`` (the inverse of
    ``member_dir``), for a member whose marker cannot be read."""
    parts = path.relative_to(fields_dir).parts
    if len(parts) == 4 and parts[1] == LABELS:
        source_id, _, image, name = parts
        image = unquote(image)
        return f"{source_id}/{LABELS}/{name}" if image == "@default" else f"{source_id}/{image}/{LABELS}/{name}"
    return f"{parts[0]}/{FIELDS}/{parts[-1]}"
