"""The README's Python snippets run as written against a served demo dataset.

Each ```python block of README.md is pasted, in order, into one plain interactive console
(``code.InteractiveConsole``, what ``python`` without arguments runs: a compound statement
needs a blank line after it), in a folder laid out as ``make run`` leaves the repository
(``.tensor-server/demo``), against the demo served in-process; the upload block is pasted a
second time, as a user re-running it would. The only edit is the server address: the test
server listens on a free port, not 8815. The ``run`` command's printed snippet is executed.
"""
from __future__ import annotations

import code
import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.demo import make_demo_dataset
from tensor_server.testing import serving

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("clone")
    make_demo_dataset(home / ".tensor-server" / "demo")
    cat = Catalog([home / ".tensor-server" / "demo"], rois_path=str(home / ".tensor-server" / "annotations.duckdb"))
    cat.scan()
    from tensor_server.http.security import HttpSecurity

    # the README's URL carries the access token TOKEN, as the printed one does
    with serving(cat, http=True, http_security=HttpSecurity.build(tokens=["TOKEN"]),
                 write_dir=str(home / ".tensor-server" / "uploads"), writable=True) as srv:
        yield srv, home
    cat.close()


class _Console(code.InteractiveConsole):
    """The plain REPL, keeping what it would print as errors instead of printing them."""

    def __init__(self, ns: dict) -> None:
        super().__init__(ns, filename="<stdin>")
        self.errors: list[str] = []

    def write(self, data: str) -> None:
        self.errors.append(data)

    def paste(self, block: str) -> list[str]:
        """Type ``block`` line by line, then Enter on an empty line; the errors shown."""
        self.errors = []
        for line in block.splitlines():
            self.push(line)
        self.push("")
        return self.errors


def test_readme_has_the_snippets():
    blocks = _python_blocks()
    assert len(blocks) >= 4
    assert all("d291ad09" not in b for b in blocks)  # no machine-specific id
    assert "SELECT t.array_id" in blocks[0] and any("with tensor_server.open(" in b for b in blocks)


def test_readme_snippets_run_as_written(demo_server, monkeypatch):
    srv, home = demo_server
    monkeypatch.chdir(home)
    ns: dict = {}
    console = _Console(ns)
    out = io.StringIO()
    blocks = [b.replace("grpc://127.0.0.1:8815", srv.location).replace("http://127.0.0.1:8816", srv.http.url)
              for b in _python_blocks()]
    with contextlib.redirect_stdout(out):
        for block in blocks:
            assert console.paste(block) == [], block
        uploads = [b for b in blocks if "setup_array_upload" in b]
        assert len(uploads) == 1 and console.paste(uploads[0]) == []  # runs twice: no name is taken
    printed = out.getvalue()
    ids = [r["array_id"] for r in ns["tensors"]]
    assert len(ids) == 4 and ids == sorted(ids) and ids[0].startswith("cells-") and ids[0].endswith("/image")
    assert ns["full"].shape == (2, 1024, 1024) and ns["crop"].shape == (2, 512, 512)
    assert ns["level"].shape == (2, 256, 256) and ns["small"].shape == (24, 128, 128)
    np.testing.assert_array_equal(ns["crop"], ns["full"][:, 100:612, 0:512])
    assert ns["level1"].shape == (2, 512, 512)  # the stored level, over HTTP
    assert printed.count("READY\n(256, 256)") == 2
    assert len(re.findall(r"/image/@labels/cells-[0-9a-f]{6} 7", printed)) == 2  # uploads, read back
    assert "[1, 2, 2] precompute [2, 512, 512] stored" in printed  # the pyramid, readable
    assert "labels/cells" in printed and "volume-" in printed
    assert "(2, 1024, 1024) (2, 512, 512) (2, 256, 256) (2, 512, 512)" in printed
    assert "('µm', 'µm', 'µm')" in printed  # OME-TIFF sizes in the reference spelling
    assert srv.runtime.catalog.rois.list(ids[0])[0][0].label == "cell"


def test_the_run_command_prints_a_snippet_that_runs(demo_server):
    from tensor_server.cli import _snippet

    srv, _ = demo_server
    rec = [r for r in srv.runtime.catalog.records() if r.url.endswith("volume.ome.tif")][0]
    code = _snippet(srv.location, None, rec.source.tensor().array_id, [1, 4, 4], "area")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    lines = out.getvalue().splitlines()
    assert "volume-" in lines[0] and lines[1] == "(24, 256, 256) uint16"
    assert lines[2] == "[1, 1, 1] area [24, 1024, 1024]"
