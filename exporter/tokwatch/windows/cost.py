"""A series' cost and energy figures from its prices and its window's runs (docs/methodology.md, "Cost and
energy"): one definition for /metrics (runs in memory), the status API, the status page and the report
(runs from the store)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from tokwatch.figures.cost import (
    DEFAULT_BLEND,
    blended_price,
    effective_blended_price,
    effective_input_price,
    per_mtok_at_rate,
)
from tokwatch.figures.cost_window import CostedRun, cache_hit_share
from tokwatch.settings.pricing import Pricing


@dataclass(frozen=True, slots=True)
class CapacityBasis:
    """The latest stored capacity search of an endpoint (`tokwatch bench --search fluid|slo`): the rate it
    found and the output tokens/s measured at it."""

    mode: str  # "fluid" or "slo"
    rate: float  # requests/s
    output_tokens_per_s: float
    measured_at: float  # unix seconds the search finished
    lower_bound: bool  # no rate failed: the capacity is at least this


@dataclass(frozen=True, slots=True)
class CostFigures:
    """One series' cost figures now (the status API's `cost`); a field is None when not known."""

    currency: str
    source: str
    input_per_mtok: float | None
    output_per_mtok: float | None
    cached_input_per_mtok: float | None
    blended_per_mtok: float | None
    effective_per_mtok: float | None
    prompt_per_mtok: float | None
    generation_per_mtok: float | None
    allocation_method: str | None
    last_run_cost: float | None
    cache_hit_share: float | None
    effective_prompt_per_mtok: float | None = None
    # Self-hosted: the hourly price over the output tokens/s of the latest stored capacity search.
    capacity_per_mtok: float | None = None
    capacity: CapacityBasis | None = None


@dataclass(frozen=True, slots=True)
class EnergyFigures:
    """One series' energy figures now (the status API's `energy`)."""

    joules_per_output_token: float | None
    idle_watts: float | None
    joules_last_run: float | None


class PricedRun(CostedRun, Protocol):
    """The fields of a priced run the cost figures read."""

    @property
    def cost(self) -> float | None: ...
    @property
    def cost_prompt_per_mtok(self) -> float | None: ...
    @property
    def cost_generation_per_mtok(self) -> float | None: ...
    @property
    def cost_blended_per_mtok(self) -> float | None: ...


def cost_figures(
    priced: tuple[Pricing, str],
    runs: Iterable[CostedRun],
    last: PricedRun | None,
    blend: tuple[float, float] = DEFAULT_BLEND,
    capacity: CapacityBasis | None = None,
) -> CostFigures:
    """A series' cost figures from its prices and where they came from, its window's runs (the cache-hit
    share) and its last priced run (the run's cost; a self-hosted series' compute-time prices)."""
    pricing, source = priced
    price = pricing.token_price()
    share = cache_hit_share(runs)
    last_cost = last.cost if last is not None else None
    if price is not None:
        return CostFigures(
            currency=pricing.currency,
            source=source,
            input_per_mtok=price.input_per_mtok,
            output_per_mtok=price.output_per_mtok,
            cached_input_per_mtok=price.cached_input_per_mtok,
            blended_per_mtok=blended_price(price, blend),
            effective_per_mtok=None if share is None else effective_blended_price(price, share, blend),
            prompt_per_mtok=price.input_per_mtok,
            generation_per_mtok=price.output_per_mtok,
            allocation_method="list_price",
            last_run_cost=last_cost,
            cache_hit_share=share,
            effective_prompt_per_mtok=None if share is None else effective_input_price(price, share),
        )
    hourly = pricing.hourly
    at_capacity = None
    if capacity is not None and hourly is not None:
        at_capacity = per_mtok_at_rate(hourly, capacity.output_tokens_per_s)
    return CostFigures(
        currency=pricing.currency,
        source=source,
        input_per_mtok=None,
        output_per_mtok=None,
        cached_input_per_mtok=None,
        blended_per_mtok=last.cost_blended_per_mtok if last is not None else None,
        effective_per_mtok=None,
        prompt_per_mtok=last.cost_prompt_per_mtok if last is not None else None,
        generation_per_mtok=last.cost_generation_per_mtok if last is not None else None,
        allocation_method="compute_time",
        last_run_cost=last_cost,
        cache_hit_share=share,
        capacity_per_mtok=at_capacity,
        capacity=capacity if at_capacity is not None else None,
    )
