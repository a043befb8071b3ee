"""Boot: what a previous life of the server left in the write dir becomes upload records.

The server holds the write dir's lock before this runs (``manager.py``), so no member is
another live server's: a PENDING one is a crash's leftover (its uploader sends it again) and
is removed, as is a READY one whose deadline passed while the server was down; a READY one is
adopted and attached to its source. A member that cannot be adopted (``integrity.py``) is kept
on the disk and served as a DISCARDED tombstone with the reason, after one warning.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from tensor_server.core.identity import ArrayId
from tensor_server.uploads.cache_member import CacheMember
from tensor_server.uploads.integrity import DamagedMember, StoreDamaged
from tensor_server.uploads.layout import layout_array_id, member_dirs
from tensor_server.uploads.marker import DISCARDED, READY, Marker
from tensor_server.uploads.upload import Upload, forget_rows
from tensor_server.uploads.zarr_member import ZarrMember

__all__ = ["adopt_write_dir"]

log = logging.getLogger(__name__)


def adopt_write_dir(write_dir: Path, catalog: Any, now: float) -> tuple[dict[str, Upload], dict[str, int]]:
    """The records of every member folder under ``write_dir`` (array_id -> Upload: READY ones
    attached to the catalog, damaged ones as tombstones) and the boot summary's counts of
    adopted, removed and damaged members."""
    uploads: dict[str, Upload] = {}
    counts = {"adopted": 0, "removed": 0, "damaged": 0}
    for d in member_dirs(write_dir):
        kind = next((k for k in (ZarrMember, CacheMember) if k.read_marker(d) is not None), None)
        marker = None if kind is None else kind.read_marker(d)
        if marker is not None and (
            marker.state != READY or (marker.expires_at is not None and now >= marker.expires_at)
        ):
            log.info("boot: removing %s upload %s (%s)", marker.state, marker.array_id, d)
            shutil.rmtree(d, ignore_errors=True)
            forget_rows(catalog, marker.array_id)
            counts["removed"] += 1
            continue
        try:
            if kind is None or marker is None:
                present = [n for n in (".zattrs", "descriptor.json") if (d / n).is_file()]
                raise StoreDamaged(
                    f"{' and '.join(present)} holds no readable upload marker"
                    if present
                    else "no upload marker (.zattrs or descriptor.json)"
                )
            up = _adopted(kind.open(d), catalog, now)
            uploads[up.array_id] = up
            counts["adopted"] += 1
        except Exception as exc:  # a damaged store raises whatever its library raises
            up = _tombstone(d, write_dir, marker, " ".join(str(exc).split())[:300] or type(exc).__name__, now)
            uploads[up.array_id] = up
            counts["damaged"] += 1
    return uploads, counts


def _adopted(member: Any, catalog: Any, now: float) -> Upload:
    """A READY member's record, its tensor attached (listed) to its source."""
    m = member.marker
    source_id, fld = ArrayId.parse(m.array_id)
    up = Upload(
        m.array_id,
        source_id,
        fld,
        member,
        member.reader(),
        READY,
        m.expires_at,
        now,
        adopted=True,
        reason="adopted at boot (no progress record: uploaded_chunks is not known)",
        owner=m.owner,
        grant=m.grant,
    )
    catalog.attach(source_id, fld, up.tensor, listed=True)
    return up


def _tombstone(d: Path, write_dir: Path, marker: Marker | None, why: str, now: float) -> Upload:
    """A damaged member's DISCARDED record: its name stays taken and its files stay put."""
    array_id = marker.array_id if marker is not None else layout_array_id(d, write_dir / "fields")
    reason = f"the upload store {d} is damaged ({why}); its files are kept: remove the folder to free the name"
    log.warning("boot: upload %s is DISCARDED: %s", array_id, reason)
    source_id, fld = ArrayId.parse(array_id)
    member = DamagedMember(d, array_id, marker, why)
    return Upload(
        array_id,
        source_id,
        fld,
        member,
        member.reader(),
        DISCARDED,
        None,
        now,
        adopted=True,
        reason=reason,
        discarded_at=now,
        owner=marker.owner if marker is not None else "",
        grant=marker.grant if marker is not None else "",
    )
