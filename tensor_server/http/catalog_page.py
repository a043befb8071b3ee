"""The catalog page at ``/`` and the built-in viewer at ``/view/<identifier>``.

``/?folder=<key>`` lists one level of the catalog tree (the same tree as the Flight action
``catalog_children``): its folders, then its sources, each tensor with a thumbnail (an IIIF
image), shape, dtype, axes, physical size and levels, the URL of every door (OME-Zarr v2 and
v3, IIIF ``info.json``, DeepZoom ``.dzi``), the Flight array id with a copyable SDK snippet,
and a link to ``/view/<identifier>``: OpenSeadragon on the IIIF (or, with ``?source=dzi``, the
DeepZoom) source. OpenSeadragon comes from its npm package, installed by ``make viewer-assets``
into the git-ignored ``.viewer-assets/`` (or the folder ``TENSOR_SERVER_OSD_DIR`` names), and
is served under ``/assets/openseadragon/``; where it is absent the viewer page says how to get
it.

A plate (a tensor whose metadata carries a ``montage`` layout, ``core/montage.py``) is one row:
the plate image's thumbnail and doors, then its wells in a collapsed list, each well's fields
linked to their own viewer pages (a field's label images beside it); the fields it places get
no row of their own (a 1536-well plate of 9 fields would be 13,824 rows and as many
thumbnails). The list is paged, never the whole plate (``wells_list``), so the page's size is
bounded whatever the plate's. The rule is the service floor's (``service/plates.py``).

``/api/catalog?folder=<key>`` answers the same level as JSON: both come from one service
call (``CatalogVerbs.catalog_level``: the tree ``catalog_children`` lists, each source with
the tensors ``ServingRuntime.fields`` serves the caller, or the reason it cannot be read); a
plate is one entry there too, its wells paged (``wells_json``, ``/api/wells/<plate id>``).

The page's links carry the credential the request presented (its URL or ``Authorization``,
never the cookie's) in the path form ``/t/<token>/`` (``http/security.py``), which zarr clients
keep on every key they fetch, so a door URL copied from the page works where it is pasted; the
thumbnails are admitted by the door's cookie, set when the page was opened from a
token-bearing URL; the SDK snippet shows the token as text for the user. No credential is
written into a page's script. The pages run no inline script (their
``Content-Security-Policy`` allows only the server's own files): the viewer's options travel
as JSON in a ``<script type="application/json">`` element that the served ``pages.js`` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from tensor_server.core.level_grid import grid_levels
from tensor_server.errors import InvalidArgument, TensorServerError
from tensor_server.http._request_body import body_within
from tensor_server.http.viewer_door import guarded, presented_token, token_path
from tensor_server.render.plane import PlaneView
from tensor_server.service import share_verbs
from tensor_server.service.plates import WellsPage, split_plates, wells_page
from tensor_server.service.shares import SHARE_PATH_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.service import Caller, ServingRuntime

__all__ = [
    "osd_dir",
    "routes",
    "script_json",
    "wells_json",
    "wells_list",
    "wells_html",
    "API_CATALOG",
    "API_WELLS",
    "WELLS_PREFIX",
]

THUMBNAIL = 160
#: the pages of a plate's wells list
WELLS_PREFIX = "/wells/"
#: the JSON catalog: ``?folder=<key>`` as for the page
API_CATALOG = "/api/catalog"
#: the JSON pages of a plate's wells: ``/api/wells/<plate id>?start=N``
API_WELLS = "/api/wells/"
#: ``POST`` the ``share`` action's JSON body: the page's share buttons (``service/share_verbs.py``)
API_SHARE = "/api/share"
#: the pages' own files, served at ``/assets/page/<name>`` (a policy of ``script-src 'self'``
#: runs no inline script, ``style-src 'self'`` applies no inline style)
PAGE_ASSETS_PREFIX = "/assets/page/"
_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse}"
    "td,th{border-bottom:1px solid #ddd;padding:.4em .6em;vertical-align:top;text-align:left}"
    "img.thumb{max-width:160px;max-height:160px;background:#000}code,pre{background:#f4f4f4}"
    "pre{padding:.4em;margin:.2em 0;white-space:pre-wrap}.urls a{display:block}"
    "ul.wells{margin:.3em 0;padding-left:1.2em;font-size:.9em}ul.wells a{margin-right:.4em}"
    "html.viewer,html.viewer body{margin:0;height:100%;background:#000}#osd{width:100%;height:100%}"
    "#panel{position:fixed;top:0;right:0;max-height:100%;overflow-y:auto;width:15em;padding:.4em;"
    "background:rgba(255,255,255,.85);font-size:.8em}#panel .channel,#panel .axis,#panel .labels{margin:.3em 0}"
    "#panel input[type=range]{width:6em}#panel input[type=number]{width:3.5em}#panel .note{color:#a00}"
    "#panel canvas.histogram{display:block;width:150px;height:30px}"
    "#scale-bar{position:fixed;left:1em;bottom:1em;color:#fff;font-size:.8em;text-shadow:0 0 2px #000}"
    "#scale-bar div{height:5px;background:#fff;border:1px solid #000;margin-bottom:.2em}"
)
_SCRIPT = """"use strict";
(function () {
  var options = document.getElementById("viewer-options");
  if (options) { window.viewer = OpenSeadragon(JSON.parse(options.textContent)); }
  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(button.previousElementSibling.textContent);
    });
  });
  document.querySelectorAll("button.share").forEach(function (button) {
    button.addEventListener("click", function () {
      var out = button.nextElementSibling;
      fetch(button.dataset.endpoint, {method: "POST", headers: {"Content-Type": "application/json"},
                                      body: JSON.stringify({array_id: button.dataset.arrayId})})
        .then(function (r) { return r.ok ? r.json() : r.text().then(function (t) { throw new Error(t); }); })
        .then(function (made) { out.textContent = made.url + "  (7 days; id " + made.id + ")"; })
        .catch(function (e) { out.textContent = String(e.message || e); });
    });
  });
})();
"""
_PANEL_SCRIPT = (Path(__file__).with_name("viewer_panel.js")).read_text(encoding="utf-8")
_SCALE_SCRIPT = (Path(__file__).with_name("viewer_scale.js")).read_text(encoding="utf-8")
_PAGE_ASSETS = {
    "pages.js": (_SCRIPT, "text/javascript"),
    "panel.js": (_PANEL_SCRIPT, "text/javascript"),
    "scale.js": (_SCALE_SCRIPT, "text/javascript"),
    "pages.css": (_STYLE, "text/css"),
}
#: what JSON escapes further inside HTML: no ``</script>``, ``<!--``, entity or line terminator
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(value: Any) -> str:
    """``value`` as JSON safe inside a ``<script>`` element (the one way data enters a page's
    script): ``<``, ``>``, ``&`` and U+2028/2029 as ``\\uXXXX`` escapes, which JSON reads back
    unchanged and HTML never sees as markup."""
    return json.dumps(value).translate(_SCRIPT_SAFE)


def _page(title: str, body: str, html_class: str = "", prefix: str = "") -> str:
    """A whole page: ``title`` (plain text, escaped here), ``body`` (HTML), the pages' own
    style sheet and script (under ``prefix``: a share link's path, see ``viewer_html``)."""
    html = f'<html class="{escape(html_class)}">' if html_class else "<html>"
    assets = escape(prefix + PAGE_ASSETS_PREFIX)
    return (
        f"<!doctype html>{html}<meta charset=utf-8><title>{escape(title)}</title>"
        f'<link rel="stylesheet" href="{assets}pages.css">{body}'
        f'<script src="{assets}pages.js"></script><script src="{assets}panel.js"></script>'
        f'<script src="{assets}scale.js"></script>'
    )


def osd_dir() -> Path:
    """Where OpenSeadragon's built files are looked for."""
    configured = os.environ.get("TENSOR_SERVER_OSD_DIR")
    if configured:
        return Path(configured)
    root = Path(__file__).resolve().parents[2]
    return root / ".viewer-assets" / "node_modules" / "openseadragon" / "build" / "openseadragon"


def _physical(tensor: Any) -> str:
    """Each axis's pixel size and extent, in its unit; an axis without a unit (a scale the
    format gives with no length, an uncalibrated image) has no physical size to show."""
    units = tensor.physical_unit or (None,) * tensor.ndim
    out = []
    for label, n, step, unit in zip(tensor.dim_labels, tensor.shape, tensor.physical_scale or (), units):
        if step and unit:
            out.append(f"{label}: {step:g} {unit}/px ({n * step:g} {unit})")
    return "<br>".join(escape(s) for s in out) or "—"


def _door_urls(tensor: Any, prefix: str) -> list[tuple[str, str]]:
    """(name, path) of every door serving ``tensor``, each under ``prefix`` (``/t/<token>``
    or nothing: ``viewer_door.token_path``)."""
    aid = quote(tensor.array_id, safe="/")
    urls = [("OME-Zarr v2 (NGFF 0.4)", f"{prefix}/zarr/{aid}/"), ("OME-Zarr v3 (NGFF 0.5)", f"{prefix}/zarr3/{aid}/")]
    if tensor.ndim >= 2:
        urls += [
            ("IIIF info.json", f"{prefix}/iiif/3/{aid}/info.json"),
            ("DeepZoom .dzi", f"{prefix}/deepzoom/{aid}.dzi"),
            ("viewer (OpenSeadragon)", _tensor_page(tensor, prefix)),
        ]
    return urls


def _tensor_page(tensor: Any, prefix: str) -> str:
    """The page a person opens a tensor on: the viewer for an image, else its OME-Zarr group."""
    aid = quote(tensor.array_id, safe="/")
    return f"{prefix}/view/{aid}" if tensor.ndim >= 2 else f"{prefix}/zarr/{aid}/"


def _share_button(runtime: ServingRuntime, caller: Caller, tensor: Any, prefix: str) -> str:
    """A button that makes a 7-day share link of ``tensor`` (``POST /api/share``), when the
    caller may (``Access.may_share``: the server token, or the tensor's owner)."""
    try:
        runtime.access.may_share(caller, tensor)
    except TensorServerError:
        return ""
    return (
        f'<button class="share" data-endpoint="{escape(prefix + API_SHARE)}" '
        f'data-array-id="{escape(tensor.array_id)}">share</button><pre class="shared"></pre>'
    )


def _tensor_row(runtime: ServingRuntime, caller: Caller, served: Any, token: str | None, host: str, prefix: str) -> str:
    tensor = served.tensor
    aid = quote(tensor.array_id, safe="/")
    thumb = "—"
    if tensor.ndim >= 2:
        plane = PlaneView.of(tensor, {}, runtime.policy)
        size = "max" if max(plane.width, plane.height) <= THUMBNAIL else f"!{THUMBNAIL},{THUMBNAIL}"
        thumb = (
            f'<img class="thumb" alt="thumbnail of {escape(served.listed_id)}" src="'
            f'{escape(f"/iiif/3/{aid}/full/{size}/0/default.jpg")}">'
        )
    levels = grid_levels(tensor, runtime.policy)
    level_text = "<br>".join(
        escape(f"{lv.path}: {'×'.join(map(str, lv.shape))} ({lv.method if lv.index else 'full resolution'})")
        for lv in levels
    )
    links = "".join(f'<a href="{escape(u)}">{escape(name)}</a>' for name, u in _door_urls(tensor, prefix))
    location = runtime.flight_location(host)
    sdk = ""  # no Flight door listens: nothing to paste
    if location is not None:
        tok = f", token={token!r}" if token else ""  # for the user to copy: HTML text, escaped below
        snippet = (
            f"from biopb.tensor import TensorFlightClient\n"
            f"client = TensorFlightClient({location!r}{tok})\n"
            f"data = client.get_tensor({served.listed_id!r}).compute()"
        )
        sdk = f'<pre>{escape(snippet)}</pre><button class="copy">copy</button>'
    return (
        f"<tr><td>{thumb}</td><td><b>{escape(served.listed_id)}</b><br>shape {escape(str(tuple(tensor.shape)))}"
        f"<br>dtype {escape(str(tensor.dtype))}<br>axes {escape(''.join(tensor.dim_labels))}"
        f"{'<br>labels' if tensor.is_labels else ''}</td><td>{_physical(tensor)}</td><td>{level_text}</td>"
        f'<td class="urls">{links}{sdk}{_share_button(runtime, caller, tensor, prefix)}</td></tr>'
    )


def wells_list(plate: Any, page: WellsPage, prefix: str) -> str:
    """One page of a plate's wells (``service/plates.wells_page``: whole wells, at most
    ``WELL_LINKS_PER_PAGE`` field links): each well's path and its fields' links (to the
    field's viewer; its label images beside it), then a link to the next page saying how many
    wells are left. On the catalog page (the first page) a collapsed ``<details>``: a page
    that pages its wells stays bounded for any plate (a 1536-well plate of 9 fields whole
    would add 1 MB to every load of its folder), and paging is plain links, which need no
    script (a lazy load would need the pages' script to build markup). A field the caller may
    not read (a grant of another) is named, unlinked."""
    items = []
    for well, fields in page.wells:
        anchors = []
        for name, tensors in fields:
            anchors += [
                f'<a class="field" href="{escape(_tensor_page(t.tensor, prefix))}">{escape(t.field[len(well) + 1 :])}</a>'
                for t in tensors
            ] or [f'<span class="field">{escape(name)}</span>']
        items.append(f'<li><b class="well">{escape(well)}</b> {"".join(anchors)}</li>')
    more = ""
    if page.next_start is not None:
        href = f"{prefix}{WELLS_PREFIX}{quote(plate.tensor.array_id, safe='/')}?" + urlencode(
            {"start": page.next_start}
        )
        more = f'<p><a class="more-wells" href="{escape(href)}">{page.well_count - page.next_start} more wells</a></p>'
    listing = f'<ul class="wells">{"".join(items)}</ul>{more}'
    if page.start:
        return listing
    return f"<details><summary>{page.well_count} wells, {page.field_count} fields of view</summary>{listing}</details>"


def wells_json(plate: Any, page: WellsPage, prefix: str) -> dict[str, Any]:
    """One page of a plate's wells as JSON (``/api/catalog``'s plate entry, ``/api/wells``):
    each field's path and the ids of its tensors the caller is served (``array_id``: null
    where it may read none; ``labels``: its label images'), and the next page's URL."""
    wells = []
    for well, fields in page.wells:
        entries = []
        for name, tensors in fields:
            own = next((t for t in tensors if "/@" not in t.field), None)
            labels = [t.listed_id for t in tensors if t is not own]
            entries.append({"path": name, "array_id": None if own is None else own.listed_id, "labels": labels})
        wells.append({"path": well, "fields": entries})
    more = None
    if page.next_start is not None:
        more = f"{prefix}{API_WELLS}{quote(plate.tensor.array_id, safe='/')}?" + urlencode({"start": page.next_start})
    return {
        "count": page.well_count,
        "fields": page.field_count,
        "start": page.start,
        "wells": wells,
        "next": more,
    }


def wells_html(runtime: ServingRuntime, caller: Caller, identifier: str, start: int, prefix: str) -> str:
    """``/wells/<plate id>?start=N``: the page of the plate's wells list from well ``start``
    (``CatalogVerbs.plate_wells``), for ``caller``."""
    plate, page = runtime.catalog_verbs.plate_wells(identifier, caller, start)
    viewer = f'<a href="{escape(_tensor_page(plate.tensor, prefix))}">the plate in the viewer</a>'
    body = f"<h1>Wells of {escape(plate.listed_id)}</h1><p>{viewer}</p>{wells_list(plate, page, prefix)}"
    return _page(f"wells of {plate.listed_id}", body)


def _folder_link(key: str, prefix: str = "") -> str:
    return escape(f"{prefix}/?" + urlencode({"folder": key}))


def _title(path: str | None) -> str:
    """A folder's full path on disk as its tooltip (the tree names a root by its last
    component), or nothing where it has none."""
    return "" if path is None else f' title="{escape(path)}"'


def _source_html(
    runtime: ServingRuntime, caller: Caller, source: dict[str, Any], token: str | None, host: str, prefix: str
) -> str:
    """A source's heading, then its tensors' table (a plate: one row and its wells list, the
    fields it places folded into that list), or the reason it cannot be read."""
    head = f'<h2 class="source">{escape(source["name"])} <small>({escape(source["source_id"])})</small></h2>'
    if source["unresolved_reason"] is not None:
        return f'{head}<p class="unresolved">cannot be read: {escape(source["unresolved_reason"])}</p>'
    rows = "".join(
        _tensor_row(runtime, caller, served, token, host, prefix)
        + (
            ""
            if fields is None
            else f'<tr class="wells"><td colspan="5">{wells_list(served, wells_page(served, fields, 0), prefix)}</td></tr>'
        )
        for served, fields in split_plates(source["tensors"])
    )
    return (
        f"{head}<table><tr><th></th><th>tensor</th><th>physical size</th><th>levels</th><th>doors</th></tr>"
        f"{rows}</table>"
    )


def catalog_html(
    runtime: ServingRuntime, caller: Caller, key: str, token: str | None, host: str, prefix: str = ""
) -> str:
    """The page of folder ``key`` for ``caller`` (``CatalogVerbs.catalog_level``): its links under ``prefix`` (the
    path form of the credential the request presented itself: ``viewer_door.token_path``),
    ``token`` (the one it came with, the cookie's too) in the SDK snippet, as text."""
    level = runtime.catalog_verbs.catalog_level(key, caller)
    crumbs = [
        f'<a class="crumb" href="{_folder_link(c["key"], prefix) if c["key"] else escape(prefix) + "/"}"'
        f"{_title(c['path'])}>{escape(c['name'] or 'catalog')}</a>"
        for c in level["trail"]
    ]
    body = [f"<h1>tensor-server</h1><p>{' / '.join(crumbs)}</p>"]
    if level["folders"]:
        body.append(
            "<h2>Folders</h2><ul>"
            + "".join(
                f'<li><a class="folder" href="{_folder_link(f["key"], prefix)}"{_title(f["path"])}>'
                f"{escape(f['name'])}/</a></li>"
                for f in level["folders"]
            )
            + "</ul>"
        )
    body += [_source_html(runtime, caller, source, token, host, prefix) for source in level["sources"]]
    if level["truncated"]:
        body.append("<p>(more entries than one page lists)</p>")
    if not level["folders"] and not level["sources"]:
        body.append("<p>Nothing is served here yet.</p>")
    return _page("tensor-server", "".join(body))


def catalog_json(runtime: ServingRuntime, caller: Caller, key: str, prefix: str = "") -> dict[str, Any]:
    """``/api/catalog?folder=<key>``: the page's level as JSON (``CatalogVerbs.catalog_level``, the
    same call), for scripts and web clients that do not speak Flight. Each tensor: its id as
    listed (what the SDK reads), axes, shape, dtype, whether it is a label image, physical
    scale and unit, and its door URLs (relative, in the page's form). A plate image is one
    entry with the first page of its wells (``wells_json``); the fields it places have none
    of their own (``service/plates.py``)."""
    level = runtime.catalog_verbs.catalog_level(key, caller)

    def tensor_json(served: Any) -> dict[str, Any]:
        t = served.tensor
        return {
            **served.row,
            "is_labels": bool(t.is_labels),
            "physical_scale": list(t.physical_scale) if t.physical_scale else None,
            "physical_unit": list(t.physical_unit) if t.physical_unit else None,
            "urls": {name: url for name, url in _door_urls(t, prefix)},
        }

    sources = [
        {
            "name": s["name"],
            "source_id": s["source_id"],
            "unresolved_reason": s["unresolved_reason"],
            "tensors": [
                tensor_json(t)
                if fields is None
                else {**tensor_json(t), "wells": wells_json(t, wells_page(t, fields, 0), prefix)}
                for t, fields in split_plates(s["tensors"])
            ],
        }
        for s in level["sources"]
    ]
    return {
        "key": level["key"],
        "path": level["path"],
        "folders": level["folders"],
        "sources": sources,
        "truncated": level["truncated"],
    }


def viewer_html(
    identifier: str, source: str, view: PlaneView | None = None, share_prefix: str = "", labels: Sequence[str] = ()
) -> str:
    """OpenSeadragon on ``identifier``: its options as JSON data, started by ``pages.js``; no
    credential in the page (the tiles are admitted by the door's cookie), except the share
    link the page was opened with (``share_prefix``, ``/s/<capability>``: it is in the page's
    own URL already, and earns no cookie, so the tiles need it in theirs). With ``view`` (the
    plane the identifier names), the channel panel (``viewer_panel.js``) beside it, where the
    plane's channels can be composited (not a label image, an RGB one or one channel alone),
    with a label overlay where the source has label images (``labels``, their names)."""
    aid = quote(identifier, safe="/;=")
    if not (osd_dir() / "openseadragon.min.js").is_file():
        return _page(
            "viewer",
            "<p>The zoomable viewer needs OpenSeadragon, which is not installed. Run "
            "<code>make viewer-assets</code> in the tensor-server checkout (it runs <code>npm install "
            "openseadragon</code> into <code>.viewer-assets/</code>), or point <code>TENSOR_SERVER_OSD_DIR"
            "</code> at OpenSeadragon's <code>build/openseadragon</code> folder, then "
            f"reload. The tiles are already served: <code>/iiif/3/{escape(aid)}/info.json</code>.</p>",
        )
    tile_source = share_prefix + (f"/deepzoom/{aid}.dzi" if source == "dzi" else f"/iiif/3/{aid}/info.json")
    # timeout/retries: a cold coarse tile of a large image with no pyramid is a reduction of the
    # whole image (2.4-2.9 s for 32768² on an idle 2-core machine, several times that under
    # load), longer than OpenSeadragon's 30 s default allows on a busy server; a tile it gives
    # up on is never drawn and never retried (tileRetryMax 0)
    options = {
        "id": "osd",
        "prefixUrl": f"{share_prefix}/assets/openseadragon/images/",
        "tileSources": tile_source,
        "showNavigator": True,
        "crossOriginPolicy": "Anonymous",
        "timeout": 300_000,
        "tileRetryMax": 2,
    }
    panel = _panel_options(view, labels, share_prefix) if view is not None and source != "dzi" else None
    scale = _pixel_size(view) if view is not None else None
    return _page(
        identifier,
        f'<div id="osd"></div><script src="{escape(share_prefix)}/assets/openseadragon/openseadragon.min.js"></script>'
        f'<script type="application/json" id="viewer-options">{script_json(options)}</script>'
        + (f'<script type="application/json" id="scale-options">{script_json(scale)}</script>' if scale else "")
        + (
            f'<div id="panel"></div><script type="application/json" id="panel-options">{script_json(panel)}</script>'
            if panel is not None
            else ""
        ),
        "viewer",
        share_prefix,
    )


def _pixel_size(view: PlaneView) -> dict[str, Any] | None:
    """The image's pixel size along x, what the scale bar (``viewer_scale.js``) is drawn from;
    None where x has no physical size (no unit: as ``_physical`` shows none)."""
    t = view.tensor
    step = t.physical_scale[view.x] if t.physical_scale else None
    unit = t.physical_unit[view.x] if t.physical_unit else None
    return {"size": float(step), "unit": str(unit)} if step and unit else None


def _panel_options(view: PlaneView, labels: Sequence[str], prefix: str = "") -> dict[str, Any] | None:
    """What the channel panel starts from: the array id, the plane's other axes (their sizes,
    indices and places in the shape: a growing tensor's watch records give the whole shape), the spec the identifier names, the label images it may draw over the image,
    and the URLs it calls (under ``prefix``: the share link the page was opened with); None
    where the plane has no channels to composite."""
    t = view.tensor
    if t.is_labels or view.sample_axis is not None or view.selected_channel is not None:
        return None
    path = quote(t.array_id, safe="/")
    fixed = sorted(a for a in view.fixed if a != view.channel_axis)
    axes = [{"name": t.dim_labels[a], "size": t.shape[a], "axis": a} for a in fixed]
    return {
        "array_path": path,
        "plane": {t.dim_labels[a]: i for a, i in view.fixed.items() if a != view.channel_axis},
        "axes": axes,
        "spec": view.spec.id if view.spec is not None else None,
        "labels": sorted(labels),
        "iiif": f"{prefix}/iiif/3/",
        "render": f"{prefix}/render",
        "watch": f"{prefix}/watch/{path}",
        "histogram": f"{prefix}/histogram/{path}"
        + "".join(f";{t.dim_labels[a]}={i}" for a, i in sorted(view.fixed.items())),
    }


def _start(request: Any) -> int:
    """A wells page's ``?start=N``: a well's index."""
    start = request.query_params.get("start", "0")
    if not start.isdigit() or len(start) > 9:
        raise InvalidArgument(f"start must be a well's index, a whole number; got {start[:40]!r}")
    return int(start)


def routes(runtime: ServingRuntime, caller_of: Callable[[Any], Caller]) -> list[Any]:
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    async def catalog(request: Any, caller: Caller) -> Any:
        key = request.query_params.get("folder", "")[:4096]
        html = await run_in_threadpool(
            catalog_html,
            runtime,
            caller,
            key,
            presented_token(request),
            request.url.hostname or "127.0.0.1",
            token_path(request),
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    async def catalog_api(request: Any, caller: Caller) -> Any:
        key = request.query_params.get("folder", "")[:4096]
        doc = await run_in_threadpool(catalog_json, runtime, caller, key, token_path(request))
        return JSONResponse(doc, headers={"Cache-Control": "no-cache"})

    async def share(request: Any, caller: Caller) -> Any:
        body = await body_within(request, 64 << 10)
        answer = await run_in_threadpool(lambda: list(share_verbs.share(runtime, caller, body, lambda: False)))
        return Response(answer[0], media_type="application/json", headers={"Cache-Control": "no-store"})

    async def view(request: Any, caller: Caller) -> Any:
        identifier = request.path_params["identifier"]
        view = await run_in_threadpool(runtime.viewer.plane, identifier, caller)  # 404/400 now, not a blank viewer
        presented = presented_token(request)
        shared = presented is not None and runtime.access.share_of(caller) is not None  # checked just now
        prefix = f"{SHARE_PATH_PREFIX}{quote(presented, safe='')}" if shared and presented else ""
        labels = {} if view.tensor.is_labels else await run_in_threadpool(runtime.image_labels, caller, view.tensor)
        source = request.query_params.get("source", "iiif")
        return HTMLResponse(viewer_html(identifier, source, view, prefix, list(labels)))

    async def wells(request: Any, caller: Caller) -> Any:
        html = await run_in_threadpool(
            wells_html, runtime, caller, request.path_params["identifier"], _start(request), token_path(request)
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    async def wells_api(request: Any, caller: Caller) -> Any:
        start = _start(request)
        identifier = request.path_params["identifier"]

        def page() -> dict[str, Any]:
            plate, wells = runtime.catalog_verbs.plate_wells(identifier, caller, start)
            return {"array_id": plate.listed_id, **wells_json(plate, wells, token_path(request))}

        return JSONResponse(await run_in_threadpool(page), headers={"Cache-Control": "no-cache"})

    async def page_asset(request: Any) -> Any:
        asset = _PAGE_ASSETS.get(request.path_params["name"])
        if asset is None:
            return PlainTextResponse(
                f"not found: the pages' files are {', '.join(sorted(_PAGE_ASSETS))}", status_code=404
            )
        return Response(asset[0], media_type=asset[1], headers={"Cache-Control": "no-cache"})

    return [
        Route("/", guarded(catalog, caller_of), methods=["GET", "HEAD"]),
        Route(API_CATALOG, guarded(catalog_api, caller_of), methods=["GET", "HEAD"]),
        Route(API_SHARE, guarded(share, caller_of), methods=["POST"]),
        Route("/view/{identifier:path}", guarded(view, caller_of), methods=["GET", "HEAD"]),
        Route(WELLS_PREFIX + "{identifier:path}", guarded(wells, caller_of), methods=["GET", "HEAD"]),
        Route(API_WELLS + "{identifier:path}", guarded(wells_api, caller_of), methods=["GET", "HEAD"]),
        Route(PAGE_ASSETS_PREFIX + "{name}", page_asset, methods=["GET", "HEAD"]),
        Mount("/assets/openseadragon", StaticFiles(directory=str(osd_dir()), check_dir=False)),
    ]
