"""add_tensor of a name an upload already holds: who holds it, and when the answer is that
upload rather than a refusal.

A crashed uploader re-plans by name (docs/wire-protocol.md §8.2): the PENDING upload of
exactly that name, declared again as it was added, by one who may write it, is answered as it
stands (its write plan, its ``uploaded_chunks``). Any other holder (READY, a DISCARDED
tombstone, another spelling of the name) keeps it. Names are compared case-folded, as the
disks a write dir may move to compare them (``names.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from tensor_server.errors import AlreadyExists, PermissionDenied
from tensor_server.uploads.marker import DISCARDED, PENDING
from tensor_server.uploads.names import UploadTarget, fold_name
from tensor_server.uploads.upload import Upload

__all__ = ["holder_of", "replan", "same_owner"]

log = logging.getLogger(__name__)


def holder_of(uploads: Iterable[Upload], target: UploadTarget) -> Upload | None:
    """The upload (any state) of ``uploads`` whose name is the target's, compared case-folded."""
    folded = fold_name(target.field)
    return next((u for u in uploads if u.source_id == target.source_id and fold_name(u.field) == folded), None)


def same_owner(owner: str, request_id: str, up: Upload) -> None:
    """An in-process producer's write check: the owner it names is the upload's."""
    if up.owner != owner:
        raise PermissionDenied(
            f"add_tensor {request_id!r}: {up.array_id} is a PENDING upload of another owner; only "
            "its owner may re-plan it"
        )


def replan(
    holder: Upload,
    target: UploadTarget,
    request_id: str,
    declared: dict[str, Any],
    may_write: Callable[[Upload], None],
    clock: Callable[[], float],
) -> Upload:
    """The answer to add_tensor of ``holder``'s name (the caller holds the manager's lock):
    ``holder`` itself, its idle clock restarted (``clock``), when it is PENDING under exactly
    this name, ``may_write`` lets the caller write it and ``declared`` (store format, shape,
    dtype, chunk shape, dim labels) is what it was added with; ``AlreadyExists`` naming the
    difference otherwise."""
    if holder.state != PENDING or holder.array_id != target.array_id:
        state = "a discarded tensor until the reclaim sweep" if holder.state == DISCARDED else holder.state
        raise AlreadyExists(
            f"add_tensor {request_id!r}: the name is taken: it already exists as "
            f"{holder.array_id!r} ({state}); add the tensor under another name"
        )
    may_write(holder)  # a re-plan is a write: before its declaration is named
    t = holder.tensor
    was = {
        "store format": holder.member.store_format,
        "shape": t.shape,
        "dtype": t.dtype.str,
        "chunk_shape": t.chunk_shape,
        "dim_labels": t.dim_labels if declared["dim_labels"] else None,
    }
    diff = [f"{key} {_shown(was[key])} (not {_shown(value)})" for key, value in declared.items() if was[key] != value]
    if diff:
        raise AlreadyExists(
            f"add_tensor {request_id!r}: the name is taken: it already exists as "
            f"{holder.array_id!r} (PENDING, declared with {', '.join(diff)}); re-plan it as it "
            "was added to resume it, add the tensor under another name, or DISCARD it first"
        )
    with holder.cond:
        holder.last_activity = clock()
    log.info(
        "re-planned PENDING upload %s (%d of %d chunks written)",
        holder.array_id,
        len(holder.received),
        holder.expected_chunks,
    )
    return holder


def _shown(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)
