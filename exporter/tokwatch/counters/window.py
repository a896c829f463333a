"""The `CounterWindow` implementation: server counters snapshotted around one timed run -> tok/s.

`ServerCounterWindow(fetch)` takes an async callable returning the server's current `CounterReading` (or
None when /metrics could not be read); `ServerCounters.window` (tokwatch.counters.scraper) builds one for
each endpoint. The probe calls `snapshot()` right before the timed request and again after its response
completed, then `measure(before, after)`. The rules are in docs/methodology.md ("Server counters").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tokwatch.counters.reading import CounterReading, delta, delta_from_zero, reset_between
from tokwatch.figures.wording import counted_value
from tokwatch.probes.base import CounterMeasurement

# Above this a counter delta is a unit or bookkeeping error, not a decode speed.
MAX_PLAUSIBLE_TPS = 1_000_000.0


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """One reading taken for a timed run, with the monotonic time it was taken."""

    reading: CounterReading
    at: float


def _none(reason: str) -> CounterMeasurement:
    return CounterMeasurement(tokens_per_second=None, shared=False, reason=reason)


def _contamination(before: CounterReading, after: CounterReading) -> list[str]:
    """Signs that requests other than the timed one ran on the server during the window."""
    reasons: list[str] = []
    finished = delta_from_zero(before.finished_requests, after.finished_requests)
    if finished is not None and finished > 1:
        reasons.append(f"{counted_value(finished, 'request')} finished in the window")
    if before.running is not None and before.running > 0:
        reasons.append(f"{counted_value(before.running, 'request')} running before the run")
    # The after snapshot may still count the timed request itself for a moment, so one is tolerated.
    if after.running is not None and after.running > 1:
        reasons.append(f"{counted_value(after.running, 'request')} running after the run")
    for side, reading in (("before", before), ("after", after)):
        if reading.waiting is not None and reading.waiting > 0:
            reasons.append(f"{counted_value(reading.waiting, 'request')} waiting {side} the run")
    preempted = delta_from_zero(before.preemptions, after.preemptions)
    if preempted is not None and preempted > 0:
        reasons.append(f"{preempted:g} preemptions in the window")
    calls = delta(before.decode_calls, after.decode_calls)
    tokens = delta(before.generation_tokens, after.generation_tokens)
    if calls is not None and tokens is not None and tokens > calls:
        # llama.cpp: one sequence gets at most one token per llama_decode() call.
        reasons.append(f"{tokens:g} tokens from {calls:g} decode calls (batched with other requests)")
    return reasons


def measure_readings(before: CounterReading | None, after: CounterReading | None) -> CounterMeasurement:
    """Decode tok/s of the one run between two readings, flagged `shared` when others ran alongside it."""
    if before is None or after is None:
        return _none(f"server /metrics unreadable {'before' if before is None else 'after'} the run")
    for reading in (before, after):
        if reading.problem:
            return _none(reading.problem)
    reset = reset_between(before, after)
    if reset:
        return _none(f"server counters reset between snapshots ({reset})")
    if before.basis is None or before.basis != after.basis:
        return _none(f"{after.server} exposes no decode-time counters")
    finished = delta_from_zero(before.finished_requests, after.finished_requests)
    if finished is not None and finished < 1:
        return _none("the run is not in the server's finished-request counters yet")
    tokens = delta(before.decode_tokens, after.decode_tokens)
    seconds = delta(before.decode_seconds, after.decode_seconds)
    if tokens is None or seconds is None or tokens <= 0 or seconds <= 0:
        return _none("no decode time recorded in the window")
    tps = tokens / seconds
    if tps > MAX_PLAUSIBLE_TPS:
        return _none(f"implausible counter rate {tps:.3g} tok/s")
    reasons = _contamination(before, after)
    return CounterMeasurement(
        tokens_per_second=tps, shared=bool(reasons), reason="; ".join(reasons) if reasons else None
    )


class ServerCounterWindow:
    """CounterWindow over one server's /metrics."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[CounterReading | None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._clock = clock

    async def snapshot(self) -> WindowSnapshot | None:
        """The server's counters now, or None when /metrics could not be read (already counted and logged)."""
        reading = await self._fetch()
        return None if reading is None else WindowSnapshot(reading, self._clock())

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement:
        """Decode tok/s between two `snapshot()` results; the reason says why a figure is missing."""
        return measure_readings(
            before.reading if isinstance(before, WindowSnapshot) else None,
            after.reading if isinstance(after, WindowSnapshot) else None,
        )
