"""URL paths of the virtual OME-Zarr view: ``<array id>/<zarr key>`` resolved in one step.

The array id grammar is ``core.identity.ArrayId``: the first segment is the source id (it
has no ``/``); a field may span several segments. A path is read as one of two things:

(a) the source's tensor named by the longest run of segments after the source id that is
    one of its fields, with the zarr key after it, or
(b) the source's default tensor with the whole rest as the zarr key (a source with none of
    its own, the scratch source, has only (a)).

The one that leaves a valid key of its image wins; when both do, (a) wins unless its field
*is* the default tensor, in which case (b) (the default tensor's URL is its source id:
``python -m tensor_server url`` and the catalog print that, and a bioformats2raw image whose
field is ``0`` keeps its level ``0`` there). No candidate is tried by reading: it costs one
record lookup and at most ``MAX_FIELD_SEGMENTS`` dictionary lookups, and a path longer than
any key could be is refused before any lookup (a 30,000-segment URL is a 404 in microseconds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tensor_server.core.identity import NO_DEFAULT_TENSOR, SEP
from tensor_server.errors import TensorNotFound

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.core.adapter_base import TensorAdapter
    from tensor_server.http.zarr_view import ZarrImage

__all__ = ["resolve_zarr_path", "zarr_key_valid", "MAX_PATH_SEGMENTS"]

#: segments a field may span in a URL (HDF5 groups, ``@fields/<name>/@labels/<set>``)
MAX_FIELD_SEGMENTS = 16
#: a longer path names nothing: an id of at most 1 + MAX_FIELD_SEGMENTS segments, then a key
#: of at most ``labels/<name>/<level>/c/<index per axis>`` (32 axes is zarr's own limit)
MAX_PATH_SEGMENTS = 1 + MAX_FIELD_SEGMENTS + 4 + 32

_GROUP_KEYS = {2: ((".zgroup",), (".zattrs",)), 3: (("zarr.json",),)}


def zarr_key_valid(image: ZarrImage, rest: list[str], zarr_format: int) -> bool:
    """Whether ``rest`` addresses something of ``image`` (metadata, a level's metadata or a
    chunk key, a label image's paths); the grid bound of a chunk key is checked later."""
    if not rest or tuple(rest) in _GROUP_KEYS[zarr_format]:
        return True
    if rest[0] == "labels" and image.labels:
        if len(rest) == 1 or tuple(rest[1:]) in _GROUP_KEYS[zarr_format]:
            return True
        label = image.labels.get(rest[1])
        return label is not None
    level = image.level(rest[0])
    if level is None:
        return False
    key = rest[1:]
    if zarr_format == 2:
        return key in ([".zarray"], [".zattrs"]) or (len(key) == 1 and _all_digits(key[0].split(".")))
    return key == ["zarr.json"] or (len(key) > 1 and key[0] == "c" and _all_digits(key[1:]))


def _all_digits(parts: list[str]) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts '²', which ``int`` refuses."""
    return bool(parts) and all(p and p.isascii() and p.isdigit() for p in parts)


def resolve_zarr_path(
    segments: list[str],
    zarr_format: int,
    find: Callable[[str], TensorAdapter],
    image_of: Callable[[TensorAdapter], ZarrImage],
) -> tuple[ZarrImage, list[str]]:
    """(image, zarr key) for a URL path below ``/zarr/`` or ``/zarr3/`` (module docstring).
    ``find(array_id)`` looks a tensor up (the caller applies the read rules to the one
    chosen); ``image_of`` makes (or reuses) its view. Raises TensorNotFound for a path that
    names nothing."""
    if not segments:
        raise TensorNotFound("no array id in the path: use /zarr/<array_id>/ or /zarr3/<array_id>/")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise TensorNotFound(f"a path of {len(segments)} segments names no array (at most {MAX_PATH_SEGMENTS})")
    source_id, after = segments[0], segments[1:]
    try:
        default: TensorAdapter | None = find(source_id)
    except TensorNotFound as exc:
        if exc.slug != NO_DEFAULT_TENSOR or not after:
            raise
        default, no_default = None, exc  # a source of fields only (scratch): a field must be named
    default_image = image_of(default) if default is not None else None
    for k in range(min(len(after), MAX_FIELD_SEGMENTS), 0, -1):
        try:
            tensor = find(source_id + SEP + SEP.join(after[:k]))
        except TensorNotFound:
            continue
        image, rest = image_of(tensor), after[k:]
        field_fits = zarr_key_valid(image, rest, zarr_format)
        default_fits = default_image is not None and zarr_key_valid(default_image, after, zarr_format)
        if field_fits and not (default_fits and tensor is default):
            return image, rest
        if default_fits and default_image is not None:
            return default_image, after
        return image, rest  # neither fits: the field's view says what is missing
    if default_image is None:
        raise TensorNotFound(
            f"no tensor of {source_id!r} is named by {SEP.join(after)[:200]!r} ({no_default})", slug="unknown_field"
        )
    return default_image, after
