"""Request arrival schedules as offsets from the run start, so pacing is against absolute time.

Sleeping a relative interval after each send drifts below the requested rate (every send adds its own
overhead); here each request has a planned time `t0 + offset` and the sender waits for that instant.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Literal

ArrivalKind = Literal["constant", "poisson", "gamma"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = ("constant", "poisson", "gamma")


def interarrival_gaps(kind: ArrivalKind, rate: float, seed: int, burstiness: float = 1.0) -> Iterator[float]:
    """Endless gaps (seconds) between arrivals with mean 1/rate; deterministic for a seed.

    Gamma uses shape=`burstiness`, scale=1/(rate*burstiness): burstiness 1 is Poisson, < 1 burstier,
    > 1 more regular (the same parametrisation as vllm bench serve).
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")
    rng = random.Random(seed)
    mean = 1.0 / rate
    while True:
        if kind == "constant":
            yield mean
        elif kind == "poisson":
            yield rng.expovariate(rate)
        elif kind == "gamma":
            yield rng.gammavariate(burstiness, mean / burstiness)
        else:
            raise ValueError(f"unknown arrival kind {kind!r}")


def arrival_offsets(kind: ArrivalKind, rate: float, seed: int, burstiness: float = 1.0) -> Iterator[float]:
    """Endless planned send times in seconds after the run start; the first request goes at 0."""
    offset = 0.0
    gaps = interarrival_gaps(kind, rate, seed, burstiness)
    while True:
        yield offset
        offset += next(gaps)


def achieved_rate(send_times: list[float]) -> float | None:
    """Requests per second between the first and the last send (n-1 intervals), None for < 2 sends."""
    if len(send_times) < 2:
        return None
    span = max(send_times) - min(send_times)
    return (len(send_times) - 1) / span if span > 0 else None


async def sleep_until(deadline: float) -> None:
    """Wait until `time.perf_counter()` reaches `deadline` (absolute), without accumulating drift."""
    # perf_counter and the loop clock are both CLOCK_MONOTONIC on Linux; the remaining time is recomputed
    # from the clock each pass so a wake-up rounded by the selector never shifts later arrivals.
    while (remaining := deadline - time.perf_counter()) > 0:  # noqa: ASYNC110 - a clock, not an event
        await asyncio.sleep(remaining)
