"""The README and the docs say what the code does, and their snippets run as written.

Snippets: each ```python block of README.md, then of the how-to pages that continue its
session (``SESSION_PAGES``), is pasted, in order, into one plain interactive console
(``code.InteractiveConsole``, what ``python`` without arguments runs: a compound statement
needs a blank line after it), in a folder laid out as ``make run`` leaves the repository
(``.tensor-server/demo``), against the demo served in-process; the upload block is pasted a
second time, as a user re-running it would. The only edit is the server address: the test
server listens on a free port, not 8815. The ``run`` command's printed snippet is executed.

Facts: the README stays under 12 KB and its formats table lists every registered format and
extension; ``docs/cli.md`` is the parser's reference and ``docs/performance.md`` lists every
bench command; every relative link of the README, CONTRIBUTING.md and docs/ resolves.
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

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: pages whose Python blocks continue the README's session (client, array_id), in this order
SESSION_PAGES = [DOCS / "getting-started.md", DOCS / "uploading.md", DOCS / "beyond-one-machine.md"]
README_MAX_BYTES = 12_000


def _python_blocks(*pages: Path) -> list[str]:
    return [
        block
        for page in (pages or (README,))
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)
    ]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("clone")
    make_demo_dataset(home / ".tensor-server" / "demo")
    cat = Catalog([home / ".tensor-server" / "demo"], rois_path=str(home / ".tensor-server" / "annotations.duckdb"))
    cat.scan()
    from tensor_server.http.security import HttpSecurity

    # the README's URL carries the access token TOKEN, as the printed one does
    with serving(
        cat,
        http=True,
        http_security=HttpSecurity.build(tokens=["TOKEN"]),
        write_dir=str(home / ".tensor-server" / "uploads"),
        writable=True,
    ) as srv:
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
    assert all("d291ad09" not in b for b in _python_blocks(README, *SESSION_PAGES))  # no machine-specific id
    assert "SELECT t.array_id" in blocks[0] and any("with tensor_server.open(" in b for b in blocks)
    assert all(_python_blocks(page) for page in SESSION_PAGES), "a session page without a block to run"


def test_readme_snippets_run_as_written(demo_server, monkeypatch):
    srv, home = demo_server
    monkeypatch.chdir(home)
    ns: dict = {}
    console = _Console(ns)
    out = io.StringIO()
    blocks = [
        b.replace("grpc://127.0.0.1:8815", srv.location).replace("http://127.0.0.1:8816", srv.http.url)
        for b in _python_blocks(README, *SESSION_PAGES)
    ]
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
    np.testing.assert_allclose(ns["means"], ns["level"].mean(axis=(1, 2)))  # the dask cluster's answer


def test_the_run_command_prints_a_snippet_that_runs(demo_server):
    from tensor_server.cli_banner import Example, read_snippet

    srv, _ = demo_server
    rec = [r for r in srv.runtime.catalog.records() if r.url.endswith("volume.ome.tif")][0]
    code = read_snippet(srv.location, None, Example(rec.source.tensor().array_id, (1, 4, 4), "area"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    lines = out.getvalue().splitlines()
    assert "volume-" in lines[0] and lines[1] == "(24, 256, 256) uint16"
    assert lines[2] == "[1, 1, 1] area [24, 1024, 1024]"


# ---- facts ---------------------------------------------------------------------------------------
def test_the_readme_stays_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"


def _formats_table() -> list[list[str]]:
    """The cells of the README's formats table, one list per format row."""
    section = README.read_text().split("## Formats", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| format ")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def test_the_formats_table_lists_every_registered_format_and_extension():
    """'Does it read my .czi?': every format the registry knows is a row naming it as
    (`name`), and every extension it claims by is in that row."""
    from tensor_server.adapters.registry import formats

    rows = _formats_table()
    assert rows and all(len(cells) == 6 for cells in rows), rows
    for entry in formats():
        row = next((cells for cells in rows if f"`{entry.name}`" in cells[0]), None)
        assert row is not None, f"format {entry.name!r} ({entry.description}) has no row in the README's formats table"
        listed = set(re.findall(r"\.[\w.]+", row[1]))
        missing = set(entry.extensions) | set(entry.claims)
        assert missing <= listed, f"{entry.name}: extensions {sorted(missing - listed)} not in its row"


def test_the_cli_reference_is_the_parser():
    from tensor_server.cli_parser import cli_reference

    assert (DOCS / "cli.md").read_text() == cli_reference(), (
        "docs/cli.md is out of date: python -c 'import tensor_server.cli_parser as c; print(c.cli_reference(), end=\"\")'"
        " > docs/cli.md"
    )


def test_the_performance_page_lists_every_bench_command():
    from tensor_server.bench.__main__ import COMMANDS

    text = (DOCS / "performance.md").read_text()
    missing = [
        f"| `{name}` | {summary} |"
        for name, (_, summary) in COMMANDS.items()
        if f"| `{name}` | {summary} |" not in text
    ]
    assert missing == [], "rows missing from docs/performance.md's command table:\n" + "\n".join(missing)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces
    to hyphens, a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file, or whose anchor in a Markdown file, does not exist."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            bad.append(f"{page.name}: {target} (no heading #{anchor} in {linked.name})")
    return bad


def test_every_relative_link_resolves():
    pages = [README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
    assert len(pages) > 10 and all(page.exists() for page in pages)
    assert [bad for page in pages for bad in broken_links(page)] == []


def test_the_link_check_can_fail(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere)\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: there.md#nowhere (no heading #nowhere in there.md)",
    ]
