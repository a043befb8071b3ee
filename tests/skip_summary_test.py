"""The run's summary names the real-sample tests it skipped and how to provide the samples
(tests/conftest.py's ``pytest_terminal_summary``)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import NO_SAMPLES, pytest_terminal_summary, real_sample_skips


def _skip(reason: str) -> SimpleNamespace:
    return SimpleNamespace(longrepr=("tests/conftest.py", 30, f"Skipped: {reason}"))


def test_the_real_sample_skips_are_counted_and_the_way_to_run_them_is_named():
    skipped = [_skip(f"{NO_SAMPLES}: expected ../shared/testdata/expected.json")] * 3 + [
        _skip("luxar is not installed")
    ]
    line = real_sample_skips(skipped)
    assert line is not None and line.startswith("3 real-sample tests skipped: set TENSOR_SERVER_TESTDATA=")
    assert "../shared/testdata" in line and "SOURCES.md" in line


def test_no_line_when_no_real_sample_test_skipped():
    assert real_sample_skips([_skip("luxar is not installed")]) is None
    assert real_sample_skips([]) is None


def test_the_hook_writes_the_line_after_the_other_summaries():
    written: list[str] = []
    reporter = SimpleNamespace(
        stats={"skipped": [_skip(NO_SAMPLES)]}, write_line=lambda line, **markup: written.append(line)
    )
    wrapper = pytest_terminal_summary(reporter, 0, None)
    next(wrapper)  # the other summaries run here (-ra's skip list)
    assert written == []
    try:
        wrapper.send(None)
    except StopIteration:
        pass
    assert len(written) == 1 and written[0].startswith("1 real-sample tests skipped")
