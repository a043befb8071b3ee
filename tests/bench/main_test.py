"""``python -m tensor_server.bench``: a bench whose peer library is not installed (the serving
install has none of them) says which extra brings it."""
from __future__ import annotations

import importlib

import pytest

from tensor_server.bench import __main__ as bench_main


def test_a_missing_peer_names_the_extras(monkeypatch, capsys):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'tensorstore'", name="tensorstore")

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert bench_main.main(["peers"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m tensor_server.bench peers: needs tensorstore,")
    assert "pip install 'tensor-server[bench,test]'" in err


def test_a_missing_module_of_ours_is_a_bug_not_an_extra(monkeypatch):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'tensor_server.bench.gone'", name="tensor_server.bench.gone")

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError):
        bench_main.main(["peers"])
