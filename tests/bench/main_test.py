"""Every ``python -m tensor_server.bench <command>`` imports its module and answers ``--help``:
a command whose module no longer imports (``bench tls`` once called a removed class) fails
here, not when a reader of the docs runs it."""
from __future__ import annotations

import argparse

import pytest

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
