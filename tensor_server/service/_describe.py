"""Describe and plan: what a describe or a read plan answers (``Described``), and the plans
kept for the requests a warm viewer repeats (``kept_plan``: the same rules, no derivation;
``_kept.py`` holds them). ``ServingRuntime.describe`` and its kin call these; every door gets
its plans here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensor_server.core.bounds import Bounds
from tensor_server.core.identity import ArrayId
from tensor_server.core.plan import ReadPlan, plan_read
from tensor_server.core.request import check_read_request
from tensor_server.errors import InvalidArgument
from tensor_server.service._kept import UNKEPT_FIELDS

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime
    from tensor_server.uploads import Upload

__all__ = ["READ_MASK_PATHS", "Described", "described", "keep_plan", "kept_plan", "with_sequence"]

#: describe field-mask paths this server answers. ``upload_status`` is answered by omission
#: for tensors no upload backs; ``ticket_stub`` is not served (health: ``ticket_stubs:
#: false``), so asking for it is refused like any unknown path.
READ_MASK_PATHS = frozenset({"endpoints", "metadata_json", "pyramid", "is_resident", "upload_status"})


@dataclass
class Described:
    """What a describe or plan answers (a door renders it: Flight as a TensorDescriptor)."""

    tensor: TensorAdapter | None
    echo: str
    fields: frozenset[str]
    plan: ReadPlan | None = None
    had_slice: bool = False
    metadata_json: str | None = None
    is_resident: bool | None = None
    #: the upload behind the id, when one is (its status is part of the answer)
    upload: Upload | None = None
    #: the array id and region as asked (what ``kept_plan`` runs the rules on again)
    asked: tuple[str, Bounds | None] = ("", None)

    @property
    def wants_endpoints(self) -> bool:
        return "endpoints" in self.fields


def described(
    rt: ServingRuntime,
    caller: Caller,
    array_id: str,
    region: Bounds | None,
    scale: Sequence[int] | None,
    method: str,
    fields: Iterable[str],
) -> Described:
    """A describe (no endpoints asked) or a read plan. An upload's id answers its write
    plan while PENDING (unscaled), its status always, and a read plan once READY."""
    wanted = frozenset(fields)
    unknown = sorted(wanted - READ_MASK_PATHS)
    if unknown:
        raise InvalidArgument(
            f"tensor_read: unknown field mask path(s) {unknown}; known: {sorted(READ_MASK_PATHS)}",
            slug="unknown_field_mask",
        )
    scale = list(scale or []) or None
    scaled = scale is not None and any(s != 1 for s in scale)
    up = rt.upload(array_id)
    write_plan = False
    if up is not None:
        from tensor_server.uploads import UploadClosed
        from tensor_server.uploads.marker import DISCARDED, PENDING

        rt.access.read(caller, up.tensor)
        if up.state == DISCARDED:  # a tombstone: only its status is served
            if "endpoints" in wanted or scaled:
                raise UploadClosed(up.array_id, DISCARDED, up.reason)
            return Described(None, up.array_id, wanted, upload=up)
        if scaled:
            assert rt.uploads is not None  # up is one of its uploads
            rt.uploads.check_readable(up)  # an unscaled plan while PENDING is the write plan
        write_plan = up.state == PENDING and not scaled
    tensor, echo = rt.tensor(array_id, caller, pixels=False)
    if _reopened_if_stale(rt, tensor, region):  # plan against the bytes on disk now
        tensor, echo = rt.tensor(array_id, caller, pixels=False)
    check_read_request(region, scale, tensor.shape)
    plan = None
    if "endpoints" in wanted or region is not None or scaled:
        # a write plan keeps the stored grid: the upload's chunks are that grid's cells
        plan = plan_read(tensor, region, scale, method, grid="transfer" if write_plan else "fit")
        if "endpoints" in wanted and not plan.chunks:
            raise InvalidArgument(f"{array_id}: the requested region is empty")
    source_id, field = ArrayId.parse(tensor.array_id)
    record = rt.catalog.get_record(source_id)
    source = record.source if "metadata_json" in wanted else None
    metadata_json = None if source is None else with_sequence(source.metadata_json(field or None), tensor)
    resident = record.is_resident() if "is_resident" in wanted else None
    return Described(
        tensor,
        echo,
        wanted,
        plan,
        region is not None,
        metadata_json,
        resident,
        up if "upload_status" in wanted else None,
        (array_id, region),
    )


def kept_plan(rt: ServingRuntime, caller: Caller, request: bytes) -> Any | None:
    """A door's answer kept for the plan request ``request`` (its bytes: ``keep_plan``),
    when the rules of ``describe`` let it stand for ``caller`` now: the gate, the same
    tensor unchanged, the exact stale check of the region. None: describe it."""
    kept = rt.kept.get(request)
    if kept is None:
        return None
    array_id, region = kept.asked
    tensor, _ = rt.tensor(array_id, caller, pixels=False)
    if _reopened_if_stale(rt, tensor, region) or not kept.made_from(tensor):
        return None
    return kept.answer


def keep_plan(rt: ServingRuntime, request: bytes, plan: Described, answer: Any) -> None:
    """Keep ``answer``, a door's rendering of ``plan``, for the plan request
    ``request``: not an upload's (its state moves), nor fields that change while the
    tensor does not."""
    if plan.tensor is None or plan.upload is not None or plan.fields & UNKEPT_FIELDS:
        return
    if rt.upload(plan.asked[0]) is None:
        rt.kept.keep(request, plan.tensor, plan.asked, answer)


def _reopened_if_stale(rt: ServingRuntime, tensor: TensorAdapter, region: Bounds | None) -> bool:
    """Plan time: reopen the source when the bytes under the region changed since it was
    opened (True), so the plan mints ids of the new content version. Exact (every file
    stat'ed, no recent verification trusted): ids minted from a window-old answer would be
    refused as stale by the first chunk read that stats the files (CI saw it: a plan right
    after an in-place rewrite, refused mid-``get_array``)."""
    if rt.refreshed(tensor):
        return True
    try:
        bounds = Bounds.full(tensor.shape) if region is None else region.clamp(tensor.shape).validate(tensor.shape)
    except InvalidArgument:
        return False  # the request check reports the bad region
    reason = tensor.stale_reason(bounds, exact=True)
    if reason is None:
        return False
    rt.catalog.reopen_changed(tensor, reason)
    return True


def with_sequence(document: str, tensor: TensorAdapter) -> str:
    """A descriptor's ``metadata_json`` with the tensor's extent ``sequence`` added (issue
    46: a client learns from the descriptor which extent it saw, and resumes a watch from it).
    The wrapper is a JSON object (``SourceAdapter.metadata_json``), encoded once per source:
    the key is spliced in before its closing brace rather than the document decoded again
    (a plate's is 0.9 MB). The SDK does not parse the wrapper (wire protocol §3.3)."""
    return f'{document[:-1]}, "sequence": {tensor.extents.sequence}}}'
