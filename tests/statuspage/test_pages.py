"""The status page over real loopback HTTP: a running exporter, the simulator, its SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest

from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.testing import RunningSim
from tokwatch.statuspage import StatusPages
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.storage.state_lock import StateLockedError

# decode_tps 200: an 8-token run spans ~35 ms, so reads bunched up on a loaded machine cannot squeeze it
# above the plausibility cap (20,000 tok/s) and turn an `ok` tile into `provider_error`.
SIM = """
seed: 1
servers:
  - name: oa
    dialect: openai
    models:
      - {name: m, decode_tps: 200, prefill_tps: 100000}
      - {name: broken, decode_tps: 2000, prefill_tps: 100000, faults: {http_5xx: 1.0}}
"""


class Dom(HTMLParser):
    """Elements with their attributes, in document order (enough for structural checks)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def having(self, tag: str, attr: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == tag and attr in a]


@pytest.fixture
async def exporter(sim: RunningSim, tmp_path: Path) -> AsyncIterator[tuple[App, str, aiohttp.ClientSession]]:
    cfg = f"""
probe: {{max_tokens: 16, warmup: false}}
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox.jsonl'}}
schedule: {{interval: 1h, offset: 0s, run_on_start: false}}
endpoints:
  - {{name: good, kind: openai, base_url: '{sim.url}/oa/v1', model: m, labels: {{team: a}},
      renamed_from: [good-old]}}
  - {{name: failing, kind: openai, base_url: '{sim.url}/oa/v1', model: broken}}
  - {{name: idle, kind: openai, base_url: '{sim.url}/oa/v1', model: m, enabled: false}}
"""
    async with serving(cfg) as served:
        yield served


@contextlib.asynccontextmanager
async def serving(cfg: str) -> AsyncIterator[tuple[App, str, aiohttp.ClientSession]]:
    """A started exporter of config text `cfg` serving on a free loopback port, and a client session. No
    scheduler: the tests probe themselves, and a scheduled slot of the wall clock falling inside a test would
    add a round of its own to what the test counts."""
    app = App(load_config_text(cfg, "tokwatch.yml"))
    await app.start(schedule=False)
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield app, f"http://127.0.0.1:{port}", session
    finally:
        await app.stop()
        await runner.cleanup()


async def _stored(app: App, runs: int) -> None:
    assert app.writer is not None and app.store is not None
    for _ in range(200):  # bounded: the writer flushes in the background
        if await app.store.count_runs() >= runs:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("runs were not stored")


async def test_page_shows_a_tile_per_endpoint_with_status_and_figures(
    exporter: tuple[App, str, aiohttp.ClientSession],
) -> None:
    app, url, session = exporter
    # A CV band needs two tok/s samples: on a busy host a run's client-timed tok/s may be set aside (its
    # error bound above the tolerance), so probe until two count (bounded).
    samples = runs = 0
    while samples < 2 and runs < 8:
        outcome = await app.probe("good", "scheduled")
        runs += 1
        samples += not outcome.result.tps_set_aside
    await app.probe("failing", "scheduled")
    await _stored(app, runs + 1)

    async with session.get(url + "/", headers={"Accept": "text/html"}) as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        text = await resp.text()
    dom = Dom(text)
    tiles = {a["data-endpoint"]: a["data-status"] for a in dom.having("article", "data-endpoint")}
    assert tiles == {"good": "ok", "failing": "provider_error", "idle": "none"}
    bands = [a["data-band"] for a in dom.having("td", "data-band")]
    assert len(bands) == 3 and bands[0] in ("tight", "typical", "jittery") and bands[1:] == ["none", "none"]
    assert "no ok run yet" in text and "PROVIDER ERROR" in text
    assert re.search(r'<span class="tps">[\d.]+</span> tok/s', text)
    assert dom.having("meta", "http-equiv"), "the page refreshes itself"
    assert "<script" not in text and "http://" not in text.replace(url, "")  # no external assets
    assert '<svg class="spark"' in text and 'class="fail"' in text  # failing endpoint: a red tick
    assert [a["data-endpoint"] for a in dom.having("li", "data-endpoint")] == ["good"]  # only ranked one

    # the comparison view is served too, sorted as the query says; an unknown workload is a 404
    async with session.get(url + "/compare?workload=seed000&sort=ttft&order=asc") as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        compare = await resp.text()
    assert '<table id="compare" data-sort="ttft" data-site="" data-order="asc">' in compare
    # grouped by model (broken, m), then by TTFT within one: rows without a figure last
    rows = [a["data-endpoint"] for a in Dom(compare).having("tr", "data-model")]
    assert rows == ["failing", "good", "idle"]
    async with session.get(url + "/compare?workload=nope") as resp:
        assert resp.status == 404
    # network vs server time on the endpoint page, from the stored phases of the real runs
    async with session.get(url + "/endpoints/good") as resp:
        page = await resp.text()
    assert re.search(rf'<section id="network" data-runs="{runs}" data-measured="[1-9]">', page), page

    # /metrics is unchanged and still the exposition format
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200 and resp.content_type == "text/plain"


async def test_endpoint_page_history_rename_redirect_and_unknown(
    exporter: tuple[App, str, aiohttp.ClientSession],
) -> None:
    app, url, session = exporter
    await app.probe("failing", "scheduled")
    await app.probe("good", "scheduled")
    await _stored(app, 2)
    async with session.get(url + "/endpoints/failing") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'id="incidents"' in text and "ongoing" in text and "http_5" in text
    assert text.count('<tr><td class="t">') == 2  # one run row + one incident row
    async with session.get(url + "/endpoints/good-old", allow_redirects=False) as resp:
        assert resp.status == 301 and resp.headers["Location"] == "/endpoints/good"
    async with session.get(url + "/endpoints/nope") as resp:
        assert resp.status == 404 and "No endpoint named" in await resp.text()


async def test_store_outage_keeps_the_last_good_figures_with_a_notice(
    tmp_path: Path, free_port: object
) -> None:
    good = SQLiteStore(tmp_path / "tw.db")
    dead = PostgresStore(f"postgresql://tokwatch:hunter2secret@127.0.0.1:{free_port()}/x", timeout_s=0.5)  # type: ignore[operator]
    current: list[object] = [good]
    cfg = load_config_text(
        "endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}]", "t.yml"
    )
    pages = StatusPages(lambda: current[0], lambda: cfg)  # type: ignore[arg-type,return-value]
    try:
        first = await pages.overview()
        assert first.status == 200 and 'class="notice"' not in first.body
        current[0] = dead
        second = await pages.overview()
        assert second.status == 200 and 'class="notice"' in second.body and "Store unavailable" in second.body
        assert 'data-endpoint="a"' in second.body
        assert "hunter2secret" not in second.body
        page = await pages.endpoint("a")
        assert page.status == 503 and "hunter2secret" not in page.body
    finally:
        await good.close()
        await dead.close()


async def test_storage_switched_off_says_so(tmp_path: Path) -> None:
    cfg = load_config_text(
        "storage: {enabled: false}\n"
        "endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}]",
        "t.yml",
    )
    page = await StatusPages(lambda: None, lambda: cfg).overview()
    assert page.status == 200 and "storage.enabled: false" in page.body


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_a_shard_shows_the_whole_fleet_from_the_shared_store(
    sim: RunningSim, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Two replicas of one config, each probing its share: either one's page has a tile per endpoint of the
    fleet. PostgreSQL is the shared store docs/scaling.md describes; one SQLite file has one owner (issue 37):
    the second replica on it refuses to start, naming the file."""
    from tokwatch.service.shard import parse_shard

    if backend == "postgres":
        storage = f"dsn: '{request.getfixturevalue('pg_dsn')}', timescale: false"
    else:
        storage = f"sqlite_path: '{tmp_path}/tw.db'"
    eps = "\n".join(
        f"  - {{name: ep{i}, kind: openai, base_url: '{sim.url}/oa/v1', model: m}}" for i in range(6)
    )

    def replica(i: int) -> App:  # each replica its own outbox, as on separate hosts
        cfg = load_config_text(
            f"probe: {{max_tokens: 8, warmup: false}}\n"
            f"storage: {{{storage}, outbox_path: '{tmp_path}/o{i}.jsonl'}}\n"
            f"schedule: {{interval: 1h, run_on_start: false}}\nendpoints:\n{eps}\n",
            "t.yml",
        )
        return App(cfg, shard=parse_shard(f"{i}/2"))

    apps = [replica(i) for i in range(2)]
    if backend == "sqlite":
        await apps[0].start(schedule=False)
        try:
            with pytest.raises(StateLockedError, match=f"SQLite file {tmp_path}/tw.db is in use"):
                await apps[1].start(schedule=False)
        finally:
            await apps[0].stop()
        return
    for app in apps:  # no scheduler (as `serving`): a slot falling inside the test would add its own round
        await app.start(schedule=False)
    try:
        owned = [[e.name for e in app.config.endpoints] for app in apps]
        assert sorted(owned[0] + owned[1]) == [f"ep{i}" for i in range(6)] and owned[0] and owned[1]
        for app, names in zip(apps, owned, strict=True):
            for name in names:
                await app.probe(name, "scheduled")
        await _stored(apps[0], 6)
        for app in apps:  # either replica: a tile per endpoint of the fleet, each with its ok run
            page = await StatusPages(lambda a=app: a.store, lambda a=app: a.full_config).overview()
            tiles = Dom(page.body).having("article", "data-endpoint")
            assert {t["data-endpoint"]: t["data-status"] for t in tiles} == {f"ep{i}": "ok" for i in range(6)}
    finally:
        for app in apps:
            await app.stop()
