"""A source dropped without close() closes its file quietly (ND2 used to warn
"ND2File file not closed before garbage collection")."""

from __future__ import annotations

import gc
import warnings

import numpy as np

import tensor_server
from tensor_server.core.handles import LazyHandle


def test_a_collected_handle_closes_its_file():
    closed = []
    h = LazyHandle(lambda: "file", closer=closed.append)
    with h.use():
        pass
    del h
    gc.collect()
    assert closed == ["file"]


def test_nd2_source_collected_without_close_does_not_warn(testdata):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        src = tensor_server.open(testdata / "nd2/cluster.nd2")
        data = src.tensor().get_data()
        del src
        gc.collect()
    assert data.shape == (3, 2, 10, 31, 38) and np.asarray(data).any()
    assert [str(w.message) for w in caught if "not closed" in str(w.message)] == []


def test_sources_are_context_managers(testdata):
    with tensor_server.open(testdata / "nd2/cluster.nd2") as src:
        t = src.tensor()
        assert t.get_data().shape == t.shape
    assert getattr(t, "inner", t)._handle.is_open is False  # closed by the with block
