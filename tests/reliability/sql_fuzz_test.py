"""Hypothesis fuzz of catalog SQL over the wire: any text gets a result or a clean
INVALID_ARGUMENT, the server stays up, and the next ordinary query is still correct
(issue 12, the catalog-SQL part of the fuzz)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.catalog.sql import SqlLimits
from tensor_server.testing import serving
from tests.flight.conftest import client_for

FRAGMENTS = [
    "SELECT",
    "*",
    "count(*)",
    "FROM",
    "sources",
    "decode_rates",
    "WHERE",
    "is_resolved",
    "source_id",
    "=",
    "'img'",
    "(",
    ")",
    ",",
    "WITH x AS",
    "DELETE FROM sources",
    "UPDATE sources SET source_id = 'f'",
    "INSERT INTO sources (source_id) VALUES ('f')",
    "RETURNING 1",
    "range(1e15)",
    "UNION ALL",
    "ORDER BY 1",
    "LIMIT",
    "1",
    "-1",
    "1e308",
    "NULL",
    ";",
    "--",
    "/*",
    "*/",
    "repeat('x', 100000)",
    "read_csv('/etc/passwd')",
    "unnest(tensors)",
    "json_extract(metadata_json, '$.a')",
    "CAST(",
    "AS BIGINT",
    "'",
    '"',
    "\x00",
    "SET",
    "memory_limit='10GB'",
    "ATTACH",
    "PRAGMA",
    "COPY",
    "TO '/tmp/x'",
    "generate_series(1, 1000000)",
]

sql_text = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12).map(" ".join),
    st.text(max_size=300),
)


@pytest.fixture(scope="module")
def served():
    cat = Catalog(
        sql_limits=SqlLimits(
            timeout_seconds=2, max_result_rows=10_000, max_result_bytes=4 << 20, memory_limit_bytes=64 << 20
        )
    )
    cat.add_source(MemorySource(ArrayAdapter(np.arange(12, dtype=np.uint8).reshape(3, 4)), source_id="img"))
    with serving(cat) as srv:
        yield srv
    cat.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=sql_text)
def test_any_sql_text_gets_a_result_or_a_clean_refusal(served, sql):
    client = client_for(served)
    try:
        client.query(sql)
    except flight.FlightError as exc:
        assert isinstance(exc, flight.FlightServerError), f"{type(exc).__name__}: {exc}"
        assert json.loads(exc.extra_info)["code"] == "INVALID_ARGUMENT", str(exc)
    except ValueError:
        pass  # the SDK refuses some texts itself before sending them
    rows = client.query("SELECT source_id, is_resolved FROM sources").to_pylist()
    assert rows == [{"source_id": "img", "is_resolved": True}]
    np.testing.assert_array_equal(client.get_array("img"), np.arange(12, dtype=np.uint8).reshape(3, 4))
