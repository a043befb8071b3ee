"""The door conformance suite through the HTTP door: a real HTTP client (httpx) reading the
virtual OME-Zarr view as any zarr client does (level 0's ``.zarray``, then its chunk)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from tensor_server import errors
from tensor_server.testing.door_tests import DoorTests, Refusal


class HttpRefused(Exception):
    def __init__(self, status, text):
        super().__init__(f"{status}: {text}")
        self.status, self.text = status, text


def http_get(url, token):
    """GET ``url`` as a client presenting ``token`` (None: none); a non-200 is HttpRefused."""
    import httpx

    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    r = httpx.get(url, headers=headers, timeout=60)
    if r.status_code != 200:
        raise HttpRefused(r.status_code, r.text)
    return r


def http_send(method, url, token, **request):
    """``method`` ``url`` as a client presenting ``token``; a non-2xx is HttpRefused."""
    import httpx

    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    r = httpx.request(method, url, headers=headers, timeout=60, **request)
    if not 200 <= r.status_code < 300:
        raise HttpRefused(r.status_code, r.text)
    return r


def http_refusal(exc):
    return Refusal(None, exc.status, exc.text) if isinstance(exc, HttpRefused) else None


class HttpDoor:
    refusal = staticmethod(http_refusal)

    def __init__(self, url) -> None:
        self.url = url

    def _get(self, path, token):
        return http_get(f"{self.url}/zarr/{path}", token)

    def read(self, array_id, token):
        meta = self._get(f"{array_id}/0/.zarray", token).json()
        assert all(n <= c for n, c in zip(meta["shape"], meta["chunks"])), "door tests read one-chunk tensors"
        body = self._get(f"{array_id}/0/{'.'.join('0' * len(meta['shape']))}", token).content
        whole = np.frombuffer(body, dtype=np.dtype(meta["dtype"])).reshape(meta["chunks"])
        return whole[tuple(slice(0, n) for n in meta["shape"])]

    def listed(self, source_id, token):
        """The JSON catalog of the level naming the source (``/api/catalog``)."""
        doc = http_get(f"{self.url}/api/catalog?folder={source_id}", token).json()
        return [t["array_id"] for s in doc["sources"] if s["source_id"] == source_id for t in s["tensors"]]

    def control_calls(self, world):
        """The catalog page and JSON, making a link, and writes and reads of annotations."""
        unauthenticated, denied = errors.Unauthenticated, errors.PermissionDenied
        geojson = json.dumps({"type": "FeatureCollection", "features": []})
        request = functools.partial(http_send)
        return [
            ("the catalog page", functools.partial(request, "GET", f"{self.url}/"), unauthenticated),
            ("the catalog JSON", functools.partial(request, "GET", f"{self.url}/api/catalog"), unauthenticated),
            ("its source's listing", functools.partial(request, "GET", f"{self.url}/api/catalog?folder=img"), unauthenticated),
            ("making a link", functools.partial(request, "POST", f"{self.url}/api/share", json={"array_id": "img"}), denied),
            ("annotating its tensor (scope read)", functools.partial(request, "PUT", f"{self.url}/rois/img.geojson", content=geojson), denied),
            ("annotating another tensor", functools.partial(request, "PUT", f"{self.url}/rois/{world.ready}.geojson", content=geojson), denied),
            ("another tensor's annotations", functools.partial(request, "GET", f"{self.url}/rois/{world.ready}.geojson"), unauthenticated),
        ]  # fmt: skip

    stats = read_chunk = add_source = None  # verbs this door does not serve


class TestHttpDoor(DoorTests):
    def door_on(self, world):
        return HttpDoor(world.served.http_url)

    @pytest.fixture
    def door(self, world):
        return self.door_on(world)
