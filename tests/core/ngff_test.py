"""core/ngff.py: the documents both publishers write, and the shard index both write."""

from __future__ import annotations

import google_crc32c
import numpy as np

from tensor_server.core.ngff import SHARD_ABSENT, NgffImage, NgffLevel, image_attributes, labels_attributes, shard_index


def _image(method: str) -> NgffImage:
    return NgffImage(
        "img",
        ("c", "y", "x"),
        (None, "µm", "µm"),
        (None, 0.5, 0.5),
        (NgffLevel("0", (1, 1, 1), "none"), NgffLevel("1", (1, 2, 2), method)),
    )


def test_multiscales_scale_physical_size_by_the_level_factor_and_name_the_method():
    (ms,) = image_attributes(_image("area"), "0.4")["multiscales"]
    assert ms["axes"] == [
        {"name": "c", "type": "channel"},
        {"name": "y", "type": "space", "unit": "micrometer"},
        {"name": "x", "type": "space", "unit": "micrometer"},
    ]
    assert [d["coordinateTransformations"][0]["scale"] for d in ms["datasets"]] == [[1.0, 0.5, 0.5], [1.0, 1.0, 1.0]]
    assert ms["type"] == "area" and ms["version"] == "0.4"


def test_stored_levels_name_no_downscaling_type_and_0_5_nests_under_ome():
    attrs = image_attributes(_image("precompute"), "0.5", label_of=True)
    assert attrs["ome"]["version"] == "0.5" and "type" not in attrs["ome"]["multiscales"][0]
    assert attrs["ome"]["image-label"] == {"source": {"image": "../../"}}
    assert labels_attributes(["b", "a"], "0.4") == {"labels": ["a", "b"]}


def test_the_shard_index_skips_absent_chunks_and_carries_its_crc():
    sizes = np.array([[5, -1], [7, 3]])
    table = shard_index(sizes, checksum=True)
    index = np.frombuffer(table[:-4], "<u8").reshape(2, 2, 2)
    assert index[0, 0].tolist() == [0, 5] and index[1, 0].tolist() == [5, 7] and index[1, 1].tolist() == [12, 3]
    assert index[0, 1].tolist() == [SHARD_ABSENT, SHARD_ABSENT]
    assert table[-4:] == np.uint32(google_crc32c.value(table[:-4])).astype("<u4").tobytes()
    assert len(shard_index(sizes, checksum=False)) == 4 * 16
