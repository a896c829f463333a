"""Sites: exporters at two vantage points write to one real PostgreSQL; every series and stored run carries
its site, /metrics of each exporter shows its own site's figures, the status page and `tokwatch report` show
an endpoint per site side by side, and sharding (fleet duty) works within a site."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.service.test_shard import SIM, fleet_config, own_outbox
from tests.support.postgres import LocalPostgres
from tokwatch.counters import ServerCollector
from tokwatch.counters.state import ServerState
from tokwatch.figures.result import RunResult, TimingSource
from tokwatch.figures.series import SeriesKey
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round
from tokwatch.service.shard import Shard, takeover_after
from tokwatch.settings.config import Config, load_config_text
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim
from tokwatch.statuspage.model import build_overview
from tokwatch.statuspage.render import render_overview
from tokwatch.storage.report import build_report, render_table
from tokwatch.windows.window_rule import WindowRule


def _site_config(sim_url: str, dsn: str, site: str, tmp: Path) -> Config:
    text = f"site: {site}\n" + fleet_config(sim_url, dsn, endpoints=2)
    return own_outbox(load_config_text(text), tmp / f"{site}.jsonl")


async def _round(app: App) -> None:
    await run_round(app._schedule_settings()[2], app.probes.probe_target)
    await app.refresh_windows()


async def test_two_sites_into_one_store_side_by_side(pg_server: LocalPostgres, tmp_path: Path) -> None:
    async with run_sim(load_sim_config_text(SIM)) as sim:
        dsn = pg_server.new_database()
        apps = [App(_site_config(sim.url, dsn, s, tmp_path), instance=s) for s in ("eu-west", "office")]
        for app in apps:
            await app.start(schedule=False)
        try:
            await asyncio.gather(*(_round(app) for app in apps))
            for app in apps:
                await app.refresh_windows()  # after both wrote
            store = apps[0].store
            assert store is not None
            stored = await store.last_runs(0.0)
            sites = ("eu-west", "office")
            assert set(stored) == {SeriesKey(f"ep{i}", "seed000", s) for i in range(2) for s in sites}
            for app in apps:
                site = app.config.site
                # every per-run series carries the exporter's site; its window figures are its own site's
                labels = {"endpoint": "ep0", "workload": "seed000", "site": site}
                ok = {**labels, "status": "ok"}
                assert app.exposition.get_sample_value("tokwatch_probe_runs_total", ok) == 1.0
                window = {"endpoint": "ep0", "workload": "seed000", "site": site, "window": "24h"}
                assert app.exposition.get_sample_value("tokwatch_window_runs", window) == 1.0
                body = app.exposition.render().decode()
                other = "office" if site == "eu-west" else "eu-west"
                assert f'site="{other}"' not in body and body.count(f'site="{site}"') > 10
                info = {"endpoint": "ep0", "kind": "openai", "model": "m0", "site": site}
                assert app.exposition.get_sample_value("tokwatch_endpoint_info", info) == 1.0


            # the status page: ep0 from both sites side by side, the exporter's own site first
            ov = await build_overview(store, apps[1].config)
            assert [(t.endpoint.name, t.site) for t in ov.tiles] == [
                ("ep0", "office"), ("ep0", "eu-west"), ("ep1", "office"), ("ep1", "eu-west")
            ]  # fmt: skip
            assert all(t.status == "ok" and t.day is not None and t.day.runs == 1 for t in ov.tiles)
            html = render_overview(ov, apps[1].config)
            assert 'data-endpoint="ep0" data-status="ok" data-workload="seed000" data-site="eu-west"' in html
            assert "site eu-west" in html and "site office" in html  # each tile says where it ran from
            # comparisons stay within one site: each site ranks the two endpoints on its own
            assert sorted((r.site, len(r.ranked)) for r in ov.rankings) == [("eu-west", 2), ("office", 2)]

            report = await build_report(store, time.time(), 86400, rule=WindowRule())
            lines = {(r.endpoint, r.site) for r in report.endpoints}
            assert lines == {(f"ep{i}", s) for i in range(2) for s in sites}
            table = render_table(report)
            assert "site" in table.splitlines()[0] and table.count("eu-west") >= 2
        finally:
            for app in apps:
                await app.stop()


@pytest.mark.slow
async def test_fleet_duty_is_decided_within_a_site(pg_server: LocalPostgres, tmp_path: Path) -> None:
    """Site eu runs both shards, site us only its replica 1: us's replica 1 takes the fleet figures over once
    its own replica 0 has written nothing, however busy eu's replica 0 is; eu's replica 1 does not."""
    async with run_sim(load_sim_config_text(SIM)) as sim:
        dsn = pg_server.new_database()

        def config(site: str, index: int) -> Config:
            fleet = fleet_config(sim.url, dsn).replace("interval: 1h", "interval: 1s, offset: 0s")
            text = f"site: {site}\n{fleet}"
            return own_outbox(load_config_text(text), tmp_path / f"{site}-{index}.jsonl")

        eu = [App(config("eu", i), shard=Shard(i, 2), instance=f"eu-{i}") for i in range(2)]
        us = App(config("us", 1), shard=Shard(1, 2), instance="us-1")
        for app in (*eu, us):
            await app.start(schedule=False)
        try:
            await asyncio.gather(*(_round(app) for app in (*eu, us)))
            assert [app.fleet_duty.exports for app in (*eu, us)] == [True, False, False]
            await asyncio.sleep(takeover_after(1.0) + 0.5)  # bounded: 3.5 s
            await asyncio.gather(*(_round(app) for app in (*eu, us)))
            assert [app.fleet_duty.exports for app in (*eu, us)] == [True, False, True]
        finally:
            for app in (*eu, us):
                await app.stop()


def test_server_counters_carry_the_site_too() -> None:
    collector = ServerCollector([ServerState("a", {"gpu": "3090"})])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    errors = "tokwatch_server_scrape_errors_total"
    assert registry.get_sample_value(errors, {"endpoint": "a", "gpu": "3090"}) == 0.0  # no site: no label
    collector.site = "eu-west"  # what the app sets from `site:`
    assert registry.get_sample_value(errors, {"endpoint": "a", "gpu": "3090", "site": "eu-west"}) == 0.0


SITES_SIM = """
seed: 7
servers:
  - name: v
    dialect: vllm
    models: [{name: m, decode_tps: 400, prefill_tps: 100000}]
"""
SITE_ROUNDS = 10  # per site, every 2 s: a and b start 0.9 s apart (their fractions 0.79 and 0.24)


def _timed_site(sim_url: str, site: str) -> Config:
    return load_config_text(f"""
site: {site}
probe: {{max_tokens: 24}}
schedule: {{interval: 2s, run_on_start: false, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim_url}/v/v1', model: m, scrape_interval: 1s}}
""")


def test_each_site_takes_its_own_fraction_of_the_interval() -> None:
    """The offset derives from the site's name (stable), a configured one is kept, no site keeps 30m."""
    cfg = load_config_text("site: a\nendpoints: []\n")
    interval, offset = cfg.round_schedule()
    assert (interval, offset) == (3600.0, round((1800 + 0.7913742705223816 * 3600) % 3600, 3))
    b = load_config_text("site: b\nendpoints: []\n").round_schedule()[1]
    assert min(abs(offset - b), 3600 - abs(offset - b)) > 600  # a and b: 33 minutes apart of an hour
    assert load_config_text("endpoints: []\n").round_schedule() == (3600.0, 1800.0)
    configured = load_config_text("site: a\nschedule: {offset: 5m}\nendpoints: []\n")
    assert configured.round_schedule() == (3600, 300)
    own = load_config_text(
        "site: a\nprobe: {workloads: [seed000, {name: long, interval: 6h}, {name: short, interval: 10m, "
        "offset: 1m}]}\nendpoints: []\n"
    )
    long, short = own.probe.workloads[1:]
    assert own.round_schedule(long) == (21600.0, round((1800 + 0.7913742705223816 * 21600) % 21600, 3))
    assert own.round_schedule(short) == (600.0, 60.0)


@pytest.mark.slow
async def test_two_sites_never_share_the_servers_counter_window() -> None:
    """Exporters at sites a and b probe one vLLM-dialect server every 2 s: at their own offsets their
    runs never overlap, so the counter window is usable (source vllm_metrics, not a fallback) in at least
    95 % of runs (at one shared offset 2-3 of 20 were)."""
    async with run_sim(load_sim_config_text(SITES_SIM)) as sim:
        apps = [App(_timed_site(sim.url, site), instance=site) for site in ("a", "b")]
        results: list[RunResult] = []
        enough = threading.Event()

        def spy(record: Callable[[RunResult], None]) -> Callable[[RunResult], None]:
            def recorded(result: RunResult) -> None:
                record(result)
                results.append(result)
                if len(results) >= 2 * SITE_ROUNDS:
                    enough.set()

            return recorded

        for app in apps:
            app.probes.record = spy(app.probes.record)  # type: ignore[method-assign]
            await app.start(storage=False)
        try:
            assert await asyncio.to_thread(enough.wait, 4 * SITE_ROUNDS), f"{len(results)} runs"
        finally:
            for app in apps:
                await app.stop()
    assert all(r.ok for r in results), [(r.status, r.error_message) for r in results]
    sources = [r.source for r in results]
    usable = sum(s is TimingSource.VLLM_METRICS for s in sources)
    why = [(r.site, r.started_at % 2) for r in results if r.source is not TimingSource.VLLM_METRICS]
    assert usable >= 0.95 * len(results), why
    assert {r.site for r in results} == {"a", "b"}
