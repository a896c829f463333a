"""The series budget of /metrics (docs/metrics.md, "Series budget"): at most 50 series per endpoint-workload
by default once the window percentiles have their samples, every opt-in adds its families, and no series
churns from round to round (issue 36). Against the simulator, with an exporter at a site."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.sim import StartSim
from tokwatch.figures.result import RunResult
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round
from tokwatch.settings.config import load_config_text
from tokwatch.windows.window_percentiles import MIN_SAMPLES

BUDGET = 50  # series per endpoint-workload, default settings
ENDPOINTS = 4
WORKLOADS = (
    "seed000",
    "{name: short, input_tokens: 100, output_tokens: 16}",
    "{name: long, input_tokens: 800, output_tokens: 16}",
)
OPTED_IN = "metrics: {windows: [30m, 24h, 72h, 7d], histograms: true, diagnostics: true}"

# Equal true speeds with jitter: the ranking of the endpoints changes from round to round. The simulator
# runs on the test's own loop and keeps an absolute token schedule, so a stall of that loop puts the overdue
# tokens on the wire at once; 10 ms gaps (rather than 2.5 ms) make a whole 16-token answer arriving as one
# burst, which the probe rightly calls `implausible_rate`, need a stall of 150 ms, not 40 ms, on a loaded
# CI host.
SIM = {
    "name": "v",
    "dialect": "vllm",
    "max_running": 64,
    "models": [
        {"name": f"m{i}", "decode_tps": 100, "prefill_tps": 40000, "jitter": 0.3} for i in range(ENDPOINTS)
    ],
}
# Where no status is asserted (a burst's `implausible_rate` run adds its series for good, churning none), the
# ten rounds run four times faster.
FAST_SIM = {**SIM, "models": [{**m, "decode_tps": 400} for m in SIM["models"]]}


def _config(sim_url: str, extra: str = "") -> str:
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: vllm, base_url: '{sim_url}/v/v1', model: m{i}, "
        f"labels: {{provider: p{i % 2}}}}}"
        for i in range(ENDPOINTS)
    )
    return f"""
site: lab
probe: {{max_tokens: 16, warmup: false, workloads: [{", ".join(WORKLOADS)}]}}
schedule: {{interval: 1h, run_on_start: false, per_server: 4, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
{extra}
endpoints:
{lines}
"""


async def _round(app: App) -> list[RunResult]:
    """One scheduled round; its timed runs."""
    runs: list[RunResult] = []
    record = app.probes.record

    def keep(result: RunResult) -> None:
        runs.append(result)
        record(result)

    app.probes.record = keep  # type: ignore[method-assign]
    try:
        await run_round(app._schedule_settings()[2], app.probes.probe_target)
    finally:
        app.probes.record = record  # type: ignore[method-assign]
    return runs


def _series(app: App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by name and labels."""
    text = app.exposition.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _per_endpoint_workload(series: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> Counter[str]:
    """Series carrying an endpoint, by family name (sample name without the histogram suffixes)."""
    out: Counter[str] = Counter()
    for name, labels in series:
        if "endpoint" in dict(labels):
            out[name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")] += 1
    return out


@contextlib.asynccontextmanager
async def _exporter(
    start_sim: StartSim, extra: str = "", sim_config: dict[str, Any] = SIM
) -> AsyncIterator[App]:
    """A started exporter (no scheduler: the test runs its rounds) probing the simulator."""
    sim = await start_sim(sim_config)
    app = App(load_config_text(_config(sim.url, extra)), instance="budget")
    await app.start(schedule=False)
    try:
        yield app
    finally:
        await app.stop()


async def _fill(app: App) -> None:
    """Two real rounds, each series' windows then filled to the p99's sample count with copies of its real
    runs (as four days of hourly rounds would)."""
    runs = (await _round(app)) + (await _round(app))
    assert {r.status.value for r in runs} == {"ok"}, [r.error_class for r in runs if not r.ok]
    for i in range(MIN_SAMPLES[0.99]):
        for r in runs[: len(runs) // 2]:
            copy = dataclasses.replace(r, run_id=f"{r.run_id}-{i}", started_at=r.started_at + i)
            app.probes.record(dataclasses.replace(copy, set_aside={}, timing_disturbed=False))


async def test_default_series_fit_the_budget_and_the_opt_ins_add_theirs(start_sim: StartSim) -> None:
    async with _exporter(start_sim) as default:
        await _fill(default)
        series = _series(default)
    families = _per_endpoint_workload(series)
    cells = ENDPOINTS * len(WORKLOADS)
    per_cell = sum(families.values()) / cells
    # The count is the full one: every percentile shown, one window.
    percentiles = {
        dict(lb)["percentile"] for n, lb in series if n == "tokwatch_window_ttft_percentile_seconds"
    }
    assert percentiles == {"50", "90", "99"}
    assert {dict(lb)["window"] for n, lb in series if n.startswith("tokwatch_window_")} == {"24h"}
    assert per_cell <= BUDGET, f"{per_cell:.1f} series per endpoint-workload: {families.most_common(12)}"
    assert "tokwatch_ttft_seconds" not in families and "tokwatch_inter_token_latency_seconds" not in families
    assert families["tokwatch_probe_runs_total"] == cells  # status="ok" only: no zeros for other statuses
    assert families["tokwatch_probe_status"] == cells
    # Cost and energy exist only for endpoints with prices or a power source: none by default.
    assert not [n for n in families if n.startswith(("tokwatch_cost", "tokwatch_energy", "tokwatch_pricing"))]

    async with _exporter(start_sim, OPTED_IN) as opted:
        await _fill(opted)
        opted_families = _per_endpoint_workload(_series(opted))
    assert opted_families["tokwatch_ttft_seconds"] == cells * 19  # 16 GenAI boundaries, +Inf, sum, count
    assert opted_families["tokwatch_inter_token_latency_seconds"] == cells * 16
    assert opted_families["tokwatch_window_uptime_ratio"] == cells * 4
    assert opted_families["tokwatch_window_cache_assisted_runs"] == cells * 4
    assert opted_families["tokwatch_probe_max_stall_seconds"] == cells
    assert sum(opted_families.values()) / cells > 3 * per_cell


@pytest.mark.slow
async def test_no_series_churns_over_ten_rounds(start_sim: StartSim) -> None:
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    rankings = set()
    async with _exporter(start_sim, sim_config=FAST_SIM) as app:
        for _ in range(10):
            await _round(app)
            live = _series(app)
            seen |= live.keys()
            rankings.add(tuple(sorted((lb, v) for (n, lb), v in live.items() if n == "tokwatch_fleet_rank")))
    assert len(rankings) > 1  # the ranking did change: the labels had the chance to churn
    assert len(seen) <= 1.05 * len(live), sorted(seen - live.keys())[:20]


# Every endpoint priced at list price (a per-model default).
PRICE = "{input_per_mtok: 1.0, output_per_mtok: 4.0, cached_input_per_mtok: 0.5}"
PRICED = "pricing: {models: {" + ", ".join(f"m{i}: {PRICE}" for i in range(ENDPOINTS)) + "}}"


async def test_prices_add_the_documented_series_per_endpoint_workload(start_sim: StartSim) -> None:
    async with _exporter(start_sim, PRICED) as priced:
        await _round(priced)
        families = _per_endpoint_workload(_series(priced))
    cells = ENDPOINTS * len(WORKLOADS)
    # docs/metrics.md, "Cost and energy": list price by phase (3) and the probe runs' cost (1) per
    # endpoint-workload; effective prices (2 more) only where the server counts cached tokens (not vLLM's
    # usage here); one info series per endpoint.
    assert families["tokwatch_cost_per_million_tokens"] == cells * 3
    assert families["tokwatch_probe_cost_total"] == cells
    assert families["tokwatch_pricing_info"] == ENDPOINTS
    assert "tokwatch_energy_joules_per_output_token" not in families  # no power source configured
