"""The wall clock of a run split over machines: a common start (`--start-at`), the mapping between this
process's wall clock and its perf_counter stamps, and this clock's offset from a reference clock.

Stamps inside a process stay perf_counter (monotonic, never stepped); only the start instant and the
stored times go through the wall clock, which is where machines can disagree (docs/bench.md, "Past one
machine").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

_BRACKETS = 200  # wall/perf reads bracketed, the tightest kept
# A process ready this long after the common start has missed it: its first arrivals would go out at once.
START_TOLERANCE_S = 0.1


class StartAtError(ValueError):
    """A `--start-at` value that is not a time."""


class StartMissed(Exception):
    """The process was ready (warm-up done) only after the common start."""


def parse_start_at(value: object) -> float:
    """Unix seconds, from unix seconds (a number or its text) or an RFC 3339 time with its zone."""
    if isinstance(value, bool):
        raise StartAtError(f"start_at {value!r}: expected unix seconds or an RFC 3339 time")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise StartAtError(
            f"start_at {text!r}: expected unix seconds or an RFC 3339 time such as 2025-05-01T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        raise StartAtError(f"start_at {text!r}: give the zone (Z or +HH:MM); machines may not share one")
    return when.timestamp()


def wall_minus_perf() -> float:
    """time.time() - time.perf_counter() now, from the tightest of a few bracketed reads (about 1 us)."""
    best_width, best = float("inf"), 0.0
    for _ in range(_BRACKETS):
        a = time.perf_counter()
        wall = time.time()
        b = time.perf_counter()
        if b - a < best_width:
            best_width, best = b - a, wall - (a + b) / 2
    return best


def perf_at(wall: float) -> float:
    """The time.perf_counter() instant at which this machine's wall clock reads `wall`."""
    return wall - wall_minus_perf()


def check_start(start_perf: float) -> float:
    """`start_perf`, or StartMissed when it has passed by more than START_TOLERANCE_S."""
    late = time.perf_counter() - start_perf
    if late > START_TOLERANCE_S:
        raise StartMissed(
            f"ready {late:.3f} s after the common start: the start was too close (give a later --start-at "
            "or a longer --start-delay, or a shorter warm-up)"
        )
    return start_perf


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """A reference clock minus this machine's wall clock, within +- `error_s` (half the round trip)."""

    offset_s: float
    error_s: float
    reference: str


async def measure_offset(
    read_reference: Callable[[], Awaitable[float]], reference: str, samples: int = 8
) -> ClockOffset:
    """NTP's estimate against `read_reference()` (the reference's unix time): the sample with the shortest
    round trip, its midpoint taken as the instant the reference was read."""
    best: ClockOffset | None = None
    for _ in range(samples):
        before = time.time()
        ref = await read_reference()
        after = time.time()
        half = (after - before) / 2
        if best is None or half < best.error_s:
            best = ClockOffset(ref - (before + half), half, reference)
    assert best is not None
    return best
