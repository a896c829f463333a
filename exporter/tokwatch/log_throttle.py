"""Repeated warnings once per period: an outage must not turn the log into a stream of the same line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RepeatThrottle(logging.Filter):
    """Lets a WARNING-or-worse message template through once per `period_s` per logger; counts the rest.

    The next record that passes says how many were held back, so nothing disappears without a trace.
    INFO and below (one line per failed run, one per round) are never throttled.
    """

    def __init__(self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._period = period_s
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._period:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        held = last[1] if last is not None else 0
        self._seen[key] = (now, 0)
        if len(self._seen) > 1000:  # message templates are few; bound the table anyway
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._period}
        if held:
            record.msg = f"{record.getMessage()} ({held} similar message(s) in the last {self._period:g}s)"
            record.args = None
        return True
