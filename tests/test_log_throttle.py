"""Repeated warnings pass once per period and say how many were held back; INFO is never held."""

from __future__ import annotations

import logging

from tokwatch.log_throttle import RepeatThrottle


def _record(level: int, msg: str, *args: object, name: str = "psycopg.pool") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_repeated_warning_passes_once_per_period_with_the_count() -> None:
    now = [0.0]
    throttle = RepeatThrottle(period_s=60, clock=lambda: now[0])
    template = "error connecting in %r: %s"
    assert throttle.filter(_record(logging.WARNING, template, "pool", "refused"))
    passed = [throttle.filter(_record(logging.WARNING, template, "pool", f"refused {i}")) for i in range(9)]
    assert not any(passed)
    other = _record(logging.WARNING, "storage: %s", "something else")
    assert throttle.filter(other)  # another message is not held back by the first
    now[0] = 61.0
    again = _record(logging.WARNING, template, "pool", "refused")
    assert throttle.filter(again)
    assert again.getMessage() == "error connecting in 'pool': refused (9 similar message(s) in the last 60s)"


def test_info_lines_are_never_throttled() -> None:
    throttle = RepeatThrottle(period_s=60, clock=lambda: 0.0)
    assert all(throttle.filter(_record(logging.INFO, "endpoint %s: timeout", "a")) for _ in range(5))
