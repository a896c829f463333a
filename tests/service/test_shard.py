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

from tests.support.postgres import LocalPostgres
from tests.support.sim import StartSim
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round
from tokwatch.service.shard import (
    FleetDuty,
    Shard,
    ShardError,
    owner_of,
    parse_shard,
    shard_from_env,
    takeover_after,
)
from tokwatch.settings.config import Config, load_config_text
from tokwatch.sim.testing import RunningSim
from tokwatch.storage.report import build_report
from tokwatch.windows.window_rule import WindowRule

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


def fleet_config(
    sim_url: str, dsn: str, endpoints: int = 8, servers: str = "ab", max_tokens: int = 32
) -> str:
    """`endpoints` OpenAI endpoints, endpoint i on the simulated server named by letter i of `servers`."""
    lines = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{sim_url}/{servers[i % len(servers)]}/v1', "
        f"model: m{i}}}"
        for i in range(endpoints)
    )
    return f"""
probe: {{max_tokens: {max_tokens}, warmup: false}}
schedule: {{interval: 1h, run_on_start: false, window_includes: [timing_disturbed]}}
storage: {{dsn: '{dsn}', timescale: false}}
endpoints:
{lines}
"""


def series(app: App) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    text = app.exposition.render().decode()
    # The fleet figures are compared by name only: which endpoints rank (and where) depends on the noise.
    return {
        (s.name, () if s.name.startswith("tokwatch_fleet_") else tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(("tokwatch_probe_", "tokwatch_window_", "tokwatch_fleet_", "tokwatch_ttft"))
    }


async def _one_round(app: App) -> None:
    await run_round(app._schedule_settings()[2], app.probes.probe_target)
    await app.refresh_windows()


def own_outbox(config: Config, path: Path) -> Config:
    """The config with its own outbox file: replicas in one test process must not share the default
    `./tokwatch-state/outbox.jsonl` (as replicas on separate machines do not)."""
    storage = config.storage.model_copy(update={"outbox_path": str(path)})
    return config.model_copy(update={"storage": storage})


async def _disturbed(app: App) -> set[str]:
    """Endpoints with a stored run flagged timing_disturbed (a busy test machine): with
    `window_includes: [timing_disturbed]` their client figure, off by up to the stall, counts in the
    window, so which endpoint is fastest is certain only without them."""
    assert app.store is not None
    runs = await app.store.recent_runs(0, None)
    return {key.endpoint for key, points in runs.items() if any(p.timing_disturbed for p in points)}


async def _stored_runs(app: App) -> dict[str, int]:
    """Runs per endpoint in the (shared) store, every run counted (a busy machine's `timing_disturbed`
    ones too, which window figures leave out)."""
    assert app.store is not None
    return {key.endpoint: len(runs) for key, runs in (await app.store.recent_runs(0, None)).items()}


async def test_two_shards_probe_every_endpoint_once_and_export_fleet_figures_once(
    sim: RunningSim, pg_server: LocalPostgres, tmp_path: Path
) -> None:
    shared, alone = pg_server.new_database(), pg_server.new_database()
    config = load_config_text(fleet_config(sim.url, shared))
    shards = [
        App(own_outbox(config, tmp_path / f"r{i}.jsonl"), shard=Shard(i, 2), instance=f"r{i}")
        for i in range(2)
    ]
    alone_config = own_outbox(load_config_text(fleet_config(sim.url, alone)), tmp_path / "one.jsonl")
    single = App(alone_config, instance="one")
    for app in (*shards, single):
        await app.start(schedule=False)
    try:
        await asyncio.gather(*(_one_round(app) for app in shards))
        await _one_round(single)
        for app in shards:
            await app.refresh_windows()  # after both wrote: the fleet comparison sees every run
        probed = [name for app in shards for name, _ in app.probes.last_outcomes]
        assert sorted(probed) == sorted(e.name for e in config.endpoints)  # the union covers all, once
        # The shared store holds every run exactly once.
        assert await _stored_runs(shards[1]) == dict.fromkeys(probed, 1)
        # The fleet comparison is exported by replica 0 only, and covers replica 1's endpoints too.
        fleet = "tokwatch_fleet_fastest_vs_slowest_ratio"
        assert any(n == fleet for n, _ in series(shards[0]))
        assert not any(n == fleet for n, _ in series(shards[1]))
        snap = shards[0]._window_snapshot()
        assert snap.ranking is not None and {n for n, _ in snap.ranking.ranked} == set(probed)
        assert owner_of("ep7", 2) == 1  # the fastest endpoint is replica 1's
        if not await _disturbed(shards[0]):
            assert snap.fleet is not None and (snap.fleet.fastest, snap.fleet.slowest) == ("ep7", "ep0")
        # `tokwatch report` from either replica covers the whole fleet (it reads the shared store).
        for app in shards:
            rule = WindowRule.of(app.config.schedule.window_includes)
            report = await build_report(app.store, time.time(), 7 * 86400, rule=rule)  # type: ignore[arg-type]
            assert sorted(r.endpoint for r in report.endpoints) == sorted(probed)
        # Per-endpoint series are disjoint between replicas and together what one exporter exports,
        # so Prometheus sums over both replicas count every endpoint once.
        a, b = series(shards[0]), series(shards[1])
        assert not (a & b)
        # A run flagged timing_disturbed (a busy test machine) leaves its endpoint's ok-run figures out:
        # compare the endpoints whose runs were clean in both set-ups.
        disturbed = {
            name
            for app in (*shards, single)
            for (name, _), outcome in app.probes.last_outcomes.items()
            if outcome.result.timing_disturbed
        }

        def clean(found: set[tuple[str, tuple[tuple[str, str], ...]]]) -> set[object]:
            return {s for s in found if dict(s[1]).get("endpoint") not in disturbed}

        assert clean(a | b) == clean(series(single))
    finally:
        for app in (*shards, single):
            await app.stop()


# A bigger fleet for the rebalance: 24 endpoints on three servers, short runs (8 tokens at 2,000 tok/s).
REBALANCE = 24
REBALANCE_SIM = "seed: 13\nservers:\n" + "".join(
    f"  - name: {server}\n    dialect: openai\n    models: ["
    + ", ".join(f"{{name: m{i}, decode_tps: 2000, prefill_tps: 100000}}" for i in range(REBALANCE))
    + "]\n"
    for server in "abc"
)


async def _round_of_shards(config: Config, count: int, tmp_path: Path) -> dict[str, int]:
    """Start `count` replicas of one config, run one round on each at once, stop them: endpoint -> the
    replica that probed it (each endpoint probed once, or the test fails)."""
    apps = [
        App(own_outbox(config, tmp_path / f"r{i}of{count}.jsonl"), shard=Shard(i, count), instance=f"r{i}")
        for i in range(count)
    ]
    for app in apps:
        await app.start(schedule=False)
    try:
        await asyncio.gather(*(_one_round(app) for app in apps))
        probed = [(name, i) for i, app in enumerate(apps) for name, _ in app.probes.last_outcomes]
    finally:
        for app in apps:
            await app.stop()  # writes what is still queued
    names = [name for name, _ in probed]
    assert sorted(names) == sorted(e.name for e in config.endpoints), f"{count} shards: each endpoint once"
    return dict(probed)


async def test_a_third_shard_takes_its_share_and_nothing_else_moves(
    start_sim: StartSim, pg_server: LocalPostgres, tmp_path: Path
) -> None:
    """Scale 2 -> 3 replicas on one store: each round probes every endpoint once, and the endpoints that
    change replica are exactly the new replica's (about a third), never one between the old replicas."""
    sim = await start_sim(REBALANCE_SIM)
    dsn = pg_server.new_database()
    config = load_config_text(fleet_config(sim.url, dsn, REBALANCE, "abc", max_tokens=8))
    names = sorted(e.name for e in config.endpoints)
    # An unsharded App on the same database, to read the shared store between the rounds.
    store_app = App(own_outbox(config, tmp_path / "reader.jsonl"), instance="reader")
    await store_app.start(schedule=False)
    try:
        before = await _round_of_shards(config, 2, tmp_path)
        assert await _stored_runs(store_app) == dict.fromkeys(names, 1)

        after = await _round_of_shards(config, 3, tmp_path)
        assert await _stored_runs(store_app) == dict.fromkeys(names, 2)  # once per round
    finally:
        await store_app.stop()
    assert before == {n: owner_of(n, 2) for n in names} and after == {n: owner_of(n, 3) for n in names}
    moved = {n for n in names if before[n] != after[n]}
    assert moved == {n for n in names if after[n] == 2}  # the new replica's share, and only that
    assert REBALANCE / 6 <= len(moved) <= REBALANCE / 2  # about a third (9 of 24 with these names)


def test_the_fleet_figures_go_to_the_lowest_live_replica_that_probes_something() -> None:
    assert Shard(0, 1).exports_fleet([]) and Shard(0, 1).exports_fleet([0], live=set())
    owners = [0, 1, 1, 2, 2]
    # Every replica presumed live (start-up, or no shared store): replica 0 alone.
    assert [Shard(i, 3).exports_fleet(owners) for i in range(3)] == [True, False, False]
    # Replica 0 down: the next one takes over; both lower ones down: replica 2.
    assert [Shard(i, 3).exports_fleet(owners, live={1, 2}) for i in range(3)] == [True, True, False]
    assert Shard(2, 3).exports_fleet(owners, live={2})
    # A replica that owns no endpoint never exports (it writes no run, so its liveness cannot be seen).
    assert [Shard(i, 3).exports_fleet([1, 2]) for i in range(3)] == [False, True, False]
    assert [Shard(i, 2).exports_fleet([]) for i in range(2)] == [True, False]  # no endpoints at all


@pytest.mark.slow
async def test_while_replica_0_is_down_replica_1_exports_the_fleet_figures(
    sim: RunningSim, pg_server: LocalPostgres, tmp_path: Path
) -> None:
    """Replica 0 stops: once the shared store has had no run of its endpoints for `takeover_after(interval)`
    (3 s at a 1 s interval), replica 1 exports the fleet figures, covering replica 0's endpoints from the
    store; when replica 0 is back and writes runs, replica 1 leaves them to it again."""
    fleet = "tokwatch_fleet_fastest_vs_slowest_ratio"
    config = load_config_text(
        fleet_config(sim.url, pg_server.new_database()).replace(
            "interval: 1h", "interval: 1s, offset: 0s"
        )
    )
    after = takeover_after(config.schedule.interval)
    apps = [
        App(own_outbox(config, tmp_path / f"r{i}.jsonl"), shard=Shard(i, 2), instance=f"r{i}")
        for i in range(2)
    ]
    back: App | None = None
    for app in apps:
        await app.start(schedule=False)
    try:
        await asyncio.gather(*(_one_round(app) for app in apps))
        assert [app.fleet_duty.exports for app in apps] == [True, False]
        await apps[0].stop()  # replica 0 goes down
        await asyncio.sleep(after + 0.5)  # bounded: 3.5 s
        await _one_round(apps[1])
        assert apps[1].fleet_duty.exports
        assert any(n == fleet for n, _ in series(apps[1]))
        snap = apps[1]._window_snapshot()  # from the store: replica 0's endpoints included
        assert snap.ranking is not None
        assert {n for n, _ in snap.ranking.ranked} == {e.name for e in config.endpoints}
        assert owner_of("ep0", 2) == 0
        if not await _disturbed(apps[1]):
            assert snap.fleet is not None and (snap.fleet.fastest, snap.fleet.slowest) == ("ep7", "ep0")
        # Replica 0 restarts and probes: it exports at once, and replica 1 hands back.
        back = App(own_outbox(config, tmp_path / "r0-back.jsonl"), shard=Shard(0, 2), instance="r0")
        await back.start(schedule=False)
        await _one_round(back)
        assert back.fleet_duty.exports
        await apps[1].refresh_windows()
        assert not apps[1].fleet_duty.exports
        assert not any(n == fleet for n, _ in series(apps[1]))
    finally:
        for app in (apps[1], *([back] if back else [])):
            await app.stop()
        if apps[0]._started:
            await apps[0].stop()


async def test_probe_of_an_endpoint_owned_by_another_shard_names_the_owner(
    sim: RunningSim, pg_dsn: str
) -> None:
    from tokwatch.serve.server import start_site

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
    kube = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    sharded = kube / "sharded"
    kustomization = yaml.safe_load((sharded / "kustomization.yaml").read_text())
    docs = {
        d["kind"]: d
        for r in kustomization["resources"]
        for d in yaml.safe_load_all((sharded / r).read_text())
    }
    assert set(docs) == {"ConfigMap", "Service", "StatefulSet", "ServiceMonitor", "NetworkPolicy"}
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
    service, monitor = docs["Service"], docs["ServiceMonitor"]
    assert service["spec"]["clusterIP"] == "None"  # every replica is scraped
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # No name is the single-replica stack's: applying both never overwrites one with the other.
    base: list[tuple[str, str]] = []
    for resource in yaml.safe_load((kube / "kustomization.yaml").read_text())["resources"]:
        base += [
            (d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all((kube / resource).read_text())
        ]
    assert not {(d["kind"], d["metadata"]["name"]) for d in docs.values()} & set(base)
    # The base's Service and ServiceMonitor never select these pods (no double scrape, no mixed traffic),
    base_docs = {
        d["kind"]: d
        for r in ("service.yaml", "servicemonitor.yaml")
        for d in yaml.safe_load_all((kube / r).read_text())
    }
    assert not base_docs["Service"]["spec"]["selector"].items() <= pod_labels.items()
    assert (
        not base_docs["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )
    # while this ServiceMonitor scrapes the sharded Service's port with the job the alert rules expect.
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "tokwatch"


async def test_fleet_duty_moves_up_while_lower_replicas_write_nothing_and_back() -> None:
    clock = [1000.0]
    owners = {"a": 0, "b": 1}
    duty = FleetDuty(Shard(1, 2), owners.values(), clock=lambda: clock[0])
    written: set[str] = set()

    async def recent(since: float) -> set[str]:
        return written

    async def unreachable(since: float) -> set[str]:
        raise OSError("database down")

    assert not duty.exports
    await duty.check(owners, 10.0, recent)  # not running for takeover_after yet: replica 0 presumed live
    assert not duty.exports
    clock[0] += takeover_after(10.0)
    await duty.check(owners, 10.0, None)  # without a shared store nothing tells it replica 0 is down
    assert not duty.exports
    await duty.check(owners, 10.0, recent)
    assert duty.exports
    await duty.check(owners, 10.0, unreachable)  # the duty stays as it was until the store answers
    assert duty.exports
    written.add("a")  # replica 0 writes runs again
    await duty.check(owners, 10.0, recent)
    assert not duty.exports
