"""What one timed probe run cost, hosted or self-hosted, as a pure function of its figures and the prices
(docs/methodology.md, "Cost and energy": "Per probe run").

Hosted (`list_price`): the tokens the server counted at the published prices. Self-hosted (`compute_time`):
the hardware's hour (plus the electricity the run drew, when a $/kWh is configured) charged to prefill and
decode by the time each took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tokwatch.figures.cost import (
    DEFAULT_BLEND,
    JOULES_PER_KWH,
    SECONDS_PER_HOUR,
    TokenCounts,
    TokenPrice,
    compute_time_split,
    run_cost,
)
from tokwatch.figures.result import RunResult

AllocationMethod = Literal["list_price", "compute_time"]


@dataclass(frozen=True, slots=True)
class RunCost:
    """One run's cost and its prices per Mtok by phase; a phase's price is None when the run did not measure
    it (no tokens or no time for that phase)."""

    method: AllocationMethod
    cost: float | None  # what the run cost, in the price's currency
    prompt_per_mtok: float | None
    generation_per_mtok: float | None
    blended_per_mtok: float | None
    includes_energy: bool = False  # a self-hosted figure with the run's electricity at the configured $/kWh


def counted_tokens(result: RunResult) -> TokenCounts | None:
    """The tokens the server counted for the run (reasoning counts as output); None without a server count."""
    if result.prompt_tokens is None or result.output_tokens is None:
        return None
    if result.tokens_source == "client_estimate":
        return None
    output = result.output_tokens + (result.think_tokens or 0)
    return TokenCounts(prompt=result.prompt_tokens, cached=result.cached_tokens or 0, output=output)


def phase_times(result: RunResult) -> tuple[float, float] | None:
    """(prefill s, decode s) of a run: TTFT, then the rest of its end-to-end time; None without both."""
    if result.ttft_s is None or result.e2e_s is None or result.e2e_s < result.ttft_s:
        return None
    return result.ttft_s, result.e2e_s - result.ttft_s


def hosted_run_cost(
    price: TokenPrice, tokens: TokenCounts, blend: tuple[float, float] = DEFAULT_BLEND
) -> RunCost:
    """A hosted run at list price: the run's cost from its counted tokens, the published prices by phase."""
    parts_in, parts_out = blend
    return RunCost(
        method="list_price",
        cost=run_cost(price, tokens),
        prompt_per_mtok=price.input_per_mtok,
        generation_per_mtok=price.output_per_mtok,
        blended_per_mtok=(parts_in * price.input_per_mtok + parts_out * price.output_per_mtok)
        / (parts_in + parts_out),
    )


def self_hosted_run_cost(
    hourly: float | None,
    tokens: TokenCounts,
    prefill_s: float,
    decode_s: float,
    *,
    energy_j: float | None = None,
    per_kwh: float | None = None,
    blend: tuple[float, float] = DEFAULT_BLEND,
) -> RunCost | None:
    """A self-hosted run by OpenCost's compute_time method: `hourly` (plus the run's `energy_j` at `per_kwh`,
    spread over the run's time) charged to each phase by its time and divided by its tokens. None when
    there is no hourly price and no priced energy."""
    seconds = prefill_s + decode_s
    energy_hourly = None
    if energy_j is not None and per_kwh is not None and seconds > 0:
        energy_hourly = energy_j / seconds * SECONDS_PER_HOUR / JOULES_PER_KWH * per_kwh
    if hourly is None and energy_hourly is None:
        return None
    split = compute_time_split(
        (hourly or 0.0) + (energy_hourly or 0.0), prefill_s, decode_s, tokens.prompt, tokens.output
    )
    blended = None
    if split.prompt_per_mtok is not None and split.generation_per_mtok is not None:
        parts_in, parts_out = blend
        blended = (parts_in * split.prompt_per_mtok + parts_out * split.generation_per_mtok) / (
            parts_in + parts_out
        )
    return RunCost(
        method="compute_time",
        cost=split.run_cost,
        prompt_per_mtok=split.prompt_per_mtok,
        generation_per_mtok=split.generation_per_mtok,
        blended_per_mtok=blended,
        includes_energy=energy_hourly is not None,
    )
