from __future__ import annotations

import pytest

from tensor_server.core import Bounds, ChunkId
from tensor_server.core.chunk_id import SERVING_EPOCH
from tensor_server.errors import InvalidChunkId


def make(**kw):
    base = dict(
        array_id="src-1a2b/img", start=(0, 4), stop=(8, 12), scale=(2, 2), method="area", content_version=b"\x01\x02"
    )
    base.update(kw)
    return ChunkId(**base)


def test_round_trip():
    cid = make()
    raw = cid.encode()
    assert isinstance(raw, bytes)
    back = ChunkId.decode(raw)
    assert back == cid
    assert back.bounds == Bounds((0, 4), (8, 12))
    assert back.output_shape == (4, 4)
    assert back.epoch == SERVING_EPOCH


@pytest.mark.parametrize(
    "change",
    [
        dict(array_id="src-1a2b/other"),
        dict(start=(0, 0)),
        dict(stop=(8, 13)),
        dict(scale=(2, 4)),
        dict(method="nearest"),
        dict(content_version=b"\x01\x03"),
        dict(epoch=SERVING_EPOCH + 1),
    ],
)
def test_every_field_changes_the_id(change):
    assert make(**change).encode() != make().encode()


def test_unscaled_normalises_method():
    cid = make(scale=(1, 1), method="area")
    assert cid.method == "none" and not cid.is_scaled
    assert make(scale=(1, 1), method="nearest").encode() == cid.encode()


@pytest.mark.parametrize(
    "raw, match",
    [(b"", "magic"), (b"garbage-bytes-here", "magic"), (b"tsc\x01\x00\x00\x00\x00{}", "checksum")],
)
def test_malformed_raise(raw, match):
    with pytest.raises(InvalidChunkId, match=match):
        ChunkId.decode(raw)


def test_bit_flip_is_detected():
    raw = bytearray(make().encode())
    raw[20] ^= 0x01
    with pytest.raises(InvalidChunkId):
        ChunkId.decode(bytes(raw))


def test_well_formed_but_invalid_body():
    import json
    import zlib

    def forge(body: dict) -> bytes:
        b = json.dumps(body).encode()
        return b"tsc\x01" + zlib.crc32(b).to_bytes(4, "little") + b

    good = dict(a="x", s=[0], e=[4], k=[2], m="area", v="00", p=1)
    assert ChunkId.decode(forge(good)).array_id == "x"
    for bad, match in [
        (dict(good, k=[0]), "non-positive"),
        (dict(good, e=[0]), "empty"),
        (dict(good, m="bogus"), "unknown method"),
        ({"a": "x"}, "malformed"),
        (dict(good, v="zz"), "malformed"),
    ]:
        with pytest.raises(InvalidChunkId, match=match):
            ChunkId.decode(forge(bad))


def test_decoding_keeps_minted_ids_but_no_refusal_and_no_made_up_size():
    from tensor_server.core import chunk_id as chunk_id_module

    raw = make(start=(2, 4)).encode()
    assert ChunkId.decode(raw) is ChunkId.decode(bytearray(raw)), "a minted id is parsed once"
    corrupt = raw[:-2] + b"0}"
    for _ in range(2):  # refused every time, not remembered as an answer
        with pytest.raises(InvalidChunkId, match="checksum"):
            ChunkId.decode(corrupt)
    long_id = make(array_id="a" * chunk_id_module.REMEMBERED_ID_BYTES).encode()
    assert ChunkId.decode(long_id) == ChunkId.decode(long_id)
    assert ChunkId.decode(long_id) is not ChunkId.decode(long_id), "an id longer than any minted one is not kept"
