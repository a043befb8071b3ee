"""The door conformance suite through the IIIF door (``full/max`` PNGs, as a web viewer fetches
them; DeepZoom and the catalog page read through the same provider). Its reads are rendered
8-bit images, so the suite checks their size; every rule (the gate, grants, tokens, error
statuses) is checked as on every door."""
from __future__ import annotations

import io

import numpy as np
import pytest

from tensor_server.testing.door_tests import DoorTests
from tests.http.door_test import http_get, http_refusal


class _ImageDoor:
    renders = True
    stats = read_chunk = add_source = None  # verbs these doors do not serve

    def __init__(self, url) -> None:
        self.url = url

    refusal = staticmethod(http_refusal)

    def _get(self, path, token):
        return http_get(f"{self.url}{path}", token)


class IiifDoor(_ImageDoor):
    def read(self, array_id, token):
        from PIL import Image

        body = self._get(f"/iiif/3/{array_id}/full/max/0/default.png", token).content
        return np.asarray(Image.open(io.BytesIO(body)))


class TestIiifDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return IiifDoor(world.served.http_url)
