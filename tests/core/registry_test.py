from __future__ import annotations

import numpy as np
import pytest

import tensor_server
from tensor_server.adapters.registry import FormatEntry, detect_format, register_format
from tensor_server.errors import UnknownFormat, UnreadableSource


def test_open_npy_by_content(tmp_path):
    arr = np.arange(24, dtype=">u2").reshape(2, 3, 4)  # big-endian on disk
    p = tmp_path / "volume.dat"  # misnamed: detected by magic bytes
    np.save(p.with_suffix(".npy"), arr)
    p.with_suffix(".npy").rename(p)
    src = tensor_server.open(p)
    t = src.tensor()
    assert src.type == "npy" and t.array_id == src.source_id and "/" not in src.source_id
    assert t.dtype == np.dtype("=u2") and t.shape == (2, 3, 4)
    np.testing.assert_array_equal(t.get_data(), arr)
    assert t.get_data().dtype.byteorder in ("=", "<")
    assert tensor_server.open(p).source_id == src.source_id  # stable


def test_content_version_follows_the_file(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((4, 4), np.uint8))
    v1 = tensor_server.open(p).tensor().content_version
    import os
    import time

    time.sleep(0.01)
    np.save(p, np.ones((4, 4), np.uint8))
    os.utime(p, ns=(time.time_ns(), time.time_ns()))
    assert tensor_server.open(p).tensor().content_version != v1


def test_unknown_and_missing_name_the_path(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with pytest.raises(UnknownFormat, match="notes.txt"):
        tensor_server.open(p)
    with pytest.raises(UnreadableSource, match="no such file"):
        tensor_server.open(tmp_path / "missing.npy")


def test_truncated_npy_is_one_clear_error(tmp_path):
    p = tmp_path / "cut.npy"
    np.save(p, np.arange(1000, dtype=np.float64))
    data = p.read_bytes()
    p.write_bytes(data[:300])
    with pytest.raises(UnreadableSource, match="cut.npy") as info:
        tensor_server.open(p)
    assert "npy" in str(info.value)


def test_content_beats_extension(tmp_path):
    calls = []
    register_format(FormatEntry(name="zz-test-ext", opener=lambda p: calls.append(p), extensions=(".npy",), priority=1))
    try:
        p = tmp_path / "x.npy"
        np.save(p, np.zeros(3))
        assert detect_format(p).name == "npy"  # sniffed, although the other claims the extension first
    finally:
        from tensor_server.adapters import registry

        registry._formats.pop("zz-test-ext")


def test_a_broken_sniffer_does_not_break_detection(tmp_path):
    def boom(path, head):
        raise RuntimeError("sniffer bug")

    register_format(FormatEntry(name="zz-boom", opener=lambda p: None, sniff=boom, priority=0))
    try:
        p = tmp_path / "x.npy"
        np.save(p, np.zeros(3))
        assert detect_format(p).name == "npy"
    finally:
        from tensor_server.adapters import registry

        registry._formats.pop("zz-boom")


def test_one_detection_rule_when_the_head_cannot_be_read(tmp_path):
    """``detect_format`` and discovery share ``claim_format``: a file whose first bytes
    cannot be read (EIO here: /proc/self/mem at offset 0) is claimed by its extension by
    both, and the open names the error; with no extension, detection says it cannot read."""
    from tensor_server.adapters.registry import claim_format
    from tensor_server.catalog.discovery import discover

    (tmp_path / "x.tif").symlink_to("/proc/self/mem")
    (tmp_path / "noext").symlink_to("/proc/self/mem")
    assert claim_format(tmp_path / "x.tif").name == "tiff"
    assert detect_format(tmp_path / "x.tif").name == "tiff"
    assert [(c.path.name, c.format.name) for c in discover(tmp_path)] == [("x.tif", "tiff")]
    assert claim_format(tmp_path / "noext") is None
    with pytest.raises(UnreadableSource, match="cannot read: Input/output error"):
        detect_format(tmp_path / "noext")
    with pytest.raises(UnreadableSource, match="x.tif"):
        tensor_server.open(tmp_path / "x.tif")
