"""Sites: exporters at two vantage points write to one real PostgreSQL; every series and stored run carries
its site, /metrics of each exporter shows its own site's figures, the status page and `tokwatch report` show
an endpoint per site side by side, and sharding (fleet duty) works within a site."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.postgres import LocalPostgres
from tests.test_shard import SIM, fleet_config, own_outbox
from tokwatch.app import App
from tokwatch.config import Config, load_config_text
from tokwatch.counters import ServerCollector
from tokwatch.counters.state import ServerState
from tokwatch.scheduler import run_round
from tokwatch.series import SeriesKey
from tokwatch.shard import Shard, takeover_after
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim
from tokwatch.statuspage.model import build_overview
from tokwatch.statuspage.render import render_overview
from tokwatch.storage.report import build_report, render_table
from tokwatch.window_rule import WindowRule


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
