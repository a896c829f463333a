"""Cost and energy of the endpoints with prices or a power source: per-series figures kept from the timed
runs, for /metrics, the status API and the endpoint view (docs/metrics.md, "Cost and energy";
docs/methodology.md, "Cost and energy").

Names, types and labels are the contract in docs/metrics.md. Nothing is exported for an endpoint without
`pricing` or `power_metrics_url`, so the default series budget does not move. Sample::

    tokwatch_pricing_info{endpoint="a",currency="USD",source="openrouter"} 1.0
    tokwatch_cost_per_million_tokens{endpoint="a",workload="seed000",phase="blended",allocation_method="effective"} 3.75
    tokwatch_probe_cost_total{endpoint="a",workload="seed000"} 0.0123
    tokwatch_energy_joules_per_output_token{endpoint="b",workload="seed000"} 0.42
    tokwatch_energy_idle_watts{endpoint="b"} 120.0
    tokwatch_price_source_last_refresh_timestamp_seconds{source="openrouter"} 1.7e+09
    tokwatch_price_source_refresh_failures_total{source="openrouter"} 0.0
"""  # noqa: E501

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokwatch.figures.cost import DEFAULT_BLEND
from tokwatch.figures.cost_window import median_joules_per_output_token
from tokwatch.figures.result import RunResult
from tokwatch.figures.series import NO_SITE
from tokwatch.metrics.probe import LabelSet
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.pricing import Pricing
from tokwatch.windows.cost import CapacityBasis, CostFigures, EnergyFigures, cost_figures

PHASES = ("prompt", "generation", "blended")


class WindowRun(NamedTuple):
    """What the window figures need of a run (a RunResult keeps its token gaps: far more than this)."""

    started_at: float
    prompt_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    think_tokens: int | None
    energy_net_j: float | None

    @classmethod
    def of(cls, r: RunResult) -> WindowRun:
        """From a recorded run."""
        tokens = (r.prompt_tokens, r.cached_tokens, r.output_tokens, r.think_tokens)
        return cls(r.started_at, *tokens, r.energy_net_j)


@dataclass
class CostState:
    """What the cost collector knows of one endpoint's runs of one workload."""

    settings: EndpointSettings
    workload: str
    runs: deque[WindowRun] = field(default_factory=deque)  # the window's priced or metered runs
    cost_total: float = 0.0
    last_priced: RunResult | None = None
    last_energy: RunResult | None = None


class CostBook(Collector):
    """Per-series cost and energy from the runs recorded since start-up (the in-memory window of
    `schedule.window`), with each endpoint's resolved prices and its power source's idle baseline."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], CostState] = {}
        self._pricing: Callable[[str], tuple[Pricing, str] | None] = lambda _: None
        self._priceable: set[str] = set()
        self._powered: set[str] = set()
        self._labels = LabelSet(())
        self._blend = DEFAULT_BLEND
        self._window_s = 86400.0
        self._idle: Callable[[str], float | None] = lambda _: None
        self._sources: Callable[[], Mapping[str, tuple[float | None, int]]] = dict
        self._capacity: dict[str, CapacityBasis] = {}

    def set_capacities(self, capacities: Mapping[str, CapacityBasis]) -> None:
        """The latest stored capacity search of each self-hosted endpoint that has one."""
        self._capacity = dict(capacities)

    def configure(
        self,
        endpoints: Sequence[EndpointSettings],
        workloads: Mapping[str, Sequence[str]],
        pricing: Callable[[str], tuple[Pricing, str] | None],
        priceable: Iterable[str],
        *,
        blend: tuple[float, float] = DEFAULT_BLEND,
        window_s: float = 86400.0,
        site: str = NO_SITE,
        idle_watts: Callable[[str], float | None] | None = None,
        sources: Callable[[], Mapping[str, tuple[float | None, int]]] | None = None,
    ) -> None:
        """Apply a (re)loaded config: the endpoints, their workloads, the endpoints that may have prices
        (`priceable`) and how to find an endpoint's prices now; runs of series that stay are kept."""
        self._pricing = pricing
        self._priceable = set(priceable)
        self._powered = {ep.name for ep in endpoints if ep.power_metrics_url}
        states: dict[tuple[str, str], CostState] = {}
        for ep in endpoints:
            if ep.name not in self._priceable and ep.name not in self._powered:
                continue
            for w in workloads.get(ep.name, ()):
                state = self._states.get((ep.name, w)) or CostState(ep, w)
                state.settings = ep
                states[(ep.name, w)] = state
        self._states = states
        self._labels = LabelSet(endpoints, site)
        self._blend, self._window_s = blend, window_s
        if idle_watts is not None:
            self._idle = idle_watts
        if sources is not None:
            self._sources = sources

    def record(self, result: RunResult) -> None:
        """Account one timed run's cost and energy."""
        state = self._states.get((result.endpoint, result.workload))
        if state is None:
            return
        if result.cost is not None:
            state.cost_total += result.cost
            state.last_priced = result
        if result.energy_j is not None:
            state.last_energy = result
        if result.cost is not None or result.energy_j is not None or result.prompt_tokens is not None:
            state.runs.append(WindowRun.of(result))
        horizon = result.started_at - self._window_s
        while state.runs and state.runs[0].started_at < horizon:
            state.runs.popleft()

    def cost(self, name: str, workload: str) -> CostFigures | None:
        """The series' cost figures; None when the endpoint has no prices."""
        state = self._states.get((name, workload))
        priced = self._pricing(name) if name in self._priceable else None
        if priced is None or state is None:
            return None
        return cost_figures(priced, state.runs, state.last_priced, self._blend, self._capacity.get(name))

    def energy(self, name: str, workload: str) -> EnergyFigures | None:
        """The series' energy figures; None when the endpoint has no power source."""
        state = self._states.get((name, workload))
        if name not in self._powered or state is None:
            return None
        last = state.last_energy
        return EnergyFigures(
            joules_per_output_token=median_joules_per_output_token(state.runs),
            idle_watts=self._idle(name),
            joules_last_run=last.energy_j if last is not None else None,
        )

    def describe(self) -> Iterable[Metric]:
        """Families depend on the config: described lazily."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The cost and energy families of the priced or metered series, and the price sources'."""
        base, run = self._labels.names, self._labels.run_names
        info = GaugeMetricFamily(
            "tokwatch_pricing_info",
            "Where each priced endpoint's prices come from and their currency; always 1.",
            labels=[*base, "currency", "source"],
        )
        per_mtok = GaugeMetricFamily(
            "tokwatch_cost_per_million_tokens",
            "Price per million tokens in the endpoint's currency by phase and allocation method "
            "(OpenCost's llm_cost_per_million_tokens).",
            labels=[*run, "phase", "allocation_method"],
        )
        total = CounterMetricFamily(
            "tokwatch_probe_cost",
            "What the timed probe runs themselves cost, in the endpoint's currency, since start-up.",
            labels=run,
        )
        per_token = GaugeMetricFamily(
            "tokwatch_energy_joules_per_output_token",
            "Median over the window of the timed runs' energy above the idle baseline per output token.",
            labels=run,
        )
        idle = GaugeMetricFamily(
            "tokwatch_energy_idle_watts",
            "The idle baseline of the endpoint's power source: median power with no probe running.",
            labels=base,
        )
        seen: set[str] = set()
        for (name, workload), state in self._states.items():
            ep = state.settings
            lv, rv = self._labels.values(ep), self._labels.run_values(ep, workload)
            cost = self.cost(name, workload)
            if cost is not None:
                if name not in seen:
                    info.add_metric([*lv, cost.currency, cost.source], 1.0)
                total.add_metric(rv, state.cost_total)
                for method, phase, value in _per_mtok_series(cost):
                    per_mtok.add_metric([*rv, phase, method], value)
            energy = self.energy(name, workload)
            if energy is not None:
                if energy.joules_per_output_token is not None:
                    per_token.add_metric(rv, energy.joules_per_output_token)
                if name not in seen and energy.idle_watts is not None:
                    idle.add_metric(lv, energy.idle_watts)
            seen.add(name)
        for fam in (info, per_mtok, total, per_token, idle):
            if fam.samples:
                yield fam
        yield from _source_families(self._sources())


def _per_mtok_series(cost: CostFigures) -> Iterator[tuple[str, str, float]]:
    """(allocation_method, phase, value) of each price the figures know."""
    method = cost.allocation_method or "list_price"
    for phase, value in zip(
        PHASES, (cost.prompt_per_mtok, cost.generation_per_mtok, cost.blended_per_mtok), strict=True
    ):
        if value is not None:
            yield method, phase, value
    if cost.effective_prompt_per_mtok is not None:
        yield "effective", "prompt", cost.effective_prompt_per_mtok
    if cost.effective_per_mtok is not None:
        yield "effective", "blended", cost.effective_per_mtok
    if cost.capacity_per_mtok is not None:
        yield "capacity", "generation", cost.capacity_per_mtok


def _source_families(sources: Mapping[str, tuple[float | None, int]]) -> Iterator[Metric]:
    if not sources:
        return
    last = GaugeMetricFamily(
        "tokwatch_price_source_last_refresh_timestamp_seconds",
        "Unix time each configured price source was last read successfully.",
        labels=["source"],
    )
    failures = CounterMetricFamily(
        "tokwatch_price_source_refresh_failures",
        "Reads of each configured price source that failed (the prices it had are kept).",
        labels=["source"],
    )
    for source, (at, failed) in sorted(sources.items()):
        if at is not None:
            last.add_metric([source], at)
        failures.add_metric([source], float(failed))
    yield last
    yield failures
