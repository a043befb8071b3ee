"""A viewer request runs the read rules once, however many chunks its image spans: the viewer
doors call the runtime with the caller as an argument (``service/viewer_verbs.py``), and the
chunks under a tile are read from the tensor that one check gated (``ServingRuntime.chunk_of``),
not looked up and judged again each (issue 39: 1 + k checks for a tile of k chunks before).
The OME-Zarr view's chunk requests likewise: one check, one chunk."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tests.http.conftest import http_serving
from tests.http.door_test import http_get
from tests.viewers.conftest import memory_catalog


def _counting(runtime, counts: Counter) -> None:
    for name in ("authorize", "chunk_of"):
        real = getattr(runtime, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(runtime, name, wrapper)


@pytest.mark.parametrize(
    "path, chunks",
    [
        ("/iiif/3/plane/256,256,512,512/512,/0/default.png", 16),  # a 512² tile of 128² chunks
        ("/deepzoom/plane_files/10/1_1.png", 9),  # pixels 253-509 (254 and 1 px overlaps): 3 x 3 chunks
        ("/zarr/plane/0/1.1", 1),  # one chunk of the OME-Zarr view
    ],
)
def test_a_viewer_request_checks_the_read_rules_once(tmp_path, path, chunks):
    image = np.random.default_rng(3).integers(0, 4000, (1024, 1024), np.uint16)
    catalog = memory_catalog(plane=ArrayAdapter(image, "yx", chunk_shape=(128, 128)))
    with http_serving(catalog, tmp_path) as (served, http):
        runtime = served.runtime
        http_get(http.url + path, None)  # warm: settings measured, chunks cached
        counts: Counter = Counter()
        _counting(runtime, counts)
        response = http_get(http.url + path, None)
    assert response.status_code == 200, response.text
    assert counts == {"authorize": 1, "chunk_of": chunks}
