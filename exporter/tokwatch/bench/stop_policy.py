"""When a run fails on its own account: a server that stopped answering, and too many failed requests.

`Silence` measures how long the server has not answered while the client was waiting for it (a request
in flight, or one that failed without any answer since the last byte): an idle client is not a silent
server, so a slow open loop never trips it. Docs: docs/bench.md ("Exit codes", "When a run fails").
"""

from __future__ import annotations

from collections.abc import Sequence

from tokwatch.bench.request_metrics import RequestRecord

DEFAULT_MAX_ERROR_RATE = 0.05  # --max-error-rate: a larger failure share fails the run (exit 5)
# --unresponsive-timeout: no byte for this long while waiting stops the run. Long enough for a long prompt's
# prefill on a CPU server with nothing else streaming (a 4k-token prompt at 200 tok/s takes 20 s).
DEFAULT_UNRESPONSIVE_S = 30.0
_CHECK_EVERY_S = 0.5  # the watchdog's own period (at most a quarter of the limit)


class Silence:
    """How long the server has not answered while the client waited for it (perf_counter seconds)."""

    def __init__(self, now: float) -> None:
        self.last_answer = now
        self.answered_once = False  # before any answer a cold model load may take long: not counted
        self._in_flight = 0
        self._unanswered_failure = False

    def sent(self, now: float) -> None:
        """A request is about to be sent; an idle client starts the clock now, not at the last answer."""
        if self._in_flight == 0 and not self._unanswered_failure:
            self.last_answer = max(self.last_answer, now)
        self._in_flight += 1

    def answered(self, now: float) -> None:
        """A byte of an answer (headers or body) arrived."""
        self.answered_once = True
        self._unanswered_failure = False
        if now > self.last_answer:
            self.last_answer = now

    def finished(self, got_answer: bool) -> None:
        """A request ended; one that never got a byte keeps the clock running after it."""
        self._in_flight -= 1
        if not got_answer:
            self._unanswered_failure = True

    def silent_for(self, now: float) -> float:
        """Seconds without an answer while waiting for one (0 while idle or before the first answer)."""
        if not self.answered_once or (self._in_flight == 0 and not self._unanswered_failure):
            return 0.0
        return max(0.0, now - self.last_answer)


def check_period(limit_s: float) -> float:
    """How often the watchdog looks: often enough that it fires within a quarter of the limit."""
    return min(_CHECK_EVERY_S, limit_s / 4)


def failure_share(measured: Sequence[RequestRecord]) -> float | None:
    """Failed (not `ok`) share of the measured requests; None without any."""
    if not measured:
        return None
    return sum(1 for r in measured if not r.ok) / len(measured)


def too_many_failures(share: float | None, limit: float | None) -> bool:
    """True when the failure share is above the limit (a limit of 1 never fails)."""
    return share is not None and limit is not None and share > limit
