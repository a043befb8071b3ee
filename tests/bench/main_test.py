"""``python -m tensor_server.bench``: every command imports its module and answers ``--help``
(a command whose module no longer imports — ``bench tls`` once called a removed class — fails
here, not when a reader of the docs runs it), and a bench whose peer library is not installed
(the serving install has none of them) says which extra brings it."""

from __future__ import annotations

import argparse
import importlib

import pytest

from tensor_server.bench import __main__ as bench_main
from tensor_server.bench.__main__ import main, top_parser


def _commands() -> list[str]:
    """The command names the bench's own parser accepts."""
    (sub,) = [a for a in top_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(sub.choices)


def test_the_parser_lists_the_commands() -> None:
    assert {"kernels", "tls", "gate", "export"} <= set(_commands())


@pytest.mark.parametrize("command", _commands())
def test_every_command_answers_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m tensor_server.bench {command}")
    assert "options:" in out


def test_an_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["no-such-bench", "--help"])
    assert done.value.code == 2
    assert "invalid choice: 'no-such-bench'" in capsys.readouterr().err


def test_a_missing_peer_names_the_extras(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def import_module(name: str) -> None:
        raise ModuleNotFoundError("No module named 'tensorstore'", name="tensorstore")

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert bench_main.main(["peers"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m tensor_server.bench peers: needs tensorstore,")
    assert "pip install 'tensor-server[bench,test]'" in err


def test_a_missing_module_of_ours_is_a_bug_not_an_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def import_module(name: str) -> None:
        raise ModuleNotFoundError("No module named 'tensor_server.bench.gone'", name="tensor_server.bench.gone")

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError):
        bench_main.main(["peers"])
