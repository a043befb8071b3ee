"""Every name rule of the design refuses, through the real SDK, with the reason; collisions
fold case and Unicode normalization; the id grammar refuses bare fields."""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow.flight as flight
import pytest

from tensor_server.uploads.names import fold_name, name_problem, parse_upload_id

ARR = np.zeros((4, 4), np.uint8)

BAD_NAMES = {
    "@ome": "opens with '@'",
    "CON": "Windows device name",
    "nul.txt": "Windows device name",
    "com7": "Windows device name",
    "LPT1.zarr": "Windows device name",
    "trailing ": "ends with a space",
    "trailing.": "ends with a space or '.'",
    "a<b": "forbidden on NTFS",
    "a>b": "forbidden on NTFS",
    'a"b': "forbidden on NTFS",
    "a|b": "forbidden on NTFS",
    "a?b": "forbidden on NTFS",
    "a*b": "forbidden on NTFS",
    "tab\there": "control character",
    "bell\x07": "control character",
    ".hidden": "starts with '.'",
    "a:b": "contains ':'",
    "a\\b": "path separator",
    "é" * 128: "longer than 255 UTF-8 bytes",
}


@pytest.mark.parametrize("name", list(BAD_NAMES))
def test_each_rule_refuses_through_the_sdk(client, name):
    with pytest.raises(
        flight.FlightServerError,
        match="the name .* "
        + BAD_NAMES[name]
        .replace("(", r"\(")
        .replace("?", r"\?")
        .replace("*", r"\*")
        .replace("|", r"\|")
        .replace(".", r"\."),
    ):
        client.setup_array_upload(f"zarr://scratch/@fields/{name}", ARR)


def test_the_limit_counts_bytes_not_characters(client):
    assert name_problem("a" * 255) is None
    assert name_problem("é" * 127) is None  # 254 bytes
    assert "255 UTF-8 bytes" in name_problem("é" * 128)
    desc = client.setup_array_upload("cache://scratch/@fields/" + "a" * 255, ARR)
    assert desc.array_id.endswith("a" * 255)


@pytest.mark.parametrize(
    "request_id, why",
    [
        ("zarr://scratch/x", "marked segment"),  # a bare field is a native id
        ("zarr://scratch", "marked segment"),
        ("scratch/@fields/x", "names no store format"),
        ("s3://scratch/@fields/x", "unknown store format"),
        ("zarr://scratch/@fields/a/b", "path separator"),
        ("cache://mem/img/@labels/cells", "label set is an OME-Zarr"),
        ("zarr://scratch/@fields/", "is empty"),
    ],
)
def test_id_grammar_refusals(client, request_id, why):
    with pytest.raises(flight.FlightServerError, match=why):
        client.setup_array_upload(request_id, ARR)


def test_collisions_fold_case_and_normalization(client):
    composed = unicodedata.normalize("NFC", "Zellkörper")
    decomposed = unicodedata.normalize("NFD", "Zellkörper")
    assert composed != decomposed and fold_name(composed) == fold_name(decomposed)
    client.setup_array_upload(f"zarr://scratch/@fields/{composed}", ARR)
    for other in (decomposed, composed.upper(), "zellkörper"):
        with pytest.raises(flight.FlightServerError, match="name is taken"):
            client.setup_array_upload(f"cache://scratch/@fields/{other}", ARR)


def test_a_set_named_labels_parses_right_to_left():
    t = parse_upload_id("zarr://src/img/@labels/labels")
    assert (t.source_id, t.field, t.image_id, t.name) == ("src", "img/@labels/labels", "src/img", "labels")
    t = parse_upload_id("cache://scratch/@fields/0")
    assert (t.array_id, t.store_format) == ("scratch/@fields/0", "cache")
