"""The decode rates' store failing: a second server finds the annotation file held by the
first (issue 40 printed two multi-line ``RoiStoreBusy`` tracebacks before the one line that
said it would use a file of its own)."""

from __future__ import annotations

import logging

import pytest

from tensor_server.catalog.decode_rates import DecodeRates
from tensor_server.catalog.rois import RoiStoreBusy


class _HeldStore:
    """A store another process holds: every call refuses, as RoiStore does then."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def load_decode_rates(self):
        self.calls.append("load")
        raise RoiStoreBusy("annotation store /home/annotations.duckdb: cannot open: Conflicting lock")

    def save_decode_rates(self, rows) -> None:
        self.calls.append("save")
        raise RoiStoreBusy("annotation store /home/annotations.duckdb: cannot open: Conflicting lock")


class _BrokenStore(_HeldStore):
    def load_decode_rates(self):
        raise KeyError("a bug")


def test_a_run_that_measured_nothing_never_touches_the_store():
    rates, store = DecodeRates(), _HeldStore()
    rates.attach(store)
    rates.flush()  # what Catalog.close does: the second server's whole life
    assert store.calls == []


def test_a_held_store_is_one_line_per_failure_without_a_traceback(caplog):
    rates, store = DecodeRates(), _HeldStore()
    rates.attach(store)
    with caplog.at_level(logging.WARNING, logger="tensor_server.catalog.decode_rates"):
        rates.record("img", 1 << 20, 0.01)
        rates.flush()
    assert store.calls == ["load", "save"]
    assert [(r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            "decode rates: cannot load the stored rows; measuring afresh (annotation store /home/annotations.duckdb: "
            "cannot open: Conflicting lock)",
            None,
        ),
        (
            "decode rates: cannot store the rows (annotation store /home/annotations.duckdb: cannot open: "
            "Conflicting lock)",
            None,
        ),
    ]
    assert rates.rate("img") == pytest.approx(100 * 1.048576)  # the live sample is kept


def test_an_unforeseen_store_failure_keeps_its_traceback(caplog):
    rates = DecodeRates()
    rates.attach(_BrokenStore())
    with caplog.at_level(logging.WARNING, logger="tensor_server.catalog.decode_rates"):
        assert rates.rate("img") is None
    (record,) = caplog.records
    assert record.getMessage() == "decode rates: cannot load the stored rows; measuring afresh"
    assert record.exc_info[0] is KeyError
