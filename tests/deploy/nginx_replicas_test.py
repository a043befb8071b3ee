"""Three real ``serve --read-only`` replicas of one root behind Debian's nginx, configured by
``nginx-config`` (docs/deploying.md), all on loopback: tiles, chunks and SDK reads through nginx
are the bytes a replica gives directly; one tile URL is served by one replica only (each
replica's ``server_stats`` counts it); with one replica killed (SIGKILL) every request still
succeeds. One test, so the steps run in order on one set of processes whatever pytest-xdist
does; each process start waits on a probe with a deadline."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest
import tifffile

from tensor_server.deploy.nginx_process import nginx_binary, running_nginx
from tests.reliability.server_process import ServerProcess, serve_process

pytestmark = pytest.mark.slow

TOKEN = "replica-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Replica:
    server: ServerProcess
    http: str  # http://127.0.0.1:PORT

    def stats(self) -> dict:
        client = flight.FlightClient(self.server.location)
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        try:
            (result,) = client.do_action(flight.Action("server_stats", b""), options=options)
        finally:
            client.close()
        return json.loads(result.body.to_pybytes())

    def iiif_images(self) -> int:
        return self.stats()["calls"].get("http", {}).get("iiif_image", 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _nginx(tmp_path, replicas: list[Replica]):
    """nginx with the configuration ``nginx-config`` prints, its pid, logs and temporary files
    under ``tmp_path``/nginx; yields (its HTTP URL, its gRPC location)."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (make test installs Debian's nginx with apt; see the Makefile)")
    http_port, grpc_port = _free_port(), _free_port()
    made = subprocess.run(
        [sys.executable, "-m", "tensor_server", "nginx-config"]
        + ["--http", ",".join(r.http.removeprefix("http://") for r in replicas)]
        + ["--flight", ",".join(r.server.location.removeprefix("grpc://") for r in replicas)]
        + ["--listen-http", f"127.0.0.1:{http_port}", "--listen-flight", f"127.0.0.1:{grpc_port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    with running_nginx(made.stdout, tmp_path / "nginx", [http_port, grpc_port]):
        yield f"http://127.0.0.1:{http_port}", f"grpc://127.0.0.1:{grpc_port}"


def _replicas(stack: ExitStack, tmp_path, root, count: int) -> list[Replica]:
    """``count`` replicas of ``root`` on free loopback ports, each with its own cache, stopped
    with ``stack``."""
    out = []
    for i in range(count):
        server = stack.enter_context(
            serve_process(
                [root],
                tmp_path / f"cache-{i}",
                extra_args=["--http-port", "0", "--read-only", "--token", TOKEN, "--request-log", "off"],
            )
        )
        found = re.search(r"OME-Zarr over HTTP at (http://127\.0\.0\.1:\d+)/", server.stderr)
        assert found, server.stderr
        out.append(Replica(server, found.group(1)))
    return out


def _get(url: str, **headers: str) -> bytes:
    reply = httpx.get(url, headers=headers, timeout=120)
    assert reply.status_code == 200, (url, reply.status_code, reply.text[:300])
    return reply.content


def _sdk_client(location: str):
    from biopb.tensor import TensorFlightClient

    return TensorFlightClient(location, token=TOKEN, cache_bytes=0)  # every read over the wire


def _sdk_read(location: str, array_id: str, client=None) -> np.ndarray:
    """A region through a new SDK connection (or ``client``'s)."""
    reader = client or _sdk_client(location)
    try:
        return np.asarray(reader.get_array(array_id)[100:900, 37:1000])
    finally:
        if client is None:
            reader.close()


def test_replicas_behind_nginx_serve_the_same_bytes_and_survive_a_killed_one(tmp_path, monkeypatch):
    image = np.random.default_rng(7).integers(0, 60000, (1024, 1024), dtype=np.uint16)
    (tmp_path / "data").mkdir()
    tifffile.imwrite(tmp_path / "data" / "img.ome.tif", image, ome=True, tile=(256, 256), metadata={"axes": "YX"})
    with ExitStack() as stack:
        replicas = _replicas(stack, tmp_path, tmp_path / "data", 3)
        front, front_grpc = stack.enter_context(_nginx(tmp_path, replicas))
        array_id = _array_id(replicas[0].server.location)
        paths = [
            f"/iiif/3/{array_id}/0,0,512,512/256,/0/default.jpg",
            f"/iiif/3/{array_id}/full/128,/0/default.png",
            f"/zarr/{array_id}/0/0.0",
            f"/zarr/{array_id}/1/0.0",
            f"/zarr/{array_id}/.zattrs",
        ]
        direct = {p: _get(replicas[1].http + p, **AUTH) for p in paths}
        assert np.frombuffer(direct[f"/zarr/{array_id}/0/0.0"], "<u2").reshape(1024, 1024).tolist() == image.tolist()
        for p in paths:  # the header form and the /t/<token>/ form
            assert _get(front + p, **AUTH) == direct[p], p
            assert _get(f"{front}/t/{TOKEN}{p}") == direct[p], p

        _headers_pass_through(front, array_id, direct[f"/zarr/{array_id}/0/0.0"])

        expected = image[100:900, 37:1000]
        assert np.array_equal(_sdk_read(replicas[2].server.location, array_id), expected)
        assert np.array_equal(_sdk_read(front_grpc, array_id), expected)  # the localhost fast path: mmap
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")  # the pixels in DoGet streams, as off-host
        assert np.array_equal(_sdk_read(front_grpc, array_id), expected)

        tile = f"/iiif/3/{array_id}/512,512,512,512/128,/0/default.jpg"
        owner = _the_one_replica_serving(replicas, lambda: [_get(front + tile, **AUTH) for _ in range(3)])
        assert _the_one_replica_serving(replicas, lambda: [_get(f"{front}/t/{TOKEN}{tile}") for _ in range(3)]) == owner
        want = _get(replicas[owner].http + tile, **AUTH)
        held = _sdk_client(front_grpc)  # a connection open across the kill
        stack.callback(held.close)
        assert np.array_equal(_sdk_read(front_grpc, array_id, held), expected)

        replicas[owner].server.proc.kill()
        replicas[owner].server.proc.wait(timeout=30)
        for _ in range(4):
            assert _get(front + tile, **AUTH) == want
            for p in paths:
                assert _get(front + p, **AUTH) == direct[p], p
            assert np.array_equal(_sdk_read(front_grpc, array_id), expected)
            assert np.array_equal(_sdk_read(front_grpc, array_id, held), expected)
        httpx.get(f"{front}/t/{TOKEN}?token={TOKEN}")  # no path after the token: still not logged
        log = (tmp_path / "nginx" / "access.log").read_text()
        dead = replicas[owner].http.removeprefix("http://")
        assert TOKEN not in log
        assert "FlightService/DoGet 200" in log  # the pixels went through nginx
        assert re.search(rf"GET {re.escape(tile)} 200 \d+ upstream={dead}, [\d.:]+ upstream_status=502, 200", log), log


def _headers_pass_through(front: str, array_id: str, chunk: bytes) -> None:
    """Range and If-None-Match reach the replica and its answers come back; so does the
    client's Host: a foreign one is refused by the replica's rebinding guard, and the URLs a
    replica writes name nginx."""
    url = f"{front}/zarr/{array_id}/0/0.0"
    part = httpx.get(url, headers={**AUTH, "Range": "bytes=10-19"})
    assert (part.status_code, part.content) == (206, chunk[10:20])
    assert httpx.get(url, headers={**AUTH, "If-None-Match": part.headers["etag"]}).status_code == 304
    foreign = httpx.get(url, headers={**AUTH, "Host": "tiles.example.org"})
    assert foreign.status_code == 403 and "not a name this server answers to" in foreign.text
    info = httpx.get(f"{front}/iiif/3/{array_id}/info.json", headers=AUTH).json()
    assert info["id"].startswith(f"{front}/")


def _array_id(location: str) -> str:
    client = _sdk_client(location)
    try:
        rows = client.query("SELECT unnest(tensors).array_id AS array_id FROM sources", format="records")
    finally:
        client.close()
    (row,) = rows
    return row["array_id"]


def _the_one_replica_serving(replicas: list[Replica], requests) -> int:
    """Run ``requests`` (three reads of one tile URL through nginx); the index of the replica
    whose ``server_stats`` counted all three, the others none."""
    before = [r.iiif_images() for r in replicas]
    requests()
    served = [r.iiif_images() - b for r, b in zip(replicas, before, strict=True)]
    assert sorted(served) == [0, 0, 3], served
    return served.index(3)
