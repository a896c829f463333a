"""Log volume control that never hides a distinct problem.

`RepeatThrottle` collapses repeats of one message (same logger, level, template and text) into a count; a
different message, including the same template with other values (another config error, another host),
always passes. `BurstLog` turns a burst of one kind of event (runs dropped) into one line with the count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

# `log.error(..., extra={ALWAYS_LOG: True})`: a record the throttle must pass (e.g. a burst's summary).
ALWAYS_LOG = "tokwatch_always_log"
_MAX_MESSAGES = 1000  # distinct messages remembered; messages are few, the table is bounded anyway


def _times(n: int) -> str:
    return "1 time" if n == 1 else f"{n} times"


class RepeatThrottle(logging.Filter):
    """A WARNING-or-worse message passes once per `period_s`; its repeats within the period are held and
    counted, and the next time it passes it says "(repeated N times in the last 60s)". Messages differing
    in their text are different messages. INFO and below (one line per failed run, one per round) are never
    held, nor records marked with `ALWAYS_LOG`."""

    def __init__(self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._period = period_s
        self._clock = clock
        self._seen: dict[tuple[str, int, str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, ALWAYS_LOG, False):
            return True
        text = record.getMessage()
        key = (record.name, record.levelno, str(record.msg), text)
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._period:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        held = last[1] if last is not None else 0
        self._seen[key] = (now, 0)
        if len(self._seen) > _MAX_MESSAGES:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._period}
        if held:
            record.msg = f"{text} (repeated {_times(held)} in the last {self._period:g}s)"
            record.args = None
        return True


class BurstLog:
    """Counts events of one kind and logs one line per burst with the count: when `quiet_s` pass without a
    new event, or every `max_s` while they keep coming. The line bypasses `RepeatThrottle`.

    `message(count, seconds)` builds the line. Outside an event loop (a worker thread, a shutdown) the count
    is logged at once."""

    def __init__(
        self,
        logger: logging.Logger,
        level: int,
        message: Callable[[int, float], str],
        *,
        quiet_s: float = 1.0,
        max_s: float = 60.0,
    ) -> None:
        self._logger = logger
        self._level = level
        self._message = message
        self._quiet = quiet_s
        self._max = max_s
        self._count = 0
        self._first = self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, n: int = 1) -> None:
        """Count `n` events of the current burst (a new burst starts after a quiet period)."""
        if n <= 0:
            return
        now = time.monotonic()
        if self._count == 0:
            self._first = now
        self._count += n
        self._last = now
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(self._quiet, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._count == 0:
            return
        now = time.monotonic()
        end = min(self._last + self._quiet, self._first + self._max)
        if now >= end:
            self.flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(end - now, self._due)

    def flush(self) -> None:
        """Log the burst so far (if any) now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._count:
            count, seconds = self._count, self._last - self._first
            self._count = 0
            self._logger.log(self._level, self._message(count, seconds), extra={ALWAYS_LOG: True})
