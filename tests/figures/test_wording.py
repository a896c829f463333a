"""Counts in messages and pages: one of a thing is singular, everywhere (issue 36: "1 servers")."""

from __future__ import annotations

from tokwatch.figures.wording import counted, counted_value
from tokwatch.statuspage import svg
from tokwatch.storage.base import RunPoint


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert [counted(n, "server") for n in (0, 1, 2)] == ["0 servers", "1 server", "2 servers"]
    assert counted(1, "torn or unreadable record") == "1 torn or unreadable record"
    assert counted(3, "series", "series") == "3 series"
    assert [counted_value(x, "request") for x in (1.0, 2.0, 0.5)] == [
        "1 request",
        "2 requests",
        "0.5 requests",
    ]


def test_a_sparkline_of_one_run_says_one_run() -> None:
    one = RunPoint(1.0, "ok", 50.0, "engine", None, None, None, None, None, "scheduled", False)
    assert 'aria-label="1 recent run, 0 not ok"' in svg.sparkline([one])
