"""``python -m tensor_server share`` against a running server: make a link, list it, revoke
it, rotate the secret; the server's refusals reach the user as one line and exit 1."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.cli import main
from tensor_server.testing import serving

TOKEN = "cli-share-token"


@pytest.fixture
def served(tmp_path):
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(np.ones((8, 8), np.uint8), "yx"), source_id="img"))
    cat.first_scan_done.set()
    with serving(cat, http=True, token=TOKEN, shares_dir=str(tmp_path / "shares")) as srv:
        yield srv
    cat.close()


def _share(srv, capsys, *argv, token=TOKEN):
    code = main(["share", *argv, "--server", srv.location, "--token", token])
    out, err = capsys.readouterr()
    return code, out, err


def test_make_list_revoke_and_rotate(served, capsys):
    code, out, err = _share(served, capsys, "img", "--expires", "2h", "--scope", "read+annotate")
    url = out.strip()
    assert code == 0 and url.startswith(f"{served.http_url}/s/") and url.endswith("/zarr/img/")
    assert "read+annotate until" in err
    assert httpx.get(f"{url}.zattrs", timeout=30).status_code == 200
    (link,) = served.runtime.shares.links(None)
    assert 7190 < link.expires_at - link.created_at <= 7200
    code, out, _ = _share(served, capsys, "--list")
    assert code == 0 and out.split()[:3] == [link.id, "live", "read+annotate"]
    code, out, _ = _share(served, capsys, "--revoke", link.id)
    assert code == 0 and out.startswith(f"revoked {link.id} (img)")
    assert httpx.get(f"{url}.zattrs", timeout=30).status_code == 401
    code, out, _ = _share(served, capsys, "--rotate-secret")
    assert code == 0 and "1 links refused from now on" in out


def test_refusals_are_one_line_and_exit_1(served, capsys):
    code, _, err = _share(served, capsys, "img", token="not-the-token")
    assert code == 1 and err.startswith("share: ") and "unauthenticated" in err and len(err.splitlines()) == 1
    code, _, err = _share(served, capsys, "--revoke", "no-such-link")
    assert code == 1 and "no link 'no-such-link'" in err
    assert main(["share"]) == 2
    with pytest.raises(SystemExit):
        main(["share", "img", "--expires", "soon"])


def test_a_link_id_never_starts_with_a_dash_so_revoke_takes_it(served, capsys, monkeypatch):
    """One random id in 64 started with ``-``; ``--revoke <id>`` read it as an option."""
    import secrets

    drawn = iter(["-dashfirst00", "plainid00000"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    code, _, _ = _share(served, capsys, "img")
    (link,) = served.runtime.shares.links(None)
    assert code == 0 and link.id == "plainid00000"
    code, out, _ = _share(served, capsys, "--revoke", link.id)
    assert code == 0 and out.startswith(f"revoked {link.id} (img)")
