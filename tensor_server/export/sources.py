"""What an export reads: one tensor and its label images, from a local file or a running server.

``open_export_source(source, array_id, server=, token=)`` yields an ``ExportSource``: the
image tensor and, by name, the label images that belong to it. Locally the source is any
file or folder the server opens (``adapters.registry.open_source``); with ``server`` it is an
array id on a running biopb tensor server, read through the biopb SDK
(``adapters.upstream.RemoteTensorAdapter``: each read unit is one planned read of the server,
so the export stays one pass with memory bounded by the unit, as locally).

Which label images belong to an image. A label tensor (``is_labels``) belongs to the image
at field ``F`` when its field is ``F/labels/<name>`` (an OME-Zarr image's ``labels/`` group)
or ``F/@labels/<name>`` (a label set uploaded onto the image); a top-level ``labels/<name>``
or ``@labels/<name>`` belongs to the source's default image (an OME-Zarr store's root image).
A label image whose extent differs from the image's on a shared axis cannot sit beside it in
one NGFF image (the levels must coincide) and is left out, with the reason in the
``skipped`` list the progress records carry.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.errors import InvalidArgument, TensorNotFound

__all__ = ["ExportSource", "open_export_source", "label_images"]

_MARKERS = ("labels", "@labels")


@dataclass
class ExportSource:
    """The tensor to export and its label images (name -> tensor); ``skipped``: label
    images left out, ``{"name", "reason"}`` each."""

    tensor: TensorAdapter
    labels: dict[str, TensorAdapter] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _label_name(image_field: str, default_field: str, candidate: str) -> str | None:
    """``candidate``'s label name when it is a label field of ``image_field`` (module
    docstring), else None."""
    head, _, name = candidate.rpartition("/")
    parent, _, marker = head.rpartition("/")
    if not name or marker not in _MARKERS and head not in _MARKERS:
        return None
    if head in _MARKERS:  # top level: the source's default image
        return name if image_field == default_field else None
    return name if parent == image_field else None


def label_images(fields: Mapping[str, Any], image_field: str, image: TensorAdapter,
                 default_field: str | None = None, describe: Any = None) -> ExportSource:
    """The label images of ``image`` among a source's ``fields`` (field -> tensor, or -> a
    key ``describe(key)`` turns into a tensor, so only label candidates are described)."""
    default_field = next(iter(fields), "") if default_field is None else default_field
    out = ExportSource(image)
    for candidate, value in fields.items():
        name = _label_name(image_field, default_field, candidate)
        if name is None or candidate == image_field:
            continue
        tensor = describe(value) if describe is not None else value
        if not tensor.is_labels:
            continue
        problem = _mismatch(image, tensor)
        if problem:
            out.skipped.append({"name": name, "reason": problem})
        elif name in out.labels:
            out.skipped.append({"name": name, "reason": f"a second label image named {name!r} ({candidate})"})
        else:
            out.labels[name] = tensor
    return out


def _mismatch(image: TensorAdapter, label: TensorAdapter) -> str | None:
    shared = [a for a in label.dim_labels if a in image.dim_labels]
    if not {"y", "x"} <= set(shared):
        return f"axes {list(label.dim_labels)} lack the image's y and x"
    for axis in shared:
        n, m = label.shape[label.dim_labels.index(axis)], image.shape[image.dim_labels.index(axis)]
        if n != m and not (axis == "c" and n == 1):
            return f"its {axis} extent {n} is not the image's {m}"
    extra = [f"{a} ({label.shape[i]})" for i, a in enumerate(label.dim_labels) if a not in image.dim_labels and label.shape[i] > 1]
    if extra:
        return f"axes {extra} are not the image's"
    return None


def _pick_local(source: Any, array_id: str | None) -> tuple[str, TensorAdapter]:
    if array_id is None:
        field_name = next(iter(source.tensors))
        return field_name, source.tensors[field_name]
    for field_name, tensor in source.tensors.items():
        if array_id in (field_name, tensor.array_id):
            return field_name, tensor
    tensor = source.tensor(array_id)  # raises TensorNotFound naming the fields
    return next(f for f, t in source.tensors.items() if t is tensor), tensor


@contextmanager
def open_export_source(source: str, array_id: str | None = None, *, server: str | None = None,
                       token: str | None = None) -> Iterator[ExportSource]:
    """The tensor to export (``array_id``: a field or array id of a local ``source``; with
    ``server``, ``source`` is the array id) and its label images."""
    if server is not None:
        if array_id is not None:
            raise InvalidArgument("--array-id names a tensor of a local SOURCE; with --server, SOURCE is the array id")
        yield _remote(server, token, source)
        return
    from tensor_server.adapters.registry import open_source

    with open_source(source) as src:
        image_field, tensor = _pick_local(src, array_id)
        yield label_images(src.tensors, image_field, tensor, next(iter(src.tensors)))


def _remote(server: str, token: str | None, array_id: str) -> ExportSource:
    """The server's tensor ``array_id`` and its listed label images, described through the
    SDK (nothing is read until the pass)."""
    from tensor_server.adapters.upstream import RemoteTensorAdapter, Upstream
    from tensor_server.core.identity import ArrayId

    upstream = Upstream(server, token=token)
    client = upstream.client

    def describe(aid: str) -> RemoteTensorAdapter:
        tensor = RemoteTensorAdapter(upstream, upstream.call(f"describe {aid}", client.get_descriptor, aid))
        tensor.array_id = aid
        return tensor

    image = describe(array_id)
    source_id = ArrayId.parse(image.upstream_id).source_id
    sql = "SELECT tensors FROM sources WHERE source_id = '" + source_id.replace("'", "''") + "'"
    rows = upstream.call("catalog listing", client.query, sql).to_pylist()
    if not rows:
        raise TensorNotFound(f"{server}: {array_id!r} is not in the server's listing")
    listed = [t["array_id"] for t in rows[0]["tensors"] or ()]
    fields = {ArrayId.parse(aid).field: aid for aid in listed}
    image_field = ArrayId.parse(image.upstream_id).field
    default = ArrayId.parse(listed[0]).field if listed else image_field
    return label_images(fields, image_field, image, default, describe)
