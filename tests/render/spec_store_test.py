"""Render specs shared through a folder (``render.spec_store``): two stores over one folder
stand for two processes of a ``serve --workers`` server (tests/cli_workers_test.py runs the
real two)."""

from __future__ import annotations

import json
import os

import pytest

from tensor_server.errors import InvalidArgument, RenderSpecEvicted
from tensor_server.render.spec import SpecStore, parse_spec
from tensor_server.render.spec_store import GONE_PER_SPEC, SharedSpecStore


def _spec(i: int):
    return parse_spec(json.dumps({"channels": [{"index": i}]}).encode())


def test_a_spec_stored_by_one_process_is_read_by_another(tmp_path):
    one, two = SharedSpecStore(tmp_path), SharedSpecStore(tmp_path)
    key = one.put(_spec(3))
    assert two.get(key).channels[0].index == 3 and two.get(key).canonical() == _spec(3).canonical()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.json"]  # no temporary file left
    assert (tmp_path / f"{key}.json").read_bytes() == _spec(3).canonical()
    with pytest.raises(InvalidArgument, match="is not stored"):
        SpecStore().get(key)  # a store of its own knows nothing of the folder
    with pytest.raises(InvalidArgument, match="is not stored"):
        two.get("0123456789abcdef")


def test_the_folder_is_bounded_least_recently_used_first_and_evicted_ids_say_post_again(tmp_path):
    one, two = SharedSpecStore(tmp_path, max_specs=2), SharedSpecStore(tmp_path, max_specs=2)
    a = one.put(_spec(0))
    b = one.put(_spec(1))
    os.utime(tmp_path / f"{a}.json", (1, 1))
    os.utime(tmp_path / f"{b}.json", (2, 2))
    assert two.get(a).channels[0].index == 0  # read from the folder: a becomes the most recent
    c = two.put(_spec(2))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted([f"{a}.json", f"{c}.json"])
    fresh = SharedSpecStore(tmp_path, max_specs=2)
    with pytest.raises(RenderSpecEvicted, match="POST the spec to /render again"):
        fresh.get(b)  # evicted by another process: a 404 everywhere, not a 400
    assert one.get(b).channels[0].index == 1  # still in the memory of the process that stored it
    assert fresh.put(_spec(1)) == b and SharedSpecStore(tmp_path).get(b).channels[0].index == 1
    assert not (tmp_path / f"{b}.gone").exists()  # posted again: no longer gone


def test_bytes_are_bounded_and_the_gone_markers_too(tmp_path):
    size = len(_spec(0).canonical())
    store = SharedSpecStore(tmp_path, max_specs=100, max_bytes=3 * size)
    keys = [store.put(_spec(i)) for i in range(10)]
    assert len(list(tmp_path.glob("*.json"))) == 3 and (tmp_path / f"{keys[-1]}.json").is_file()
    small = SharedSpecStore(tmp_path, max_specs=1)
    for i in range(10, 20):
        small.put(_spec(i))
    assert len(list(tmp_path.glob("*.json"))) == 1 and len(list(tmp_path.glob("*.gone"))) <= GONE_PER_SPEC


def test_a_file_that_is_not_its_ids_spec_is_not_served(tmp_path):
    store = SharedSpecStore(tmp_path)
    key = _spec(5).id
    (tmp_path / f"{key}.json").write_bytes(_spec(6).canonical())  # another spec under its name
    with pytest.raises(InvalidArgument, match="is not stored"):
        store.get(key)
