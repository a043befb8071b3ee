"""A plate image (``<source>/plate``, ``core/montage.py``) served from a root that is not a local
folder: an OME-Zarr plate in a bucket (moto's S3 on loopback) is laid out with the server's
montage gap, as a local one is; a plate proxied from an upstream server (``grpc://``) keeps its
published layout (``montage``) on the tensor and in its descriptor, and only there."""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager

import numpy as np
import pytest

import tensor_server
from tensor_server.bench.writers import write_plate
from tensor_server.catalog import Catalog
from tensor_server.testing import serving
from tests.remote.conftest import BUCKET, s3fs_client

pytest.importorskip("ome_zarr")

#: two wells of one 2 × 32 × 40 field each, a stored level at 2, on a 2 × 2 plate
WELLS = {"A/1": [(32, 40)], "B/2": [(32, 40)]}


def _plate(path):
    rng = np.random.default_rng(3)
    return write_plate(
        path,
        ["A", "B"],
        ["1", "2"],
        WELLS,
        lambda well, index, shape: rng.integers(1, 60000, shape, dtype=np.uint16),
        scale_factors=(2,),
        chunks=(1, 16, 16),
    )


def test_a_plate_in_a_bucket_takes_the_servers_gap(s3_data, tmp_path):
    """``montage_gap=0.5``: the bucket's plate has the layout (gap included) of the same plate
    opened locally with that gap, not the default's."""
    local = _plate(tmp_path / "screen.ome.zarr")
    fs = s3fs_client()
    fs.put(str(local), f"{BUCKET}/plates/screen.ome.zarr", recursive=True)
    with tensor_server.open(local, montage_gap=0.5) as src:
        wide = src.tensor("plate").metadata["montage"]
    with tensor_server.open(local) as src:
        default = src.tensor("plate").metadata["montage"]
    assert wide["gap"] == [20, 20] and default["gap"] == [4, 4]  # half of the 40-px cell; 1/16, rounded up to 2s
    cat = Catalog([f"s3://{BUCKET}/plates"], montage_gap=0.5)
    try:
        assert cat.scan()["unresolved"] == 0
        (rec,) = cat.records()
        plate = rec.source.tensor("plate")
        assert plate.metadata["montage"] == wide
        with tensor_server.open(local, montage_gap=0.5) as src:
            np.testing.assert_array_equal(plate.get_data(), src.tensor("plate").get_data())
    finally:
        cat.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _served(roots, **options):
    cat = Catalog(roots)
    cat.scan()
    try:
        with serving(cat, **options) as srv:
            yield cat, srv
    finally:
        cat.close()


def test_a_proxied_plate_keeps_its_layout(tmp_path):
    """Through a ``grpc://`` root the plate image carries the upstream's ``montage`` (the
    catalog page lists it as a plate), its descriptor publishes it, a field's does not, and
    its pixels are the upstream's."""
    root = tmp_path / "up"
    root.mkdir()
    _plate(root / "screen.ome.zarr")
    port = _free_port()
    with _served([root], port=port) as (up_cat, _up), _served([f"grpc://127.0.0.1:{port}"]) as (cat, srv):
        (up_rec,) = up_cat.records()
        layout = up_rec.source.tensor("plate").metadata["montage"]
        (rec,) = cat.records()
        plate = rec.source.tensor("plate")
        assert plate.metadata["montage"] == layout and len(layout["wells"]) == 2
        client = srv.client()
        described = json.loads(client.get_descriptor(plate.array_id, with_metadata=True).metadata_json)
        assert described["metadata"]["montage"] == layout
        field = json.loads(client.get_descriptor(f"{rec.source_id}/A/1/0", with_metadata=True).metadata_json)
        assert "montage" not in field["metadata"] and field["metadata"]["layout"] == "plate"
        np.testing.assert_array_equal(
            np.asarray(client.get_array(plate.array_id)), up_rec.source.tensor("plate").get_data()
        )
