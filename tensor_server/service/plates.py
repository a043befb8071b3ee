"""A plate image in a catalog listing: one entry with its wells paged, never an entry per field.

The rule the catalog page (``http/catalog_page.py``) and ``/api/catalog`` share, so the two
never list a plate differently: a tensor whose metadata carries a ``montage`` layout (an HCS
plate's image, ``core/montage.py``) is one entry; the fields it places, and their label images
(``<field>/@labels/<name>``), get no entry of their own but are listed under it, well by well,
one page at a time (``wells_page``): a 1536-well plate of 9 fields is 13,824 fields, which as
entries made its folder's page 13,824 rows and thumbnails and its JSON as many objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensor_server.errors import InvalidArgument

__all__ = ["WELL_LINKS_PER_PAGE", "WellsPage", "split_plates", "wells_page"]

#: field entries one page of a plate's wells holds (whole wells; a well of more fields than this
#: alone on its page): a listing shows the first page and links the next. 864 is a whole 96-well
#: plate of 9 fields; a 1536-well plate of 9 fields then adds 66 KB to the catalog page where its
#: whole list is 1.06 MB (measured with the page's links to fields of a source id like
#: ``screen-3239dbfc`` under a ``/t/<token>`` prefix, 2026-12-05)
WELL_LINKS_PER_PAGE = 864


def split_plates(served: Sequence[Any]) -> list[tuple[Any, dict[str, list[Any]] | None]]:
    """The tensors of a source that get an entry, plates first, each with None or, for a plate
    image, what its layout places: field (``<well>/<field>``) -> that field's tensors the
    caller is served (itself, then its label images). ``served``: ``ServedTensor``s."""
    placed: dict[str, list[Any]] = {}
    plates: list[tuple[Any, dict[str, list[Any]]]] = []
    for t in served:
        layout = t.tensor.metadata.get("montage")
        if layout:
            fields: dict[str, list[Any]] = {
                f"{w['path']}/{f['path']}": [] for w in layout["wells"] for f in w["fields"]
            }
            plates.append((t, fields))
            placed.update(fields)
    rows: list[tuple[Any, dict[str, list[Any]] | None]] = []
    for t in served:
        owner = placed.get(t.field.partition("/@")[0])
        if owner is not None:
            owner.append(t)
        else:
            rows.append((t, next((of for plate, of in plates if plate is t), None)))
    return sorted(rows, key=lambda row: row[1] is None)  # the plates first


@dataclass(frozen=True)
class WellsPage:
    """One page of a plate's wells: each well's path with its fields, each field's path with
    its served tensors (none: the caller may not read it); where the next page starts (None:
    this is the last); the plate's numbers of wells and fields."""

    wells: list[tuple[str, list[tuple[str, list[Any]]]]]
    start: int
    next_start: int | None
    well_count: int
    field_count: int


def _links(well: dict[str, Any], fields: dict[str, list[Any]]) -> int:
    """A well's entries on a page: each field's tensors, a field the caller may not read one."""
    return sum(max(1, len(fields[f"{well['path']}/{f['path']}"])) for f in well["fields"])


def wells_page(plate: Any, fields: dict[str, list[Any]], start: int) -> WellsPage:
    """The page of ``plate``'s wells from well ``start`` (``split_plates``'s ``fields``): whole
    wells until the page holds ``WELL_LINKS_PER_PAGE`` entries, at least one well."""
    wells = plate.tensor.metadata["montage"]["wells"]
    if not 0 <= start < len(wells):
        raise InvalidArgument(f"start {start} is not a well of {plate.listed_id!r} (it has {len(wells)})")
    page, links, stop = [], 0, start
    while stop < len(wells) and (stop == start or links + _links(wells[stop], fields) <= WELL_LINKS_PER_PAGE):
        well = wells[stop]
        page.append((well["path"], [(f["path"], fields[f"{well['path']}/{f['path']}"]) for f in well["fields"]]))
        links += _links(well, fields)
        stop += 1
    return WellsPage(page, start, stop if stop < len(wells) else None, len(wells), sum(len(w["fields"]) for w in wells))
