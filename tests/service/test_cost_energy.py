"""Cost and energy of timed runs, end to end (docs/methodology.md, "Cost and energy"): a self-hosted
endpoint on the simulator's GPUs (energy held to the simulator's exact truth within 1 %, the idle baseline
measured between runs, $/Mtok by compute time) and a hosted one priced from an OpenRouter models list served
over real HTTP (refreshed, failures counted)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import jsonschema
import pytest
from aiohttp import web

from tests.bench.processes import bench_ran, tokwatch_cli
from tests.statuspage.test_pages import _stored, serving
from tests.support.sim import StartSim
from tests.support.waiting import wait_until
from tokwatch.figures.cost import JOULES_PER_KWH
from tokwatch.serve.status_api import build_series
from tokwatch.serve.status_api_schema import SCHEMA
from tokwatch.service.app import App
from tokwatch.service.costing import run_interval
from tokwatch.settings.config import load_config_text
from tokwatch.sim.power import PowerMeter

GPUS = {"gpus": 2, "idle_watts": 60.0, "watts_per_running": 45.0, "max_watts": 350.0}
SIM = {
    "name": "gpu",
    "dialect": "vllm",
    "models": [{"name": "m", "decode_tps": 100.0, "prefill_tps": 20000.0}],
    "gpu_power": GPUS,
}


def power_history(meter: PowerMeter) -> Callable[[float, float], float]:
    """The meter's exact energy over any interval from here on: every change of its power is recorded (the
    truth the exporter's figure is held to)."""
    changes: list[tuple[float, float]] = [(time.monotonic(), meter.watts)]
    on_state = meter.on_state

    def recording(engine: int, running: int, waiting: int, kv_used: int) -> None:
        on_state(engine, running, waiting, kv_used)
        changes.append((time.monotonic(), meter.watts))

    meter.on_state = recording  # type: ignore[method-assign]

    def energy(t0: float, t1: float) -> float:
        joules = 0.0
        for (ta, watts), (tb, _) in itertools.pairwise([*changes, (float("inf"), 0.0)]):
            lo, hi = max(ta, t0), min(tb, t1)
            if hi > lo:
                joules += watts * (hi - lo)
        return joules

    return energy


@pytest.fixture
async def gpu_app(start_sim: StartSim) -> AsyncIterator[tuple[App, Callable[[float, float], float]]]:
    sim = await start_sim(SIM)
    meter = sim.server("gpu").power
    assert meter is not None
    truth = power_history(meter)
    cfg = load_config_text(f"""
probe: {{max_tokens: 200, warmup: false}}
schedule: {{interval: 1h, window: 1h}}
storage: {{enabled: false}}
endpoints:
  - name: own
    kind: vllm
    base_url: '{sim.url}/gpu/v1'
    model: m
    pricing: {{gpu_hour: 2.0, gpus: 2, kwh: 0.15}}
    power_metrics_url: '{sim.url}/gpu/dcgm/metrics'
    power_scrape_interval: 50ms
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        yield app, truth
    finally:
        await app.stop()


async def test_a_self_hosted_runs_energy_matches_the_simulators_truth_within_one_percent(
    gpu_app: tuple[App, Callable[[float, float], float]],
) -> None:
    app, truth = gpu_app
    watch = app.power.for_endpoint("own")
    assert watch is not None
    # The idle baseline is measured between runs, before the first one here.
    await wait_until(lambda: watch.idle_watts is not None, 10.0, "an idle baseline", interval=0.02)
    assert watch.idle_watts == pytest.approx(2 * 60.0)
    r = (await app.probe("own")).result
    assert r.ok, r.error_class
    interval = run_interval(r)
    assert interval is not None and r.energy_j is not None
    truth_j = truth(*interval)
    print(f"run energy {r.energy_j:.2f} J, truth {truth_j:.2f} J ({r.energy_j / truth_j - 1:+.3%}), "
          f"{interval[1] - interval[0]:.2f} s, net {r.energy_net_j} J, cost {r.cost}")  # fmt: skip
    assert r.energy_j == pytest.approx(truth_j, rel=0.01)
    assert r.energy_idle_watts == pytest.approx(120.0)
    assert r.energy_net_j == pytest.approx(r.energy_j - 120.0 * (interval[1] - interval[0]))
    # One request ran through most of the run: 45 W above idle for about its duration.
    assert r.energy_net_j == pytest.approx(45.0 * (interval[1] - interval[0]), rel=0.2)

    # Compute-time cost: $4/h of GPUs plus the run's electricity at $0.15/kWh, charged by phase time.
    assert r.ttft_s is not None and r.e2e_s is not None and r.output_tokens is not None
    energy_per_h = r.energy_j / (interval[1] - interval[0]) * 3600 / JOULES_PER_KWH * 0.15
    assert r.cost_method == "compute_time" and r.cost_currency == "USD"
    assert r.cost == pytest.approx((4.0 + energy_per_h) * r.e2e_s / 3600, rel=0.05)
    decode_s = r.e2e_s - r.ttft_s
    assert r.cost_generation_per_mtok == pytest.approx(
        (4.0 + energy_per_h) * decode_s / 3600 / r.output_tokens * 1e6, rel=0.05
    )

    labels = {"endpoint": "own", "workload": "seed000"}
    get = app.exposition.get_sample_value
    assert get("tokwatch_energy_idle_watts", {"endpoint": "own"}) == pytest.approx(120.0)
    assert get("tokwatch_energy_joules_per_output_token", labels) == pytest.approx(
        r.energy_net_j / r.output_tokens
    )
    assert get("tokwatch_probe_cost_total", labels) == pytest.approx(r.cost)
    for phase in ("prompt", "generation", "blended"):
        method = {**labels, "phase": phase, "allocation_method": "compute_time"}
        assert get("tokwatch_cost_per_million_tokens", method) is not None, phase
    assert get("tokwatch_cost_per_million_tokens", {**labels, "phase": "blended",
                                                     "allocation_method": "list_price"}) is None
    assert get("tokwatch_pricing_info", {"endpoint": "own", "currency": "USD", "source": "config"}) == 1.0
    # No price source is configured: nothing fetched, no source series.
    assert "tokwatch_price_source" not in app.exposition.render().decode()


OPENROUTER = {
    "data": [
        {"id": "m",
         "pricing": {"prompt": "0.0000025", "completion": "0.00001", "input_cache_read": "0.00000125"}},
        {"id": "other", "pricing": {"prompt": "0.000001", "completion": "0.000002"}},
    ]
}


@pytest.fixture
async def models_list(serve: Callable[..., Awaitable[str]]) -> tuple[str, dict[str, object]]:
    """A real HTTP server on 127.0.0.1 serving OpenRouter's models list; `state["fail"]` makes it answer
    500, `state["hits"]` counts requests."""
    state: dict[str, object] = {"fail": False, "hits": 0}

    async def models(_: web.Request) -> web.Response:
        state["hits"] = int(str(state["hits"])) + 1
        if state["fail"]:
            return web.Response(status=500, text="upstream error")
        return web.Response(text=json.dumps(OPENROUTER), content_type="application/json")

    return f"{await serve({'/api/v1/models': models})}/api/v1/models", state


async def test_a_hosted_endpoint_is_priced_from_an_openrouter_list_fetched_over_http(
    start_sim: StartSim, models_list: tuple[str, dict[str, object]]
) -> None:
    url, state = models_list
    # An OpenAI-style API: its usage counts the cached prompt tokens.
    sim = await start_sim({**SIM, "name": "api", "dialect": "openai", "gpu_power": None})
    cfg = load_config_text(f"""
probe: {{max_tokens: 20, warmup: false}}
schedule: {{interval: 1h, window: 1h}}
storage: {{enabled: false}}
pricing: {{openrouter_url: '{url}', refresh: 1h, blend: '3:1'}}
endpoints:
  - {{name: hosted, kind: openai, base_url: '{sim.url}/api/v1', model: m}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        source = app.prices.states["openrouter"]
        await wait_until(lambda: source.last_refresh is not None, 10.0, "the list fetched", interval=0.02)
        r = (await app.probe("hosted")).result
        assert r.ok, r.error_class
        assert r.prompt_tokens is not None and r.output_tokens is not None
        assert r.cached_tokens is not None
        cached = r.cached_tokens
        expected = ((r.prompt_tokens - cached) * 2.5 + cached * 1.25 + r.output_tokens * 10.0) / 1e6
        assert r.cost == pytest.approx(expected)
        assert r.cost_method == "list_price" and r.cost_blended_per_mtok == pytest.approx(4.375)

        get = app.exposition.get_sample_value
        labels = {"endpoint": "hosted", "workload": "seed000"}
        info = {"endpoint": "hosted", "currency": "USD", "source": "openrouter"}
        assert get("tokwatch_pricing_info", info) == 1
        blended = {**labels, "phase": "blended"}
        list_price = {**blended, "allocation_method": "list_price"}
        assert get("tokwatch_cost_per_million_tokens", list_price) == 4.375
        share = cached / r.prompt_tokens
        effective = (3 * ((1 - share) * 2.5 + share * 1.25) + 10.0) / 4
        assert get("tokwatch_cost_per_million_tokens", {**blended, "allocation_method": "effective"}) == (
            pytest.approx(effective)
        )
        assert get("tokwatch_probe_cost_total", labels) == pytest.approx(expected)
        assert get("tokwatch_price_source_last_refresh_timestamp_seconds", {"source": "openrouter"}) == (
            source.last_refresh
        )
        assert get("tokwatch_price_source_refresh_failures_total", {"source": "openrouter"}) == 0
        assert get("tokwatch_energy_idle_watts", {"endpoint": "hosted"}) is None

        # A refresh that fails keeps the prices and is counted.
        state["fail"] = True
        assert await app.prices.refresh() is False
        assert get("tokwatch_price_source_refresh_failures_total", {"source": "openrouter"}) == 1
        assert app.probes.pricing("hosted") is not None
    finally:
        await app.stop()


async def test_the_status_api_shows_cost_and_energy_from_the_store(
    start_sim: StartSim, tmp_path: Path
) -> None:
    sim = await start_sim(SIM, {**SIM, "name": "api", "dialect": "openai", "gpu_power": None})
    cfg = f"""
probe: {{max_tokens: 40, warmup: false}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox.jsonl'}}
schedule: {{interval: 1h, run_on_start: false}}
pricing: {{models: {{m: {{input_per_mtok: 2.5, output_per_mtok: 10.0, cached_input_per_mtok: 1.25}}}}}}
endpoints:
  - name: own
    kind: vllm
    base_url: '{sim.url}/gpu/v1'
    model: m
    pricing: {{node_hour: 3.6, currency: EUR}}  # its own currency: pricing.models' USD is not mixed in
    power_metrics_url: '{sim.url}/gpu/dcgm/metrics'
    power_scrape_interval: 50ms
  - {{name: hosted, kind: openai, base_url: '{sim.url}/api/v1', model: m}}
  - {{name: plain, kind: openai, base_url: '{sim.url}/api/v1', model: other}}
"""
    async with serving(cfg) as (app, url, session):
        watch = app.power.for_endpoint("own")
        assert watch is not None
        await wait_until(lambda: watch.idle_watts is not None, 10.0, "an idle baseline", interval=0.02)
        own = [(await app.probe("own")).result for _ in range(2)]
        hosted = (await app.probe("hosted")).result
        await app.probe("plain")
        await _stored(app, 4)
        async with session.get(url + "/api/v1/status") as resp:
            doc = await resp.json()
        jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)
        series = {s["endpoint"]: s for s in doc["series"]}
        assert series["plain"]["cost"] is None and series["plain"]["energy"] is None

        cost = series["hosted"]["cost"]
        assert hosted.prompt_tokens is not None and hosted.cached_tokens is not None
        share = hosted.cached_tokens / hosted.prompt_tokens
        assert cost == {
            "currency": "USD", "source": "config", "input_per_mtok": 2.5, "output_per_mtok": 10.0,
            "cached_input_per_mtok": 1.25, "blended_per_mtok": 4.375,
            "effective_per_mtok": pytest.approx((3 * ((1 - share) * 2.5 + share * 1.25) + 10) / 4),
            "prompt_per_mtok": 2.5, "generation_per_mtok": 10.0, "allocation_method": "list_price",
            "last_run_cost": pytest.approx(hosted.cost), "cache_hit_share": pytest.approx(share),
            "capacity_per_mtok": None, "capacity": None,  # hosted: no capacity basis
        }
        assert series["hosted"]["energy"] is None

        newest = own[-1]
        assert series["own"]["cost"]["allocation_method"] == "compute_time"
        assert series["own"]["cost"]["currency"] == "EUR"
        assert series["own"]["cost"]["generation_per_mtok"] == pytest.approx(newest.cost_generation_per_mtok)
        assert series["own"]["cost"]["last_run_cost"] == pytest.approx(newest.cost)
        per_token = sorted(r.energy_net_j / ((r.output_tokens or 0) + (r.think_tokens or 0)) for r in own
                           if r.energy_net_j is not None)
        assert len(per_token) == 2
        energy = series["own"]["energy"]
        assert energy["joules_per_output_token"] == pytest.approx(sum(per_token) / 2)
        assert energy["idle_watts"] == pytest.approx(120.0)
        assert energy["joules_last_run"] == pytest.approx(newest.energy_j)

        async with session.get(url + "/api/v1/endpoints/own") as resp:
            view = await resp.json()
        jsonschema.validate(view, SCHEMA, cls=jsonschema.Draft202012Validator)
        assert view["series"][0]["energy"] == energy and view["series"][0]["cost"] == series["own"]["cost"]


@pytest.mark.slow
async def test_a_stored_capacity_search_prices_self_hosted_tokens_at_capacity(
    start_sim: StartSim, tmp_path: Path
) -> None:
    sim = await start_sim({**SIM, "gpu_power": None, "max_running": 8})
    config = tmp_path / "tokwatch.yml"
    config.write_text(f"""
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox.jsonl'}}
schedule: {{interval: 1h, run_on_start: false}}
endpoints:
  - {{name: own, kind: vllm, base_url: '{sim.url}/gpu/v1', model: m, pricing: {{gpu_hour: 2.0, gpus: 2}}}}
""", encoding="utf-8")
    out = tmp_path / "search"
    code, _, err = await tokwatch_cli(
        "bench", "--config", str(config), "--endpoint", "own", "--output-tokens", "8",
        "--input-tokens", "16", "--duration", "1s", "--warmup", "0", "--no-server-metrics",
        "--output-dir", str(out), "--search", "slo", "--slo", "ttft:p90<=500ms", "--search-start", "4",
        "--search-max-points", "3", limit_s=150,
    )  # fmt: skip
    assert bench_ran(code, err), err[-3000:]
    assert "stored: slo capacity of own" in err
    found = json.loads((out / "capacity.json").read_text())
    tokens_per_s = found["slo_capacity_tokens_per_s"]
    assert tokens_per_s > 0

    app = App(load_config_text(config.read_text(encoding="utf-8"), str(config)))
    await app.start(schedule=False)  # reads the latest stored capacity search
    try:
        labels = {"endpoint": "own", "workload": "seed000", "phase": "generation",
                  "allocation_method": "capacity"}  # fmt: skip
        # $4/h over the output tokens/s the search measured at the rate it found.
        expected = 4.0 / (tokens_per_s * 3600) * 1e6
        assert app.exposition.get_sample_value("tokwatch_cost_per_million_tokens", labels) == (
            pytest.approx(expected)
        )
        assert app.store is not None
        doc = {s["endpoint"]: s for s in await build_series(app.store, app.full_config, time.time(),
                                                             app.fleet_pricing)}  # fmt: skip
        cost = doc["own"]["cost"]
        assert cost["capacity_per_mtok"] == pytest.approx(expected)
        assert cost["capacity"]["mode"] == "slo" and cost["capacity"]["rate"] == found["slo_capacity_rate"]
        assert cost["capacity"]["output_tokens_per_s"] == pytest.approx(tokens_per_s)
        jsonschema.validate(
            {"schema_version": 1, "kind": "status", "generated_at": 0.0, "site": "", "primary_window": "24h",
             "windows": ["24h"], "min_samples": {"p50": 1, "p90": 10, "p99": 100},
             "series": list(doc.values())},
            SCHEMA, cls=jsonschema.Draft202012Validator,
        )  # fmt: skip
    finally:
        await app.stop()
