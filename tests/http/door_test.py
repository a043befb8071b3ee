"""The door conformance suite through the HTTP door: a real HTTP client (httpx) reading the
virtual OME-Zarr view as any zarr client does (level 0's ``.zarray``, then its chunk)."""

from __future__ import annotations

import numpy as np
import pytest

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

    stats = read_chunk = add_source = None  # verbs this door does not serve


class TestHttpDoor(DoorTests):
    @pytest.fixture
    def door(self, world):
        return HttpDoor(world.served.http_url)
