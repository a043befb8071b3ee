"""OME-TIFF: single file, multi-file sets (companion ``.companion.ome`` or ``BinaryOnly``
MetadataFile), several images per file, SubIFD pyramids as native levels.

tifffile assembles the OME series (including the pages held by the other files of a set,
which it opens by UUID/FileName), the pyramid levels from SubIFDs and the OME axes. What it
does not do is follow ``<BinaryOnly MetadataFile=...>``: such a file has no dimensions of its
own, so this module reads the named metadata file (an XML companion, or the master OME-TIFF)
and hands the XML to tifffile (``TiffFile(..., omexml=...)``). Opening any one file of a set,
or the companion itself, therefore opens the whole dataset, and the content version covers
every file of it.
"""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from tensor_server.adapters._ome_tiff_live import LiveLayout, LiveOmeTiffAdapter, live_layout
from tensor_server.adapters._tiff_series import TiffHandle, TiffPageSeriesAdapter, open_tiff_file
from tensor_server.adapters.registry import FormatEntry, register_format
from tensor_server.adapters.tiff import (
    build_series_tensors,
    check_series_extent,
    first_description_tail,
    is_tiff_head,
    physical_lists,
    series_field_names,
    series_files,
)
from tensor_server.core.adapter_base import SourceAdapter, TensorAdapter
from tensor_server.core.normalizing import normalize_axes
from tensor_server.core.units import MICROMETER, canonical_unit
from tensor_server.errors import UnreadableSource

__all__ = [
    "MAX_XML_BYTES",
    "OmeTiffAdapter",
    "binary_only_metadata_file",
    "OmeTiffSource",
    "is_set_xml",
    "resolve_ome_set",
    "set_file_names",
]

log = logging.getLogger(__name__)

# A companion or master file larger than this is not OME metadata we should parse in memory.
MAX_XML_BYTES = 256 << 20


class OmeTiffAdapter(TiffPageSeriesAdapter):
    """One OME image (or one of its SubIFD pyramid levels) of an OME-TIFF file or file set.

    Why an OME-TIFF block is the whole page. Under chunkmode="page", tifffile's zarr store
    decodes the entire page and slices the window out, and nothing caches the decoded page,
    so N units cost N page decodes. The per-strile mode reads proportionally but loses strip
    coalescing and threaded tile decode (maxworkers applies only to page mode): on a 4096²
    page it is 9x slower for one-row strips and 1.6-2.4x slower for compressed 512 tiles.
    Page mode is right for reading a page, so the page is the block (one plane: ones on
    T/C/Z, the full Y/X extent). Pages above ``page_mode_max_bytes`` use strile mode (see
    TiffPageSeriesAdapter).
    """


# ---- OME-XML -----------------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def binary_only_metadata_file(description: str | None) -> str | None:
    """The MetadataFile named by a ``<BinaryOnly>`` OME block, or None."""
    if not description or "BinaryOnly" not in description[:16384]:
        return None
    try:
        root = ElementTree.fromstring(description)
    except ElementTree.ParseError:
        return None
    for el in root:
        if _local(el.tag) == "BinaryOnly":
            return el.attrib.get("MetadataFile") or None
    return None


def _read_xml(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_XML_BYTES:
        raise UnreadableSource(path, f"OME metadata file is {size} bytes; refusing to parse more than {MAX_XML_BYTES}")
    return path.read_bytes().decode("utf-8", errors="replace")


def set_file_names(xml: str, where: str | Path) -> dict[str, str]:
    """UUID -> FileName of every other file an OME-XML's TiffData names (a multi-file set's
    members, in document order), the local and the URL opener's one reading of it. The
    document's own UUID is left out: that file is the one holding the XML, whatever name it
    has now (tifffile reads it as itself: a renamed file is not looked for under its old
    name). An unparsable document is an error naming ``where``."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise UnreadableSource(where, f"OME-XML does not parse: {exc}") from None
    own = root.attrib.get("UUID")
    return {
        uuid: el.attrib["FileName"]
        for el in root.iter()
        if _local(el.tag) == "UUID" and el.attrib.get("FileName") and (uuid := (el.text or "").strip()) != own
    }


def _first_tiff_of_companion(xml: str, folder: Path, companion: Path) -> Path:
    """The first TIFF a companion's TiffData/UUID FileName names (it must exist)."""
    names = list(dict.fromkeys(set_file_names(xml, companion).values()))
    if not names:
        raise UnreadableSource(companion, "OME-XML names no TIFF file (no TiffData/UUID FileName)")
    for name in names:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    raise UnreadableSource(companion, f"none of the TIFF files it names exists beside it (first: {names[0]!r})")


def resolve_ome_set(path: Path) -> tuple[Path, str | None, Path | None]:
    """(TIFF to open, external OME-XML or None, companion/metadata file or None) for ``path``,
    which may be any TIFF of a set or the XML companion itself."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if not is_tiff_head(head):  # the companion (or another OME-XML file naming TIFFs)
        xml = _read_xml(path)
        return _first_tiff_of_companion(xml, path.parent, path), xml, path
    with open_tiff_file(path) as tf:
        description = tf.pages.first.description if len(tf.pages) else None
    metadata_file = binary_only_metadata_file(description)
    if metadata_file is None:
        return path, None, None
    target = path.parent / metadata_file
    if not target.is_file():
        log.warning("%s: BinaryOnly metadata file %s is missing; opening this file alone", path, target)
        return path, None, None
    with open(target, "rb") as fh:
        target_head = fh.read(16)
    if is_tiff_head(target_head):  # the master OME-TIFF holds the full XML
        return target, None, target
    return path, _read_xml(target), target


def _images(omexml: str | None) -> list[dict[str, Any]]:
    """Name, physical sizes and channel names of every Image with Pixels, in document order."""
    if not omexml:
        return []
    try:
        root = ElementTree.fromstring(omexml)
    except ElementTree.ParseError:
        return []
    out = []
    for image in root:
        if _local(image.tag) != "Image":
            continue
        pixels = next((p for p in image if _local(p.tag) == "Pixels"), None)
        if pixels is None:
            continue
        a = pixels.attrib
        sizes: dict[str, tuple[float, str]] = {}
        for code in ("X", "Y", "Z"):
            value = _positive(a.get(f"PhysicalSize{code}"))
            unit = canonical_unit(a.get(f"PhysicalSize{code}Unit", MICROMETER))
            if value is not None and unit:
                sizes[code] = (value, unit)
        dt = _positive(a.get("TimeIncrement"))
        if dt is not None:
            sizes["T"] = (dt, canonical_unit(a.get("TimeIncrementUnit", "s")))
        channels = [c.attrib.get("Name", "") for c in pixels if _local(c.tag) == "Channel"]
        out.append(
            {
                "name": image.attrib.get("Name", ""),
                "id": image.attrib.get("ID", ""),
                "dimension_order": a.get("DimensionOrder", ""),
                "type": a.get("Type", ""),
                "sizes": sizes,
                "channel_names": channels if any(channels) else [],
            }
        )
    return out


def _positive(value: str | None) -> float | None:
    try:
        v = float(value) if value is not None else None
    except ValueError:
        return None
    return v if v is not None and v > 0 else None


def _match_images(series: list[Any], images: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """The OME Image of each tifffile series: by position when the counts agree (tifffile
    builds series in Image order), else by a unique name."""
    if len(images) == len(series):
        return list(images)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for im in images:
        by_name.setdefault(im["name"], []).append(im)
    out: list[dict[str, Any] | None] = []
    for s in series:
        hits = by_name.get(s.name or "", [])
        out.append(hits[0] if len(hits) == 1 else None)
    return out


# ---- source ------------------------------------------------------------------------------------
class OmeTiffSource(SourceAdapter):
    """An OME-TIFF file or file set: one tensor per OME image (field = the Image name when
    every name is unique and safe, else ``series_<i>``), SubIFD levels as native levels."""

    format_name = "ome-tiff"

    def __init__(self, path: Path) -> None:
        path = Path(path)
        root, omexml, companion = resolve_ome_set(path)
        handle = TiffHandle(
            root, opener=lambda: open_tiff_file(root, omexml=omexml) if omexml else open_tiff_file(root)
        )
        try:
            with handle.use() as opened:
                tf = opened.tf
                check_series_extent(path, tf)
                files = series_files(tf)
                xml = tf.ome_metadata if tf.is_ome else None
                images = _match_images(list(opened.series), _images(xml))
                flags = sorted(tf.flags)
                creator = _creator(xml)
                live = live_layout(root, tf, xml) if companion is None else None
                series_name = opened.series[0].name
            extra = [str(p) for p in (companion, path) if p is not None]
            handle.files = sorted({os.path.realpath(f) for f in [*files, *extra]})  # one spelling per file

            def physical(tf: Any, index: int, series: Any) -> dict[str, tuple[float, str]]:
                image = images[index]
                return dict(image["sizes"]) if image else {}

            def tensor_metadata(tf: Any, index: int, series: Any) -> dict[str, Any]:
                image = images[index]
                if not image:
                    return {}
                return {"ome_image": image["name"], "channel_names": image["channel_names"]}

            if live is not None:
                tensors, summaries = _live_tensors(handle, live, series_name, images[0])
            else:
                tensors, summaries = build_series_tensors(
                    handle, OmeTiffAdapter, physical=physical, tensor_metadata=tensor_metadata
                )
        except BaseException:
            handle.close()
            raise
        self.handle = handle
        # member paths are resolved (symlinks followed), so relate them to the resolved folder
        base = path.resolve().parent
        super().__init__(
            path,
            tensors,
            metadata={
                "tifffile_flags": flags,
                "creator": creator,
                "files": [os.path.relpath(f, base) for f in handle.files],
                "companion": None if companion is None else os.path.relpath(Path(companion).resolve(), base),
                "series": summaries,
                "images": [None if im is None else {k: v for k, v in im.items() if k != "sizes"} for im in images],
            },
        )

    def close(self) -> None:
        super().close()
        self.handle.close()


def _live_tensors(
    handle: TiffHandle, live: LiveLayout, name: str | None, image: dict[str, Any] | None
) -> tuple[dict[str, TensorAdapter], list[dict[str, Any]]]:
    """The one tensor of an acquisition still being written (``_ome_tiff_live``) and its
    series summary, as ``build_series_tensors`` gives them for a finished file."""
    axes = "".join(live.labels).upper() + "YX"
    scale, unit = physical_lists(axes, image["sizes"] if image else {})
    extra = {"ome_image": image["name"], "channel_names": image["channel_names"]} if image else {}
    tensor = LiveOmeTiffAdapter(
        live,
        physical_scale=scale,
        physical_unit=unit,
        content_version=handle.content_version(),
        metadata={"series": 0, "axes": axes, "live": True, **extra},
    )
    field = series_field_names([name])[0]
    summary = {"name": name or "", "kind": "ome", "axes": axes, "shape": list(tensor.shape), "field": field}
    return {field: normalize_axes(tensor)}, [{**summary, "dtype": str(tensor.dtype), "levels": [summary["shape"]]}]


def _creator(omexml: str | None) -> str | None:
    if not omexml:
        return None
    try:
        return ElementTree.fromstring(omexml).attrib.get("Creator")
    except ElementTree.ParseError:
        return None


def _sniff_ome_tiff(path: Path, head: bytes) -> bool:
    """A TIFF whose first ImageDescription is OME-XML (tifffile's own test: it ends with
    ``OME>``), or an OME-XML companion naming TIFF files (a UUID with a FileName; the
    METADATA.ome.xml of a bioformats2raw folder has TiffData but names no file)."""
    if is_tiff_head(head):
        if b"<OME" in head:
            return True
        tail = first_description_tail(path, head)
        return tail is not None and tail.endswith(b"OME>")
    return is_set_xml(path.name, head)


def is_set_xml(name: str, head: bytes) -> bool:
    """Whether a file called ``name`` starting with ``head`` is the OME-XML of a multi-file
    set (a companion): OME-XML whose TiffData names files, or named ``.companion.ome``."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith((b"<?xml", b"<OME")) and b"<OME" in head:
        names_tiffs = b"<TiffData" in head and b"FileName=" in head
        return names_tiffs or name.lower().endswith(".companion.ome")
    return False


register_format(
    FormatEntry(
        name="ome-tiff",
        opener=OmeTiffSource,
        sniff=_sniff_ome_tiff,
        extensions=(".ome.tif", ".ome.tiff", ".ome.tf2", ".ome.tf8", ".ome.btf", ".companion.ome"),
        priority=60,
        description="OME-TIFF (single file, multi-file sets with companion/BinaryOnly, SubIFD pyramids)",
    )
)
