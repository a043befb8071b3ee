"""Every HTTP read of a ``serve --workers 2`` server answers the same on every process: a private
upload (read by its grant holder only, on each), a source added from a URL, annotations (the
primary's store, forwarded to it) and share links (a revocation refuses on each at once). Each
process is reached on purpose (``_on``: the kernel's socket table says which accepted a
connection), never by timing; what is gone is a 404 on every one."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.cli_workers_test import Served, _chunk_bytes, _on

pytestmark = pytest.mark.slow

GRANT = "alice-read-grant"


def _get(served: Served, pid: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    """(status, body) of ``GET path`` answered by the process ``pid``."""
    conn = _on(served, pid)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def _pids(served: Served) -> list[int]:
    pids = [served.proc.pid, *served.workers()]
    assert len(pids) == 2
    return pids


def _gone_everywhere(served: Served, paths: list[str], token: str | None = None) -> dict[int, bool]:
    """Whether each process answers 404 to every path (a worker looks at the manifest every second)."""
    gone = {pid: False for pid in _pids(served)}
    deadline = time.monotonic() + 30
    while not all(gone.values()) and time.monotonic() < deadline:
        for pid in gone:
            gone[pid] = all(_get(served, pid, p, token)[0] == 404 for p in paths)
    return gone


def _private_upload(write_dir, data: np.ndarray) -> str:
    """A READY upload granted to ``GRANT`` and owned by it, made in the write dir as an
    in-process producer makes one (the wire has no private option); the server adopts it."""
    from tensor_server.catalog import Catalog
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.chunk_id import ChunkId
    from tensor_server.service.access import grant_digest
    from tensor_server.uploads import UploadManager

    catalog = Catalog([])
    manager = UploadManager(catalog, write_dir)
    try:
        digest = grant_digest(GRANT)
        up = manager.add_tensor(
            "zarr://scratch/@fields/granted", data.shape, data.dtype, chunk_shape=data.shape, owner=digest, grant=digest
        )
        cid = ChunkId.for_extent(up.array_id, Bounds((0, 0), data.shape), (1, 1), "none", up.tensor.content_version)
        manager.write_chunk(cid, data)
        manager.set_ready(up.array_id)
        return up.array_id
    finally:
        manager.close()
        catalog.close()


def test_a_private_upload_is_read_by_its_grant_holder_on_every_process(tmp_path):
    from biopb.tensor import TensorFlightClient

    data = np.random.default_rng(7).integers(0, 65535, (80, 90), dtype=np.uint16)
    array_id = _private_upload(tmp_path / "write", data)
    served = Served(tmp_path, extra=("--write-dir", str(tmp_path / "write"), "--writable"))
    try:
        for pid in _pids(served):
            status, body = _get(served, pid, f"/zarr/{array_id}/0/.zarray", GRANT)
            assert status == 200, (pid, body)
            zarray = json.loads(body)
            status, body = _get(served, pid, f"/zarr/{array_id}/0/0.0", GRANT)
            assert status == 200 and body == _chunk_bytes(data, zarray), (pid, status)
            for stranger in (None, "bob"):
                status, body = _get(served, pid, f"/zarr/{array_id}/0/0.0", stranger)
                assert status == 401 and b"read with its capability token" in body, (pid, stranger, body)
        client = TensorFlightClient(served.location, token=GRANT)  # its owner discards it
        client.set_upload_status(array_id, "DISCARDED")
        gone = _gone_everywhere(served, [f"/zarr/{array_id}/0/.zarray"], GRANT)
        assert all(gone.values()), gone
    finally:
        assert served.stop() == 0


def test_a_source_added_from_a_url_is_served_by_every_process(tmp_path):
    """The URL as given travels in the manifest, which only this user may read (0600)."""
    import stat

    from biopb.tensor import TensorFlightClient

    from tensor_server.testing.range_host import range_host
    from tests.remote.conftest import write_ome_zarr

    (tmp_path / "host").mkdir()
    image = write_ome_zarr(tmp_path / "host" / "cells.ome.zarr")["image"]
    config = tmp_path / "server.toml"
    config.write_text('[remote]\nallowed_hosts = ["127.0.0.1"]\n')
    with range_host(tmp_path / "host") as host:
        served = Served(tmp_path, extra=("--config", str(config)))
        try:
            url = f"{host.url}/cells.ome.zarr"
            client = TensorFlightClient(served.location)
            (sid,) = client.register_local_path(url).added
            manifest = next((tmp_path / "home").rglob("workers-catalog-*.json"))
            assert stat.S_IMODE(manifest.stat().st_mode) == 0o600 and url in manifest.read_text()
            array_id = f"{sid}/image"
            for pid in _pids(served):
                status, body = _get(served, pid, f"/zarr/{array_id}/0/.zarray")
                assert status == 200, (pid, body)
                zarray = json.loads(body)
                assert zarray["shape"] == list(image.shape)
                status, body = _get(served, pid, f"/zarr/{array_id}/0/0.0.0")
                assert status == 200 and body == _chunk_bytes(image, zarray), (pid, status)
            assert list(client.deregister_local_path(url).removed) == [sid]
            gone = _gone_everywhere(served, [f"/zarr/{array_id}/0/.zarray"])
            assert all(gone.values()), gone
        finally:
            assert served.stop() == 0


def _request(served: Served, pid: int, method: str, path: str, body: bytes | None = None, token: str | None = None):
    """(status, headers, body) of a request answered through the process ``pid``'s door."""
    conn = _on(served, pid)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}"} if token else {})
    response = conn.getresponse()
    answer = response.status, dict(response.getheaders()), response.read()
    conn.close()
    return answer


def test_annotations_answer_the_same_on_every_process(tmp_path):
    """The primary's annotation store answers through every process (a worker forwards the
    request as it came: the token decides there as on the primary): an import through a
    worker is read the same by all, a caller without the token is refused by all."""
    token = "server-token-for-workers"
    served = Served(tmp_path, extra=("--token", token))
    try:
        primary, worker = _pids(served)
        ring = [[10, 10], [50, 10], [50, 40], [10, 40], [10, 10]]
        square = {
            "type": "Feature",
            "id": "a",
            "geometry": {"type": "Polygon", "coordinates": [ring]},
            "properties": {},
        }
        doc = json.dumps({"type": "FeatureCollection", "features": [square]}).encode()
        path = f"/rois/{served.array_id}.geojson"
        status, _, body = _request(served, worker, "PUT", path, doc, token)
        assert status == 200 and json.loads(body)["roi_ids"] == ["a"], body
        answers = {pid: _request(served, pid, "GET", path, token=token) for pid in (primary, worker)}
        statuses = {pid: a[0] for pid, a in answers.items()}
        assert statuses == {primary: 200, worker: 200}
        assert answers[primary][2] == answers[worker][2]  # the same bytes
        assert answers[worker][1]["content-type"].startswith("application/geo+json")
        (feature,) = json.loads(answers[worker][2])["features"]
        assert feature["id"] == "a" and feature["geometry"]["coordinates"] == [ring]
        for pid in (primary, worker):
            assert _request(served, pid, "GET", path)[0] == 401
            status, headers, _ = _request(served, pid, "HEAD", path, token=token)
            assert status == 200 and int(headers["content-length"]) == len(answers[primary][2])
        # annotations outlive their tensor (rows of an unseen source are pruned, not dropped):
        # an id no source serves answers alike, an empty collection, wherever it is asked
        unknown = {pid: _request(served, pid, "GET", "/rois/gone.geojson", token=token) for pid in (primary, worker)}
        assert unknown[primary][0] == unknown[worker][0] == 200
        assert json.loads(unknown[worker][2])["features"] == [] and unknown[primary][2] == unknown[worker][2]
    finally:
        assert served.stop() == 0


def _action(served: Served, name: str, doc: dict) -> dict:
    import pyarrow.flight as flight

    client = flight.FlightClient(served.location)
    try:
        return json.loads(next(iter(client.do_action(flight.Action(name, json.dumps(doc).encode())))).body.to_pybytes())
    finally:
        client.close()


def test_share_links_made_anywhere_are_read_everywhere_and_a_revocation_refuses_everywhere_at_once(served_pair):
    served = served_pair
    primary, worker = _pids(served)
    chunk = f"/zarr/{served.array_id}/0/0.0"
    expected = _get(served, primary, chunk)[1]
    made = {"primary": _action(served, "share", {"array_id": served.array_id})}
    status, _, body = _request(served, worker, "POST", "/api/share", json.dumps({"array_id": served.array_id}).encode())
    assert status == 200, body
    made["worker"] = json.loads(body)  # the catalog page's button, answered by a worker
    for link in made.values():
        for pid in (primary, worker):
            assert _get(served, pid, f"/s/{link['capability']}{chunk}") == (200, expected)
            assert _get(served, pid, f"/s/{link['capability']}/zarr/other/0/0.0")[0] == 401  # its tensor only
    _action(served, "share_revoke", {"id": made["worker"]["id"]})  # then at once, no waiting:
    for pid in (primary, worker):
        status, body = _get(served, pid, f"/s/{made['worker']['capability']}{chunk}")
        assert status == 401 and b"was revoked" in body, (pid, body)
        assert _get(served, pid, f"/s/{made['primary']['capability']}{chunk}") == (200, expected)


@pytest.fixture
def served_pair(tmp_path):
    server = Served(tmp_path)
    yield server
    assert server.stop() == 0
