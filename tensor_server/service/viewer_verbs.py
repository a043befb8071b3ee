"""The verbs of the viewer doors (IIIF, DeepZoom, the catalog page's viewer and thumbnails):
an image of a plane of a served tensor, for a caller.

Each verb takes the caller as an argument, like every verb of the runtime, and applies the
read rules once per request: ``plane`` looks the tensor up with ``ServingRuntime.tensor``
(the token or the tensor's grant, the upload gate), and the pixels under an image come from
``ServingRuntime.level_region`` on that gated tensor (its chunks through the engine, the
cache, the precacher and admission; no second look-up per chunk). Rendering is ``render``'s,
on pixels handed to it: the read happens here, so a tile goes door -> service -> render and
core, never back up.

The request grammars (IIIF's ``{region}/{size}/{rotation}/{quality}.{format}``, DeepZoom's
``<level>/<col>_<row>.<format>``) are parsed by ``render.iiif`` and ``render.deepzoom``, the
plane selection (``;z=3;c=1``) by ``render.plane``; the doors only route, and map errors.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from tensor_server.core.engine import Cancelled
from tensor_server.errors import InvalidArgument
from tensor_server.render import deepzoom, iiif
from tensor_server.render.colour import channel_labels
from tensor_server.render.histogram import channel_list, percentile_window
from tensor_server.render.image import Renderer, available_formats, encode
from tensor_server.render.labels import drawn_over, ids_shown, label_plane
from tensor_server.render.plane import PlaneView, Shown, split_identifier
from tensor_server.render.spec import SpecStore, parse_spec, split_spec_id

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from tensor_server.service.caller import Caller
    from tensor_server.service.runtime import ServingRuntime

__all__ = ["ViewerVerbs"]


class ViewerVerbs:
    """``ServingRuntime.viewer``: one ``Renderer`` (render settings measured once per tensor
    and plane for every viewer door) over the runtime's reads."""

    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self.renderer = Renderer()
        #: the render specs posted to this process (``POST /render``), bounded
        self.specs = SpecStore()
        #: the image formats this Pillow writes (webp only with libwebp)
        self.formats = available_formats()

    def store_spec(self, body: bytes) -> dict[str, str]:
        """Store the render spec ``body`` holds (``render.spec``: a 400 naming the field at
        fault); its id, and the identifier suffix that shows it."""
        spec_id = self.specs.put(parse_spec(body))
        return {"id": spec_id, "suffix": f";r={spec_id}"}

    def spec(self, spec_id: str) -> dict[str, Any]:
        """The stored spec ``spec_id`` as its canonical JSON (a viewer restoring a shared view)."""
        doc: dict[str, Any] = json.loads(self.specs.get(spec_id).canonical())
        return {"id": spec_id, **doc}

    def plane(self, identifier: str, caller: Caller) -> PlaneView:
        """The plane ``identifier`` names (``<array_id>;z=3;c=1``, or ``;r=<spec id>``) of a
        tensor ``caller`` may read: the one look-up and read-rule check of a viewer request."""
        rest, spec_id = split_spec_id(identifier)
        spec = self.specs.get(spec_id) if spec_id is not None else None
        array_id, selection = split_identifier(rest)
        tensor, _ = self.runtime.tensor(array_id, caller)
        return PlaneView.of(tensor, selection, self.runtime.policy, spec)

    def region(self, view: PlaneView, caller: Caller, shown: Shown, cancelled: Cancelled | None = None) -> Image.Image:
        """``shown`` of ``view`` rendered, read at the level that serves its size
        (``PlaneView.window``); with a spec, only its visible channels are read, in one call
        (``ServingRuntime.level_channels``) and in the spec's order."""
        whole = view.every_channel()
        settings = self.renderer.settings_of(
            view, lambda: self._pixels(whole, *whole.coarsest_window(), caller, cancelled)
        )
        if view.spec is not None:
            indices, tables = self.renderer.spec_tables(
                view,
                settings,
                lambda i, low, high: percentile_window(self._coarse(view, i, caller, cancelled), low, high),
            )
            level, bounds = whole.window(shown)
            axis = whole.index_axis
            if axis is None:  # one channel: the spec names channel 0
                data = self.runtime.level_region(whole.tensor, level, bounds, caller, cancelled)
            else:
                data = self.runtime.level_channels(whole.tensor, level, bounds, axis, indices, caller, cancelled)
            image = self.renderer.composited(view, whole.planes(data), level, tables, shown)
            return image if view.spec.labels is None else self._labelled(view, image, shown, caller, cancelled)
        level, bounds = view.window(shown)
        planes = self._pixels(view, level, bounds, caller, cancelled)
        return self.renderer.image(view, planes, level, settings, shown)

    def _labelled(
        self, view: PlaneView, image: Image.Image, shown: Shown, caller: Caller, cancelled: Cancelled | None
    ) -> Image.Image:
        """``image`` (``shown`` of ``view``, composited) with the spec's label image over it
        (``render.labels``): a label image of the source ``caller`` may read, else a 400."""
        spec = view.spec.labels if view.spec is not None else None
        assert spec is not None  # the caller draws a spec's labels
        found = self.runtime.image_labels(caller, view.tensor)
        label = found.get(spec.name)
        if label is None:
            has = ", ".join(repr(n) for n in sorted(found)) or "none"
            raise InvalidArgument(
                f"labels.name: {view.tensor.array_id} has no label image {spec.name[:80]!r} (it has {has})"
            )
        plane = label_plane(view, label, spec.name, self.runtime.policy)
        level, bounds = plane.window(shown)
        ids = self._pixels(plane, level, bounds, caller, cancelled)[0]
        return drawn_over(image, ids_shown(plane, ids, level, shown), spec)

    def histograms(self, identifier: str, channels: str | None, caller: Caller) -> dict[str, Any]:
        """The histograms of the channels ``channels`` names (``c=0,3``; None: all) of the plane
        ``identifier`` names, each with the channel's default window (``render.histogram``)."""
        view = self.plane(identifier, caller)
        whole = view.every_channel()
        settings = self.renderer.settings_of(view, lambda: self._pixels(whole, *whole.coarsest_window(), caller, None))
        labels = channel_labels(view.tensor.metadata)
        out = []
        for i in channel_list(channels, view.channel_count):
            hist = self.renderer.histogram(view, i, functools.partial(self._coarse, view, i, caller, None))
            entry: dict[str, Any] = {"index": i, "label": labels.get(i, f"channel {i}"), **hist.as_json()}
            if settings.channels:
                c = settings.channels[i]
                entry.update(window=[c.start, c.end], color="#{:02X}{:02X}{:02X}".format(*c.colour), active=c.active)
            out.append(entry)
        return {"array_id": view.tensor.array_id, "dtype": str(view.tensor.dtype), "channels": out}

    def _coarse(self, view: PlaneView, index: int, caller: Caller, cancelled: Cancelled | None) -> np.ndarray:
        """Channel ``index`` of ``view``'s plane at its coarsest level: what its histogram and
        percentile windows are measured on."""
        one = view.one_channel(index)
        return self._pixels(one, *one.coarsest_window(), caller, cancelled)[0]

    def _pixels(
        self, view: PlaneView, level: Any, bounds: Any, caller: Caller, cancelled: Cancelled | None
    ) -> np.ndarray:
        data = self.runtime.level_region(view.tensor, level, bounds, caller, cancelled)
        return view.planes(data)

    # ---- IIIF Image API 3 -----------------------------------------------------------------------
    def iiif_info(self, identifier: str, caller: Caller, service_id: str) -> dict[str, Any]:
        """``info.json`` of the image ``identifier``, whose ``id`` is ``service_id`` (the URL
        the door was asked at, carrying the credential it came with)."""
        view = self.plane(identifier, caller)
        return iiif.info_json(service_id, view.width, view.height, self.formats, view.square_levels())

    def iiif_image(
        self, identifier: str, request_parts: list[str], caller: Caller, cancelled: Cancelled | None = None
    ) -> tuple[str, bytes]:
        """(format, encoded image) of ``{region}/{size}/{rotation}/{quality}.{format}`` of
        ``identifier``: parsed against the image's size before anything is read."""
        view = self.plane(identifier, caller)
        region, size, rotation, quality_format = request_parts
        req = iiif.parse_request(region, size, rotation, quality_format, view.width, view.height, self.formats)
        image = self.region(view, caller, req, cancelled)
        return req.format, encode(iiif.finish(image, req), req.format)

    # ---- DeepZoom -------------------------------------------------------------------------------
    def dzi(self, identifier: str, fmt: str, caller: Caller) -> str:
        """The ``.dzi`` descriptor of ``identifier`` with tiles in ``fmt``."""
        self._offered(fmt)
        view = self.plane(identifier, caller)
        return deepzoom.dzi_xml(view.width, view.height, fmt)

    def deepzoom_tile(self, tile_path: str, caller: Caller, cancelled: Cancelled | None = None) -> tuple[str, bytes]:
        """(format, encoded tile) of ``<identifier>_files/<level>/<col>_<row>.<format>``."""
        path = deepzoom.parse_tile_path(tile_path)
        self._offered(path.format)
        view = self.plane(path.identifier, caller)
        tile = deepzoom.tile_region(view.width, view.height, path.level, path.col, path.row)
        image = self.region(view, caller, tile, cancelled)
        return path.format, encode(image, path.format)

    def _offered(self, fmt: str) -> None:
        if fmt not in self.formats:
            raise InvalidArgument(f"format {fmt[:20]!r} is not offered; use one of {self.formats}")
