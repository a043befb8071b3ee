"""Symlinks inside a root that lead outside it are not followed by default, and a failure
reason never quotes the file's bytes (issue 12, Critical 4)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_server.catalog import Catalog
from tensor_server.catalog.discovery import OUTSIDE_ROOTS
from tensor_server.config import load_settings
from tensor_server.testing import serving
from tests.flight.conftest import client_for


@pytest.fixture
def layout(tmp_path):
    import tifffile
    import zarr

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    img = np.arange(30 * 40, dtype=np.uint16).reshape(30, 40)
    tifffile.imwrite(outside / "private.tif", img)
    zarr.open_array(str(outside / "private.zarr"), mode="w", shape=(8, 8), dtype="u1", zarr_format=3)[...] = 7
    (outside / "secret.txt").write_bytes(b"SECRET-PASSWORD-1234\n" * 4)
    tifffile.imwrite(root / "inside.tif", img + 1)
    (root / "link.tif").symlink_to(outside / "private.tif")
    (root / "link.zarr").symlink_to(outside / "private.zarr", target_is_directory=True)
    (root / "leak.tif").symlink_to(outside / "secret.txt")
    (root / "alias.tif").symlink_to(root / "inside.tif")  # inside the root: followed
    return root, img


def test_links_out_of_the_roots_are_not_followed_by_default(layout):
    root, img = layout
    cat = Catalog([root])
    cat.scan()
    # the alias inside the root is followed: it and its target are one source
    assert [r.path.resolve().name for r in cat.records()] == ["inside.tif"]
    skipped = {p.name: why for p, why in cat.skipped}
    assert skipped == {"link.tif": OUTSIDE_ROOTS, "link.zarr": OUTSIDE_ROOTS, "leak.tif": OUTSIDE_ROOTS}
    with serving(cat) as srv:
        c = client_for(srv)
        rows = c.query("SELECT source_url, unresolved_reason FROM sources").to_pylist()
        assert not any("private" in r["source_url"] or "secret" in r["source_url"] for r in rows)
        np.testing.assert_array_equal(c.get_array(cat.records()[0].source_id), img + 1)
    cat.close()


def test_the_config_key_opts_in_and_bytes_never_reach_a_reason(layout):
    root, img = layout
    settings = load_settings(None)
    assert settings.follow_symlinks_outside_roots is False
    cat = Catalog([root], follow_symlinks_outside_roots=True)
    cat.scan()
    rows = {r.path.name: r for r in cat.records()}
    np.testing.assert_array_equal(rows["link.tif"].source.tensor().get_data(), img)
    assert rows["link.zarr"].is_resolved
    leak = rows["leak.tif"]
    assert not leak.is_resolved and "<bytes>" in leak.unresolved_reason
    assert "SECRET" not in leak.unresolved_reason and "PASSWORD" not in leak.unresolved_reason
    cat.close()


def test_config_file_keys(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[catalog]\nfollow_symlinks_outside_roots = true\nopen_timeout_seconds = 5\n")
    settings = load_settings(cfg)
    assert settings.follow_symlinks_outside_roots is True and settings.open_timeout_seconds == 5


def test_links_out_of_the_roots_inside_a_folder_source_are_not_served(tmp_path):
    """A zarr chunk folder and a TIFF plane linked to files outside the root: the format
    library would read them without discovery seeing them, so the source is refused."""
    import shutil

    import tifffile
    import zarr

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    zarr.open_array(str(outside / "secret.zarr"), mode="w", shape=(8, 8), chunks=(8, 8), dtype="u1", zarr_format=3)[
        ...
    ] = 9
    zarr.open_array(str(root / "img.zarr"), mode="w", shape=(8, 8), chunks=(8, 8), dtype="u1", zarr_format=3)[...] = 1
    shutil.rmtree(root / "img.zarr" / "c")
    (root / "img.zarr" / "c").symlink_to(outside / "secret.zarr" / "c", target_is_directory=True)
    seq = root / "seq"
    seq.mkdir()
    for z in range(2):
        tifffile.imwrite(seq / f"p_z{z}.tif", np.full((4, 4), z, np.uint8))
    tifffile.imwrite(outside / "private.tif", np.full((4, 4), 7, np.uint8))
    (seq / "p_z2.tif").symlink_to(outside / "private.tif")
    (seq / "p_z3.tif").symlink_to(seq / "p_z0.tif")  # a link inside the root is fine

    cat = Catalog([root])
    cat.scan()
    rows = {r.path.name: r for r in cat.records()}
    assert set(rows) == {"img.zarr", "seq"} and not any(r.is_resolved for r in rows.values())
    assert rows["img.zarr"].unresolved_reason.startswith("holds symlinks to targets outside the served roots (c)")
    assert "(p_z2.tif)" in rows["seq"].unresolved_reason
    cat.close()
    opted_in = Catalog([root], follow_symlinks_outside_roots=True)
    opted_in.scan()
    rows = {r.path.name: r for r in opted_in.records()}
    np.testing.assert_array_equal(rows["img.zarr"].source.tensor().get_data(), np.full((8, 8), 9, np.uint8))
    assert rows["seq"].source.tensor().shape == (4, 4, 4)
    opted_in.close()
