"""``tools/bytecode.py``, the set-up's bytecode step: it compiles what compileall would, leaves
out what does not compile, and says how far it is while it works."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bytecode.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bytecode_tool", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_compiles_every_file_and_leaves_out_the_ones_that_do_not_compile(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("B = 2\n")
    (tmp_path / "pkg" / "bad.py").write_text("def broken(:\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "pkg")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tag = sys.implementation.cache_tag
    assert (tmp_path / "pkg" / "__pycache__" / f"a.{tag}.pyc").is_file()
    assert (tmp_path / "pkg" / "sub" / "__pycache__" / f"b.{tag}.pyc").is_file()
    assert not (tmp_path / "pkg" / "__pycache__" / f"bad.{tag}.pyc").exists()
    assert done.stdout.splitlines()[-1].startswith("bytecode: 3 files in ")
    assert done.stdout.splitlines()[-1].endswith(", 1 that do not compile for this Python left out")


def test_a_missing_folder_is_named():
    done = subprocess.run([sys.executable, str(SCRIPT), "/no/such/folder"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no such folder: /no/such/folder" in done.stderr


def test_the_count_is_a_line_per_tenth_off_a_terminal():
    out = io.StringIO()
    counter = _tool().Counter("bytecode", 1000, out)
    for done in range(64, 1001, 64):
        counter.update(done)
    counter.update(1000)
    lines = out.getvalue().splitlines()
    assert lines == [f"bytecode: {n}/1000 files" for n in (128, 256, 320, 448, 512, 640, 704, 832, 960)]
