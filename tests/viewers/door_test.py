"""The door conformance suite through the three viewer doors, each read as its web client reads
it: IIIF (``full/max`` PNGs, as a web viewer fetches them), DeepZoom (the ``.dzi`` descriptor,
then the one tile of its full-resolution level) and the catalog page (the built-in viewer page
``/view/<id>``, then the tile source that page names). Their reads are rendered 8-bit images,
so the suite checks their size; every rule (the gate, grants, tokens, error statuses, no
internal text) is checked as on every door. None of them serves stats, chunk ids or
add_source, so those checks skip."""

from __future__ import annotations

import html
import io
import re
import xml.etree.ElementTree as ET
from urllib.parse import quote, unquote

import numpy as np
import pytest

from tensor_server.testing.door_tests import GRANT, TOKEN, DoorTests
from tests.http.door_test import http_get, http_refusal


class _ImageDoor:
    renders = True
    stats = read_chunk = add_source = None  # verbs these doors do not serve

    def __init__(self, url) -> None:
        self.url = url

    refusal = staticmethod(http_refusal)

    def _get(self, path, token):
        return http_get(f"{self.url}{path}", token)

    @staticmethod
    def _image(body: bytes) -> np.ndarray:
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(body)))


class IiifDoor(_ImageDoor):
    def read(self, array_id, token):
        return self._image(self._get(f"/iiif/3/{array_id}/full/max/0/default.png", token).content)


class DeepZoomDoor(_ImageDoor):
    """What OpenSeadragon does with a ``.dzi`` source: read the descriptor, then the tiles of
    the level it shows (the door-test tensors fit one tile at full resolution)."""

    def read(self, array_id, token):
        dzi = ET.fromstring(self._get(f"/deepzoom/{array_id}.dzi?format=png", token).text)
        ns = {"dz": "http://schemas.microsoft.com/deepzoom/2008"}
        size = dzi.find("dz:Size", ns)
        width, height, tile = int(size.get("Width")), int(size.get("Height")), int(dzi.get("TileSize"))
        assert dzi.get("Format") == "png" and max(width, height) <= tile, "door tests read one-tile tensors"
        level = max(0, (max(width, height) - 1).bit_length())
        image = self._image(self._get(f"/deepzoom/{array_id}_files/{level}/0_0.png", token).content)
        assert image.shape[:2] == (height, width), (image.shape, width, height)
        return image


class CatalogPageDoor(_ImageDoor):
    """A person following the catalog page: the viewer page of a tensor (refused as the tensor
    is), then the IIIF tile source it names, then the image at full size."""

    def read(self, array_id, token):
        page = self._get(f"/view/{quote(array_id, safe='/;=')}", token).text
        found = re.search(r'/iiif/3/[^"<\s]+/info\.json', page)
        assert found is not None, f"the viewer page names no IIIF source: {page[:300]}"
        info = self._get(found.group(0), token).json()
        assert unquote(info["id"]).endswith(unquote(found.group(0))[: -len("/info.json")]), info["id"]
        return self._image(self._get(f"{found.group(0)[: -len('info.json')]}full/max/0/default.png", token).content)

    def listed(self, source_id, token):
        """The tensor names the page of the level naming the source shows."""
        page = self._get(f"/?folder={quote(source_id)}", token).text
        return [html.unescape(name) for name in re.findall(r"<td><b>([^<]*)</b>", page)]


class TestIiifDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return IiifDoor(world.served.http_url)


class TestDeepZoomDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return DeepZoomDoor(world.served.http_url)


class TestCatalogPageDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return CatalogPageDoor(world.served.http_url)

    def test_the_listing_needs_the_server_token(self, door, world):
        """The folder listing is the control surface's view of the catalog: a grant opens its
        own tensor, never the listing."""
        for token in (None, "wrong", GRANT):
            refusal = self.refused(door, door._get, "/", token)
            assert refusal.status == 401, refusal
        assert "img" in door._get("/", TOKEN).text
