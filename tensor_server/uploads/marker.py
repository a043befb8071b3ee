"""The upload marker: what a member directory says about itself.

Every member (both store formats) carries one JSON block under ``MARKER_KEY``: its id, store
format, state, content version and deadline. It is the only state that survives a restart,
so it holds what boot adoption needs: a PENDING member is a crash's leftover (removed), a
READY one is adopted, and one whose absolute wall-clock ``expires_at`` passed while the
server was down is swept. Written atomically (temp file + rename) so a crash leaves the old
or the new document, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tensor_server.adapters.zarr import UPLOAD_MEMBER_KEY as MARKER_KEY

__all__ = ["MARKER_KEY", "Marker", "write_json_atomic", "read_json", "sync_path"]

PENDING, READY, DISCARDED = "PENDING", "READY", "DISCARDED"


@dataclass(frozen=True)
class Marker:
    array_id: str
    store_format: str
    state: str
    content_version: str  # hex
    created_at: float
    expires_at: float | None
    dim_labels: tuple[str, ...] = ()
    is_labels: bool = False
    #: SHA-256 (hex) of the token the upload was created with: its holder writes, publishes
    #: and discards it; "" = the server's (the control surface)
    owner: str = ""
    #: SHA-256 (hex) of the read grant the upload was given on purpose (a private upload):
    #: only its holder (or the server token) reads it; "" = read as the catalog is
    grant: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["dim_labels"] = list(self.dim_labels)
        return d

    @classmethod
    def from_json(cls, d: Any) -> Marker | None:
        if not isinstance(d, dict):
            return None
        try:
            return cls(
                str(d["array_id"]),
                str(d["store_format"]),
                str(d["state"]),
                str(d["content_version"]),
                float(d["created_at"]),
                None if d.get("expires_at") is None else float(d["expires_at"]),
                tuple(str(x) for x in d.get("dim_labels") or ()),
                bool(d.get("is_labels", False)),
                str(d.get("owner") or ""),
                _grant(d),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def with_state(self, state: str) -> Marker:
        return replace(self, state=state)


def _grant(d: dict[str, Any]) -> str:
    """A marker written before owners and grants were told apart (no ``grant`` key) made its
    owner the read grant: it stays private, as it was created."""
    return str((d["grant"] if "grant" in d else d.get("owner")) or "")


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    sync_path(path.parent)  # the rename itself


def sync_path(path: Path) -> None:
    """fsync a file or directory by path (Linux flushes whatever any fd wrote to it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
