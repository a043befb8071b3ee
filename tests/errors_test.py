"""The taxonomy's answers a door relies on when it did not raise one of its classes."""

from __future__ import annotations

import pytest

from tensor_server.errors import code_of_http_status


@pytest.mark.parametrize(
    "status, code",
    [
        (200, "OK"),
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (403, "PERMISSION_DENIED"),
        (404, "NOT_FOUND"),
        (405, "INVALID_ARGUMENT"),
        (409, "FAILED_PRECONDITION"),
        (413, "RESOURCE_EXHAUSTED"),
        (499, "CANCELLED"),
        (500, "INTERNAL"),
        (501, "UNIMPLEMENTED"),
        (503, "UNAVAILABLE"),
        (507, "RESOURCE_EXHAUSTED"),
        (502, "INTERNAL"),
    ],
)
def test_a_status_a_door_answered_maps_to_the_taxonomys_code(status, code):
    assert code_of_http_status(status) == code
