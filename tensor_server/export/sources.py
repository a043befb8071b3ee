"""What an export reads: one tensor and its label images, from a local file or a running server.

``open_export_source(source, array_id, server=, token=)`` yields an ``ExportSource``: the
image tensor and, by name, the label images that belong to it. Locally the source is any
file or folder the server opens (``adapters.registry.open_source``); with ``server`` it is an
array id on a running biopb tensor server, read through the biopb SDK
(``adapters.upstream.RemoteTensorAdapter``: each read unit is one planned read of the server,
so the export stays one pass with memory bounded by the unit, as locally).

Which label images belong to an image is ``core.ngff.image_labels``' rule (the OME-Zarr view
uses the same one): label images that cannot sit beside the image are left out, with the
reason in the ``skipped`` list the progress records carry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tensor_server.core.adapter_base import TensorAdapter
from tensor_server.core.ngff import image_labels
from tensor_server.errors import InvalidArgument, TensorNotFound

__all__ = ["ExportSource", "open_export_source", "label_images"]


@dataclass
class ExportSource:
    """The tensor to export and its label images (name -> tensor); ``skipped``: label
    images left out, ``{"name", "reason"}`` each."""

    tensor: TensorAdapter
    labels: dict[str, TensorAdapter] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)


def label_images(
    fields: Mapping[str, Any],
    image_field: str,
    image: TensorAdapter,
    default_field: str | None = None,
    describe: Any = None,
) -> ExportSource:
    """``image`` and its label images among a source's ``fields`` (``core.ngff.image_labels``)."""
    found = image_labels(fields, image_field, image, default_field, describe)
    return ExportSource(image, found.labels, found.skipped)


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
def open_export_source(
    source: str, array_id: str | None = None, *, server: str | None = None, token: str | None = None
) -> Iterator[ExportSource]:
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
