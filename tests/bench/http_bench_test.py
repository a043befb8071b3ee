"""The ``http`` bench's in-process server: each chunk path it times answers the chunk's bytes
over HTTP and its ticket the same pixels over Flight (the bench once crashed before timing
anything, on a renamed attribute, with no test to say so)."""

from __future__ import annotations

import http.client
import tempfile

import numpy as np
import pyarrow.flight as flight
import zarr

from tensor_server.bench.http import _level_reads, _Served


def test_the_bench_server_answers_every_chunk_it_times_on_both_transports(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    plane = (np.arange(1024 * 1024, dtype=np.uint32) % 65521).astype(np.uint16).reshape(1024, 1024)
    zarr.create_array(str(tmp_path / "p.zarr"), data=plane, chunks=(512, 512))
    served = _Served(tmp_path / "p.zarr")
    try:
        array_id = served.runtime.catalog.records()[0].source_id
        paths, tickets, nbytes, level = _level_reads(served, array_id, 1)  # a computed level
        assert len(paths) == len(tickets) == len(nbytes) >= 1
        assert sum(nbytes) == 512 * 512 * 2
        conn = http.client.HTTPConnection("127.0.0.1", served.http.port, timeout=60)
        conn.request("GET", paths[0])
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200 and len(body) >= nbytes[0]
        table = flight.FlightClient(served.server.location).do_get(tickets[0]).read_all()
        assert table.num_rows >= 1
    finally:
        served.close()
    assert not list(scratch.iterdir()), "the bench left its cache folder behind"
