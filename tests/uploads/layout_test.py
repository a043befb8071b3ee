"""Where a member lives: every upload id gets a folder under ``fields/``, and the folder
alone gives the id back (what boot reports a member without a readable marker under)."""

from __future__ import annotations

import pytest

from tensor_server.uploads.layout import layout_array_id, member_dir, member_dirs


@pytest.mark.parametrize(
    "array_id", ["scratch/@fields/x", "src/@labels/cells", "src/@fields/img/@labels/cells", "src/0/1/@labels/nuclei"]
)
def test_a_member_folder_names_its_upload_by_its_place(tmp_path, array_id):
    """A member without a readable marker is reported under the id its folder stands for:
    the inverse of where the manager puts that id."""
    source_id, field = array_id.split("/", 1)
    folder = member_dir(tmp_path, source_id, field)
    assert layout_array_id(folder, tmp_path / "fields") == array_id


def test_boot_finds_every_member_folder_of_both_shapes(tmp_path):
    ids = ["scratch/@fields/x", "src/@labels/cells", "src/@fields/img/@labels/cells", "src/@fields/y"]
    folders = [member_dir(tmp_path, *array_id.split("/", 1)) for array_id in ids]
    for folder in folders:
        folder.mkdir(parents=True)
    assert sorted(member_dirs(tmp_path)) == sorted(folders)
    assert sorted(layout_array_id(f, tmp_path / "fields") for f in member_dirs(tmp_path)) == sorted(ids)
