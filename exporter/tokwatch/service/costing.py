"""A timed run's cost and energy, set on its result after the run and before any sink takes it
(docs/methodology.md, "Cost and energy": "Per probe run")."""

from __future__ import annotations

import time

from tokwatch.counters.power_watch import PowerWatch
from tokwatch.figures.energy import run_energy
from tokwatch.figures.result import RunResult
from tokwatch.figures.run_cost import (
    RunCost,
    counted_tokens,
    hosted_run_cost,
    phase_times,
    self_hosted_run_cost,
)
from tokwatch.settings.pricing import Pricing

ENERGY_WAIT_INTERVALS = 3  # how many sampling intervals a run waits for the reading after its end


def run_interval(result: RunResult) -> tuple[float, float] | None:
    """The timed run's interval on the `time.monotonic` clock the power samples are stamped on."""
    if result.duration_s is None or result.duration_s <= 0:
        return None
    t0 = result.started_at - (time.time() - time.monotonic())
    return t0, t0 + result.duration_s


async def measure_energy(result: RunResult, watch: PowerWatch) -> None:
    """Set the run's energy from its power source: total, the idle baseline, the net above it."""
    interval = run_interval(result)
    if interval is None:
        return
    reading = await watch.energy(*interval, wait_s=ENERGY_WAIT_INTERVALS * watch.interval_s + 2.0)
    if reading is None:
        return
    energy = run_energy(reading.total_j, reading.idle_watts, interval[1] - interval[0])
    result.energy_j = energy.total_j
    result.energy_idle_watts = reading.idle_watts
    result.energy_net_j = energy.net_j if reading.idle_watts is not None else None


def price_run(result: RunResult, pricing: Pricing, blend: tuple[float, float]) -> RunCost | None:
    """What the run cost at `pricing` (hosted prices first, else the hourly price), set on the result; None
    when the run has no server-counted tokens or no time to charge."""
    tokens = counted_tokens(result)
    if tokens is None:
        return None
    price = pricing.token_price()
    cost: RunCost | None = None
    if price is not None:
        cost = hosted_run_cost(price, tokens, blend)
    elif (times := phase_times(result)) is not None:
        cost = self_hosted_run_cost(
            pricing.hourly, tokens, *times, energy_j=result.energy_j, per_kwh=pricing.kwh, blend=blend
        )
    if cost is None:
        return None
    result.cost = cost.cost
    result.cost_currency = pricing.currency
    result.cost_method = cost.method
    result.cost_prompt_per_mtok = cost.prompt_per_mtok
    result.cost_generation_per_mtok = cost.generation_per_mtok
    result.cost_blended_per_mtok = cost.blended_per_mtok
    return cost
