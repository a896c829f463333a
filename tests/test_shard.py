"""Sharding: a stable split with minimal moves, and two replicas on one fleet and one real PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tokwatch.app import App
from tokwatch.config import load_config_text
from tokwatch.scheduler import run_round
from tokwatch.shard import Shard, ShardError, owner_of, parse_shard, shard_from_env
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim
from tokwatch.storage.devserver import LocalPostgres
from tokwatch.storage.report import build_report

NAMES = [f"endpoint-{i}" for i in range(600)]


def test_parse_and_environment() -> None:
    assert parse_shard("1/3") == Shard(1, 3)
    with pytest.raises(ShardError, match="INDEX/COUNT"):
        parse_shard("3")
    with pytest.raises(ShardError, match="0 <= index < count"):
        parse_shard("3/3")
    assert shard_from_env({}) is None
    assert shard_from_env({"TOKWATCH_SHARD": "2/4"}) == Shard(2, 4)
    # A StatefulSet passes the pod name; its ordinal is the index.
    assert shard_from_env({"TOKWATCH_SHARD_INDEX": "tokwatch-2", "TOKWATCH_SHARD_COUNT": "3"}) == Shard(2, 3)
    with pytest.raises(ShardError, match="TOKWATCH_SHARD_INDEX"):
        shard_from_env({"TOKWATCH_SHARD_INDEX": "tokwatch", "TOKWATCH_SHARD_COUNT": "3"})


def test_every_endpoint_has_exactly_one_owner_and_the_split_is_even() -> None:
    shards = [Shard(i, 3) for i in range(3)]
    for name in NAMES:
        assert sum(s.owns(name) for s in shards) == 1
    sizes = Counter(owner_of(n, 3) for n in NAMES)
    assert all(150 <= sizes[i] <= 250 for i in range(3))  # 200 each, give or take


def test_adding_a_replica_moves_only_what_the_new_replica_takes() -> None:
    before = {n: owner_of(n, 2) for n in NAMES}
    after = {n: owner_of(n, 3) for n in NAMES}
    moved = [n for n in NAMES if before[n] != after[n]]
    assert all(after[n] == 2 for n in moved)  # nothing moves between the old replicas
    assert 150 <= len(moved) <= 250  # about a third: the minimum for an even split


# Two servers; endpoint ep{i} decodes at 100 + 50 i tok/s, so ep7 is the fastest and ep0 the slowest.
SIM = "seed: 9\nservers:\n" + "".join(
    f"  - name: {server}\n    dialect: openai\n    models: ["
    + ", ".join(f"{{name: m{i}, decode_tps: {100 + 50 * i}, prefill_tps: 100000}}" for i in range(8))
    + "]\n"
    for server in "ab"
)


def fleet_config(sim_url: str, dsn: str) -> str:
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{sim_url}/{'ab'[i % 2]}/v1', model: m{i}}}"
        for i in range(8)
    )
    return f"""
probe: {{max_tokens: 32, warmup: false}}
schedule: {{interval: 1h, run_on_start: false, window_includes: [timing_disturbed]}}
storage: {{dsn: '{dsn}', timescale: false}}
endpoints:
{lines}
"""


def series(app: App) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    text = app.exposition.render().decode()
    # The fleet comparison's labels name the fastest and slowest endpoint, which depend on the run's noise.
    return {
        (s.name, () if s.name.startswith("tokwatch_fleet_") else tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(("tokwatch_probe_", "tokwatch_window_", "tokwatch_fleet_", "tokwatch_ttft"))
    }


async def _one_round(app: App) -> None:
    await run_round(app._schedule_settings()[2], app.probe)
    await app._refresh_windows()


async def test_two_shards_probe_every_endpoint_once_and_export_fleet_figures_once(
    pg_server: LocalPostgres,
) -> None:
    async with run_sim(load_sim_config_text(SIM)) as sim:
        shared, alone = pg_server.new_database(), pg_server.new_database()
        config = load_config_text(fleet_config(sim.url, shared))
        shards = [App(config, shard=Shard(i, 2), instance=f"r{i}") for i in range(2)]
        single = App(load_config_text(fleet_config(sim.url, alone)), instance="one")
        for app in (*shards, single):
            await app.start(schedule=False)
        try:
            await asyncio.gather(*(_one_round(app) for app in shards))
            await _one_round(single)
            for app in shards:
                await app._refresh_windows()  # after both wrote: the fleet comparison sees every run
            probed = [n for app in shards for n in app._last_outcome]
            assert sorted(probed) == sorted(e.name for e in config.endpoints)  # the union covers all, once
            # The shared store holds every run exactly once.
            stats = await shards[1].store.window_stats(0, 4e9)  # type: ignore[union-attr]
            assert sorted(stats) == sorted(probed) and all(s.runs == 1 for s in stats.values())
            # The fleet comparison is exported by replica 0 only, and covers replica 1's endpoints too.
            fleet = "tokwatch_fleet_fastest_vs_slowest_ratio"
            assert any(n == fleet for n, _ in series(shards[0]))
            assert not any(n == fleet for n, _ in series(shards[1]))
            assert owner_of("ep7", 2) == 1  # the fastest endpoint is replica 1's
            snap = shards[0]._window_snapshot()
            assert snap.fleet is not None and (snap.fleet.fastest, snap.fleet.slowest) == ("ep7", "ep0")
            # `tokwatch report` from either replica covers the whole fleet (it reads the shared store).
            for app in shards:
                report = await build_report(app.store, time.time(), 7 * 86400)  # type: ignore[arg-type]
                assert sorted(r.endpoint for r in report.endpoints) == sorted(probed)
            # Per-endpoint series are disjoint between replicas and together what one exporter exports,
            # so Prometheus sums over both replicas count every endpoint once.
            a, b = series(shards[0]), series(shards[1])
            assert not (a & b)
            assert a | b == series(single)
        finally:
            for app in (*shards, single):
                await app.stop()


async def test_probe_of_an_endpoint_owned_by_another_shard_names_the_owner(pg_dsn: str) -> None:
    from tokwatch.server import start_site

    async with run_sim(load_sim_config_text(SIM)) as sim:
        config = load_config_text(fleet_config(sim.url, pg_dsn))
        app = App(config, shard=Shard(0, 2))
        await app.start(schedule=False)
        runner, port = await start_site(app, "127.0.0.1", 0)
        try:
            foreign = next(e.name for e in config.endpoints if not app.shard.owns(e.name))
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/probe", params={"target": foreign}) as resp,
            ):
                assert resp.status == 400
                assert "is probed by shard 1/2" in await resp.text()
        finally:
            await runner.cleanup()
            await app.stop()


def test_serve_rejects_a_bad_shard_with_a_clear_message(tmp_path: Path) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text("endpoints: []\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tokwatch", "serve", "--config", str(cfg), "--shard", "2/2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "shard 2/2: needs 0 <= index < count" in proc.stderr and "Traceback" not in proc.stderr


def test_the_statefulset_example_derives_each_shard_from_its_pod_name() -> None:
    path = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "sharded" / "statefulset.yaml"
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}
    sts = docs["StatefulSet"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["TOKWATCH_SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    replicas = sts["spec"]["replicas"]
    assert env["TOKWATCH_SHARD_COUNT"]["value"] == str(replicas)
    for ordinal in range(replicas):  # what each pod computes from its name
        pod = {"TOKWATCH_SHARD_INDEX": f"{sts['metadata']['name']}-{ordinal}", "TOKWATCH_SHARD_COUNT": "3"}
        assert shard_from_env(pod) == Shard(ordinal, replicas)
    load_config_text(docs["ConfigMap"]["data"]["tokwatch.yml"])  # the shipped config is valid
    assert docs["Service"]["spec"]["clusterIP"] == "None"  # every replica is scraped
