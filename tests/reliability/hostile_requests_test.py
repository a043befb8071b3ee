"""Requests a hostile or broken client sends: every one gets a clean error code (never
INTERNAL), bounded work and a bounded message, and the server keeps serving correct pixels.

Covers issue 12's request findings: huge scales, chunk ids forged with a whole-tensor extent,
``Infinity`` and 100k-deep JSON in ids, megabyte ids echoed back, garbage ``chunk_locate``
bodies, a 1 TiB sparse file planned whole; plus a hypothesis fuzz of TensorReadOption and
chunk ids asserting "clean error code, server alive, next read correct".
"""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import descriptor_pb2, ticket_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.cache import CacheManager
from tensor_server.catalog import Catalog
from tensor_server.core import plan_read
from tensor_server.testing import serving

CLEAN_CODES = {"INVALID_ARGUMENT", "NOT_FOUND"}
ARR = np.random.default_rng(5).integers(0, 60000, (300, 500), dtype=np.uint16)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    # a 1 TiB MRC that is all holes: planning it whole must be refused, not minted
    _write_sparse_mrc(root / "huge.mrc", nx=1 << 16, ny=1 << 16, nz=256)
    cat = Catalog([root])
    cat.scan()
    cat.add_source(MemorySource(ArrayAdapter(ARR, chunk_shape=(128, 128)), source_id="img"))
    cache = CacheManager(tmp_path_factory.mktemp("cache"))
    with serving(cat, cache=cache) as srv:
        yield srv
    cache.close()
    cat.close()


def _write_sparse_mrc(path, nx, ny, nz):
    header = np.zeros(256, dtype="<i4")
    header[0:3] = (nx, ny, nz)
    header[3] = 0  # mode 0: int8
    header[7:10] = (nx, ny, nz)  # mx, my, mz
    cell = np.array([nx, ny, nz], dtype="<f4")
    raw = bytearray(header.tobytes())
    raw[40:52] = cell.tobytes()
    raw[64:76] = np.array([1, 2, 3], dtype="<i4").tobytes()  # mapc, mapr, maps
    raw[208:212] = b"MAP "
    raw[212:216] = bytes([0x44, 0x44, 0, 0])  # little-endian machine stamp
    with open(path, "wb") as f:
        f.write(raw)
        f.truncate(1024 + nx * ny * nz)


def _info(client, option):
    req = descriptor_pb2.FlightRequest(tensor_read=option)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def _code(exc: flight.FlightError) -> str:
    return json.loads(exc.extra_info or b"{}").get("code", "?")


def _chunk(client, raw: bytes):
    ticket = ticket_pb2.TensorTicket(chunk_id=raw).SerializeToString()
    return client.do_get(flight.Ticket(ticket)).read_all()


def _assert_alive_and_correct(server):
    from biopb.tensor import TensorFlightClient

    sdk = TensorFlightClient(server.location)
    np.testing.assert_array_equal(sdk.get_array("img", slice_hint=(slice(10, 140), slice(0, 260))), ARR[10:140, :260])


def _refused(call) -> flight.FlightError:
    with pytest.raises(flight.FlightError) as info:
        call()
    assert _code(info.value) in CLEAN_CODES, f"{type(info.value).__name__}: {info.value}"
    assert len(str(info.value)) < 4096, "an error never echoes a client's payload back whole"
    return info.value


def test_huge_scales_are_invalid_argument(served):
    c = flight.FlightClient(served.location)
    for scale in ([1 << 20, 1 << 20], [1, 1 << 28], [1 << 62, 1]):
        opt = descriptor_pb2.TensorReadOption(array_id="img", scale_hint=scale, reduction_method="area")
        opt.fields.paths.append("endpoints")
        err = _refused(lambda opt=opt: _info(c, opt))
        assert "exceeds the axis extent" in str(err)
    _assert_alive_and_correct(served)


def test_forged_and_malformed_chunk_ids(served):
    c = flight.FlightClient(served.location)
    tensor, _ = served.runtime.catalog.find_tensor("img")
    real = plan_read(tensor).chunks[0].chunk_id
    whole = dataclasses.replace(real, start=(0, 0), stop=ARR.shape)
    assert "larger than one chunk" in str(_refused(lambda: _chunk(c, whole.encode())))

    def forge(body: bytes) -> bytes:
        return b"tsc\x01" + zlib.crc32(body).to_bytes(4, "little") + body

    infinite = json.dumps(
        {"a": "img", "s": [0, 0], "e": [1e999, 1], "k": [1, 1], "m": "none", "v": real.content_version.hex(), "p": 1}
    ).encode()
    for raw in (forge(infinite), forge(b"[" * 100_000 + b"]" * 100_000), forge(b"null"), b"\x00" * (1 << 20)):
        _refused(lambda raw=raw: _chunk(c, raw))
    _assert_alive_and_correct(served)


def test_garbage_chunk_locate_body_is_invalid_argument(served):
    c = flight.FlightClient(served.location)
    _refused(lambda: list(c.do_action(flight.Action("chunk_locate", b"\xff\x00garbage"))))
    _assert_alive_and_correct(served)


def test_a_terabyte_sparse_file_is_not_planned_whole(served):
    from biopb.tensor import TensorFlightClient

    huge = next(r.source_id for r in served.runtime.catalog.records() if r.source_id.startswith("huge"))
    c = flight.FlightClient(served.location)
    opt = descriptor_pb2.TensorReadOption(array_id=huge)
    opt.fields.paths.append("endpoints")
    assert "ask for a region or a coarser scale" in str(_refused(lambda: _info(c, opt)))
    # a region of it is fine, and reads holes as zeros
    sdk = TensorFlightClient(served.location)
    got = sdk.get_array(huge, slice_hint=(slice(0, 1), slice(0, 64), slice(1000, 1100)))
    assert got.shape == (1, 64, 100) and not got.any()


_SCALES = st.lists(st.one_of(st.integers(-3, 5), st.integers(1 << 20, 1 << 62)), min_size=0, max_size=3)
_STARTS = st.lists(st.integers(-10, 1 << 40), max_size=3)
_METHODS = st.sampled_from(["", "area", "nearest", "mode", "bicubic", "precompute", "MAX", "\x00", "a" * 300])
_IDS = st.sampled_from(["img", "img/", "nope", "", "img/zzz", "../etc/passwd", "x" * 5000])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(array_id=_IDS, scale=_SCALES, start=_STARTS, stop=_STARTS, method=_METHODS)
def test_fuzzed_read_options_get_clean_errors(served, array_id, scale, start, stop, method):
    c = flight.FlightClient(served.location)
    opt = descriptor_pb2.TensorReadOption(array_id=array_id, scale_hint=scale, reduction_method=method)
    if start or stop:
        opt.slice_hint.start.extend(start)
        opt.slice_hint.stop.extend(stop)
    opt.fields.paths.append("endpoints")
    try:
        info = _info(c, opt)
    except flight.FlightError as exc:
        assert _code(exc) in CLEAN_CODES, f"{exc}"
        return
    assert len(info.endpoints) <= 65_536
    first = info.endpoints[0].ticket
    table = c.do_get(first).read_all()
    assert table.num_rows == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_chunk_ids_get_clean_errors_or_correct_pixels(served, data):
    c = flight.FlightClient(served.location)
    tensor, _ = served.runtime.catalog.find_tensor("img")
    real = data.draw(st.sampled_from(plan_read(tensor, None, (2, 2), "area").chunks)).chunk_id.encode()
    pos = data.draw(st.integers(0, len(real) - 1))
    byte = data.draw(st.integers(0, 255))
    mutated = real[:pos] + bytes([byte]) + real[pos + 1 :]
    try:
        table = _chunk(c, mutated)
    except flight.FlightError as exc:
        assert _code(exc) in CLEAN_CODES, f"{exc}"
        return
    assert mutated == real or table.num_rows == 1  # a mutation the checksum cannot see is a valid id
    _assert_alive_and_correct(served)
