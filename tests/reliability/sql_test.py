"""Client SQL can neither change what other clients see nor exhaust the server (issue 12,
Critical 1 and High 6). Real SDK client against an in-process server."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import descriptor_pb2, ticket_pb2

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.catalog.sql import SqlLimits
from tensor_server.testing import serving
from tensor_server.testing.deadline import finishes_within
from tests.flight.conftest import client_for

PIXELS = (np.arange(64 * 96, dtype=np.uint16) * 7).reshape(64, 96)
LIMITS = SqlLimits(
    max_query_chars=4096,
    max_result_rows=5000,
    max_result_bytes=1 << 20,
    timeout_seconds=1.5,
    memory_limit_bytes=64 << 20,
    max_concurrent=1,
)


@pytest.fixture(scope="module")
def server():
    cat = Catalog(sql_limits=LIMITS)
    cat.add_source(MemorySource(ArrayAdapter(PIXELS, chunk_shape=(32, 32)), source_id="img"))
    cat.add_source(MemorySource(ArrayAdapter(np.ones((4, 4), np.uint8)), source_id="small"))
    with serving(cat) as srv:
        yield srv
    cat.close()


def _code(exc: flight.FlightError) -> str:
    return json.loads(exc.extra_info)["code"]


WRITING_CTES = [
    "WITH x AS (DELETE FROM sources RETURNING 1) SELECT count(*) FROM x",
    "WITH x AS (UPDATE sources SET tensors = [] RETURNING 1) SELECT count(*) FROM x",
    "WITH x AS (INSERT INTO sources (source_id) VALUES ('forged') RETURNING 1) SELECT count(*) FROM x",
    "WITH x AS (DELETE FROM decode_rates RETURNING 1) SELECT count(*) FROM x",
]


@pytest.mark.parametrize("sql", WRITING_CTES)
def test_writing_cte_cannot_change_other_clients_view(server, sql):
    attacker, victim = client_for(server), client_for(server)
    before = victim.query("SELECT source_id, tensors FROM sources ORDER BY source_id").to_pylist()
    try:
        attacker.query(sql)
    except flight.FlightError as exc:
        assert _code(exc) == "INVALID_ARGUMENT"
    after = victim.query("SELECT source_id, tensors FROM sources ORDER BY source_id").to_pylist()
    assert after == before and [r["source_id"] for r in after] == ["img", "small"]
    np.testing.assert_array_equal(victim.get_array("img"), PIXELS)


def test_a_table_created_by_one_query_is_gone_for_the_next(server):
    c = client_for(server)
    with pytest.raises(flight.FlightError):
        c.query("CREATE TABLE sources2 AS SELECT 1")
    with pytest.raises(flight.FlightError) as info:
        c.query("SELECT * FROM sources2")
    assert _code(info.value) == "INVALID_ARGUMENT"


def test_query_text_over_the_cap_is_refused_before_parsing(server):
    with pytest.raises(flight.FlightError) as info:
        client_for(server).query("SELECT 1" + " + 1" * 5000)
    assert _code(info.value) == "INVALID_ARGUMENT" and "characters" in str(info.value)


def test_result_rows_and_bytes_are_capped(server):
    c = client_for(server)
    assert c.query("SELECT * FROM range(5000)").num_rows == 5000
    with pytest.raises(flight.FlightError) as info:
        c.query("SELECT * FROM range(1000000000000000)")
    assert _code(info.value) == "INVALID_ARGUMENT" and "rows" in str(info.value)
    with pytest.raises(flight.FlightError) as info:
        c.query("SELECT repeat('x', 10000) AS s FROM range(1000)")
    assert _code(info.value) == "INVALID_ARGUMENT" and "bytes" in str(info.value)


def test_memory_limit_stops_a_big_sort(server):
    with pytest.raises(flight.FlightError) as info:
        client_for(server).query("SELECT repeat('x', 10000) || i AS s FROM range(20000) t(i) ORDER BY s DESC LIMIT 1")
    assert _code(info.value) == "INVALID_ARGUMENT" and "memory" in str(info.value).lower()


def test_never_ending_query_stops_at_the_deadline(server):
    c = client_for(server)
    with pytest.raises(flight.FlightError) as info:
        finishes_within(lambda: c.query("SELECT count(*) FROM range(1000000000000000)"), 30)
    assert _code(info.value) == "INVALID_ARGUMENT" and "longer than 1.5 s" in str(info.value)
    assert c.query("SELECT count(*) AS n FROM sources").to_pylist() == [{"n": 2}]


def test_query_of_a_client_that_left_is_interrupted():
    """With one query slot and a 60 s deadline, a second query can only run promptly if the
    first one (whose client gave up after 0.5 s) was interrupted on the disconnect."""
    cat = Catalog(sql_limits=SqlLimits(timeout_seconds=60, max_concurrent=1))
    with serving(cat) as srv:
        raw = flight.FlightClient(srv.location)
        ticket = ticket_pb2.TensorTicket(
            catalog_query=descriptor_pb2.CatalogQuery(sql="SELECT count(*) FROM range(1000000000000000)")
        )
        with pytest.raises(flight.FlightError):
            raw.do_get(flight.Ticket(ticket.SerializeToString()), flight.FlightCallOptions(timeout=0.5)).read_all()
        rows = finishes_within(lambda: client_for(srv).query("SELECT count(*) AS n FROM sources").to_pylist(), 20)
        assert rows == [{"n": 0}]
    cat.close()


@pytest.mark.parametrize("sql", ["SELECT * FROM duckdb_extensions()", "SELECT * FROM read_csv('/etc/passwd')"])
def test_errors_do_not_show_host_paths(server, sql):
    with pytest.raises(flight.FlightError) as info:
        client_for(server).query(sql)
    msg = str(info.value).split(". Detail:")[0]
    assert _code(info.value) == "INVALID_ARGUMENT"
    assert ".duckdb" not in msg and "/root" not in msg and "/etc/passwd" not in msg and "<path>" in msg


@pytest.mark.parametrize(
    "sql, problem",
    [
        ("SELEC 1", 'Catalog query failed: Parser Error: syntax error at or near "SELEC" (line 1, column 1)'),
        ("SELECT 1,\n  2 +", 'Catalog query failed: Parser Error: syntax error at or near "+" (line 2, column 5)'),
        (
            "SELECT nope FROM sources",
            'Catalog query failed: Binder Error: Referenced column "nope" not found in FROM clause!',
        ),
        ("DELETE FROM sources", "Catalog query refused: only SELECT is allowed, not DELETE"),
    ],
)
def test_an_sql_error_reaches_the_sdk_as_one_line_naming_the_problem(server, sql, problem):
    """What the SDK's caller sees: ``str(exc)`` starts with the one-line problem (pyarrow's
    client appends gRPC's debug text after it; the server cannot stop that), and
    ``extra_info`` carries the problem alone."""
    with pytest.raises(flight.FlightServerError) as info:
        client_for(server).query(sql)
    extra = json.loads(info.value.extra_info)
    assert extra == {"code": "INVALID_ARGUMENT", "reason": "catalog_query", "message": problem}
    assert str(info.value).startswith(problem + " [request ")
