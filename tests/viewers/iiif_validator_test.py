"""The official IIIF Image API validator (PyPI ``iiif-validator``) at level 2 against the
server, on the validator's own test image served as an RGB tensor."""

from __future__ import annotations

import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tests.viewers.conftest import serving_arrays, validator_squares

pytest.importorskip("iiif_validator")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    squares = ArrayAdapter(validator_squares(), "yxs", chunk_shape=(256, 256, 3))
    with serving_arrays(tmp_path_factory.mktemp("iiif"), squares=squares) as (cat, http):
        yield http


def _level2_tests():
    from iiif_validator.validator import TestSuite, ValidationInfo

    listed = TestSuite(ValidationInfo()).list_tests("3.0")
    return sorted(name for name, info in listed.items() if info["level"] <= 2)


@pytest.mark.parametrize("name", _level2_tests())
def test_validator_level2(server, name):
    from iiif_validator.validator import ImageAPI, TestSuite, ValidationInfo

    result = ImageAPI("squares", server.url.replace("http://", ""), "iiif/3", version="3.0", debug=False)
    TestSuite(ValidationInfo()).run_test(name, result)
    e = result.exception
    assert e is None or e.warning, f"{name}: {e} (url {getattr(e, 'url', None)})"
    assert result.tests, f"{name} ran no checks"
