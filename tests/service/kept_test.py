"""Kept plans (``service/_kept.py``): a repeated plan request is answered without being derived
again, and never without its rules: the gate, the same tensor unchanged, the exact stale
check."""

from __future__ import annotations

import gc
import json
import os
import weakref

import numpy as np
import pyarrow.flight as flight
import pytest
import zarr
from biopb.tensor import descriptor_pb2

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.service._kept import MAX_KEY_BYTES, KeptAnswers
from tensor_server.testing import serving

TOKEN = "server-token-for-kept-answers"


def _plan_request(array_id: str, region: tuple | None = ((0, 0), (64, 64))) -> flight.FlightDescriptor:
    """A plan request as the SDK sends one (``region``: its slice, None the whole tensor)."""
    option = descriptor_pb2.TensorReadOption(array_id=array_id)
    if region is not None:
        option.slice_hint.start.extend(region[0])
        option.slice_hint.stop.extend(region[1])
    option.fields.paths.append("endpoints")
    request = descriptor_pb2.FlightRequest(tensor_read=option)
    return flight.FlightDescriptor.for_command(request.SerializeToString())


def _options(token: str | None) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())] if token else [])


def _tickets(info: flight.FlightInfo) -> list[bytes]:
    return [e.ticket.ticket for e in info.endpoints]


@pytest.fixture
def store(tmp_path, zarr_folder):
    """A zarr array of 2x2 chunks on disk (``zarr_folder``), served with a chunk cache."""
    root, cat = zarr_folder
    cache = CacheManager(tmp_path / "cache")
    yield root / "img.zarr", cat, cache, next(iter(cat.records())).source.tensor().array_id
    cache.close()


def _rewrite(chunk_file) -> None:
    """The chunk file written again in place (a new stamp, as a writer makes)."""
    chunk_file.write_bytes(chunk_file.read_bytes())
    st = os.stat(chunk_file)
    os.utime(chunk_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_kept_answers_are_bounded_in_number_and_key_length():
    kept = KeptAnswers(limit=2)
    tensor = ArrayAdapter(np.zeros((4, 4), np.uint8), "yx")
    for key in (b"a", b"b", b"c"):
        kept.keep(key, tensor, ("t", None), key.upper())
    assert kept.get(b"a") is None  # the least recently used went first
    assert [kept.get(k).answer for k in (b"b", b"c")] == [b"B", b"C"]
    kept.keep(b"x" * (MAX_KEY_BYTES + 1), tensor, ("t", None), b"long")
    assert kept.get(b"x" * (MAX_KEY_BYTES + 1)) is None and len(kept) == 2


def test_a_kept_answer_keeps_no_tensor_alive():
    kept = KeptAnswers()
    tensor = ArrayAdapter(np.zeros((4, 4), np.uint8), "yx")
    kept.keep(b"a", tensor, ("t", None), b"A")
    gone = weakref.ref(tensor)
    assert kept.get(b"a").made_from(tensor)
    del tensor
    gc.collect()
    assert gone() is None  # a reopened source's old tensor is not held by its kept answers
    assert not kept.get(b"a").made_from(ArrayAdapter(np.zeros((4, 4), np.uint8), "yx"))


def test_a_repeated_plan_is_the_kept_answer_and_describes_nothing(store, monkeypatch):
    _, cat, cache, aid = store
    with serving(cat, cache=cache) as srv:
        client = flight.FlightClient(srv.location)
        first = client.get_flight_info(_plan_request(aid))
        assert len(srv.runtime.kept) == 1

        def no_describe(*args, **kwargs):
            raise AssertionError("a repeated plan request was described again")

        monkeypatch.setattr(srv.runtime, "describe", no_describe)
        again = client.get_flight_info(_plan_request(aid))
        assert again.serialize() == first.serialize() and len(_tickets(again)) == 1
        client.close()


def test_a_kept_plan_is_made_again_when_a_chunk_file_under_it_changed(store):
    path, cat, cache, aid = store
    with serving(cat, cache=cache) as srv:
        client = flight.FlightClient(srv.location)
        first = client.get_flight_info(_plan_request(aid))
        _rewrite(path / "0.0")
        again = client.get_flight_info(_plan_request(aid))  # the exact stale check ran
        assert _tickets(again) != _tickets(first)  # ids of the new content version
        (got,) = client.do_get(flight.Ticket(_tickets(again)[0])).read_all().column("data").to_pylist()
        assert got  # the new plan's chunk is served, not refused as stale
        client.close()


def test_a_kept_plan_follows_a_tensor_that_grew(store):
    path, cat, cache, aid = store
    with serving(cat, cache=cache) as srv:
        client = flight.FlightClient(srv.location)
        whole = _plan_request(aid, None)
        first = descriptor_pb2.TensorDescriptor.FromString(client.get_flight_info(whole).descriptor.command)
        z = zarr.open_array(str(path), mode="r+")
        z.resize((192, 128))
        z[128:] = 7
        again = descriptor_pb2.TensorDescriptor.FromString(client.get_flight_info(whole).descriptor.command)
        assert list(first.shape) == [128, 128] and list(again.shape) == [192, 128]
        client.close()


def test_a_kept_plan_is_refused_to_a_caller_who_may_not_read_the_tensor(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.ones((64, 64), np.uint8), "yx"), source_id="slide"))
    cat.add_source(MemorySource(ArrayAdapter(np.zeros((64, 64), np.uint8), "yx"), source_id="other"))
    cat.first_scan_done.set()
    try:
        with serving(cat, token=TOKEN, shares_dir=str(tmp_path / "shares")) as srv:
            client = flight.FlightClient(srv.location)
            share = flight.Action("share", json.dumps({"array_id": "slide", "expires_seconds": 600}).encode())
            (made,) = [json.loads(r.body.to_pybytes()) for r in client.do_action(share, _options(TOKEN))]
            link = made["capability"]
            assert len(_tickets(client.get_flight_info(_plan_request("other"), _options(TOKEN)))) == 1
            assert len(srv.runtime.kept) == 1
            with pytest.raises(flight.FlightUnauthenticatedError):  # the same bytes: the gate still runs
                client.get_flight_info(_plan_request("other"), _options(link))
            assert len(_tickets(client.get_flight_info(_plan_request("slide"), _options(link)))) == 1
            client.close()
    finally:
        cat.close()
