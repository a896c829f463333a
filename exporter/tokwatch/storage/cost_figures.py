"""Each series' cost and energy from its counted runs of the last 24 h in the store (docs/methodology.md,
"Cost and energy"): what the status API, the endpoint view and the comparison page show."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokwatch.figures.cost_window import median_joules_per_output_token
from tokwatch.figures.series import SeriesKey
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.settings.pricing import Pricing
from tokwatch.storage.base import RunPoint, RunStore
from tokwatch.storage.factory import bench_store
from tokwatch.storage.window import WINDOW_S
from tokwatch.windows.cost import CapacityBasis, CostFigures, EnergyFigures, cost_figures
from tokwatch.windows.window_rule import WindowRule

Pricer = Callable[[str], tuple[Pricing, str] | None]
SeriesCost = tuple[CostFigures | None, EnergyFigures | None]


async def series_costs(
    store: RunStore, config: Config, now: float, pricing: Pricer
) -> tuple[dict[SeriesKey, SeriesCost], dict[str, CapacityBasis]]:
    """(cost, energy) of each series of the endpoints with prices or a power source, over their counted runs
    of the last 24 h: the prices now, the cache-hit share and the newest priced run; the median J/output
    token and the newest metered run's baseline and energy. Beside them, the latest stored capacity search
    of each self-hosted endpoint that has one (for its series without runs too)."""
    rule = WindowRule.of(config.schedule.window_includes)
    blend = config.pricing.blend_parts
    out: dict[SeriesKey, SeriesCost] = {}
    capacities: dict[str, CapacityBasis] = {}
    for ep in config.endpoints:
        priced = pricing(ep.name)
        if priced is None and not ep.power_metrics_url:
            continue
        runs = await store.recent_runs(now - WINDOW_S, None, endpoint=ep.name, rule=rule)
        capacity = await capacity_of(store, ep.name) if priced is not None and _self_hosted(priced) else None
        if capacity is not None:
            capacities[ep.name] = capacity
        for key, rs in runs.items():
            out[key] = series_cost(rs, priced, bool(ep.power_metrics_url), blend, capacity)
    return out, capacities


async def capacity_of(store: RunStore, endpoint: str) -> CapacityBasis | None:
    """The latest stored capacity search of an endpoint that found a rate with its output tokens/s."""
    row = await bench_store(store).latest_capacity(endpoint)
    if row is None or row.result_rate is None or not row.output_tokens_per_s:
        return None
    return CapacityBasis(row.mode, row.result_rate, row.output_tokens_per_s, row.finished_at, row.lower_bound)


def _self_hosted(priced: tuple[Pricing, str]) -> bool:
    return priced[0].token_price() is None and priced[0].hourly is not None


def series_cost(
    runs_newest_first: Sequence[RunPoint],
    priced: tuple[Pricing, str] | None,
    metered: bool,
    blend: tuple[float, float],
    capacity: CapacityBasis | None = None,
) -> SeriesCost:
    """(cost, energy) of one series from its counted runs, newest first: the cache-hit share and the newest
    priced run; the median J/output token and the newest metered run's baseline and energy."""
    rs = runs_newest_first
    last_priced = next((r for r in rs if r.cost is not None), None)
    newest_metered = next((r for r in rs if r.energy_j is not None), None)
    cost = None if priced is None else cost_figures(priced, rs, last_priced, blend, capacity)
    energy = None
    if metered:
        energy = EnergyFigures(
            joules_per_output_token=median_joules_per_output_token(rs),
            idle_watts=newest_metered.energy_idle_watts if newest_metered is not None else None,
            joules_last_run=newest_metered.energy_j if newest_metered is not None else None,
        )
    return cost, energy


def priced_only(
    ep: EndpointSettings, config: Config, pricing: Pricer, capacity: CapacityBasis | None = None
) -> SeriesCost:
    """A series without runs in the last 24 h: its prices (and price at capacity) alone, energy figures
    unknown."""
    priced = pricing(ep.name)
    cost = None if priced is None else cost_figures(priced, (), None, config.pricing.blend_parts, capacity)
    return cost, EnergyFigures(None, None, None) if ep.power_metrics_url else None
