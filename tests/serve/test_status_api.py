"""The status API over real loopback HTTP: a running exporter, the simulator, its SQLite store; every answer
validated against the versioned JSON Schema (tokwatch.serve.status_api_schema, shown in docs/api.md)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest

from tests.statuspage.test_pages import SIM, _stored, serving
from tokwatch.serve.status_api import StatusApi
from tokwatch.serve.status_api_schema import SCHEMA, SCHEMA_VERSION
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim
from tokwatch.storage.postgres import PostgresStore

DOCS = Path(__file__).parents[2] / "docs" / "api.md"


def _valid(doc: dict[str, Any]) -> dict[str, Any]:
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)
    return doc


# The windows take in figures set aside for the exporter's own lateness: on a busy host one of the three runs
# can be, and this test counts samples (the set-aside rule has its own tests, tests/windows).
@pytest.fixture
async def exporter(tmp_path: Path) -> AsyncIterator[tuple[App, str, aiohttp.ClientSession]]:
    async with run_sim(load_sim_config_text(SIM)) as sim:
        cfg = f"""
probe:
  max_tokens: 16
  warmup: false
  workloads: [seed000, {{name: tiny, input_tokens: 40, output_tokens: 8}}]
storage: {{sqlite_path: '{tmp_path}/tw.db', outbox_path: '{tmp_path}/outbox.jsonl'}}
schedule: {{interval: 1h, offset: 0s, run_on_start: false, windows: [30m, 72h],
           window_includes: [timing_disturbed]}}
endpoints:
  - {{name: good, kind: openai, base_url: '{sim.url}/oa/v1', model: m, labels: {{team: a}},
      renamed_from: [good-old]}}
  - {{name: failing, kind: openai, base_url: '{sim.url}/oa/v1', model: broken, workloads: [seed000]}}
"""
        async with serving(cfg) as served:
            yield served


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with session.get(url, allow_redirects=False) as resp:
        body = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, body


async def test_status_and_endpoint_answers_follow_the_schema(
    exporter: tuple[App, str, aiohttp.ClientSession],
) -> None:
    app, url, session = exporter
    for _ in range(3):
        await app.probe("good", "scheduled")
    await app.probe("good", "scheduled", workload="tiny")
    await app.probe("failing", "scheduled")
    await _stored(app, 5)

    status, doc = await _get(session, url + "/api/v1/status")
    assert status == 200
    _valid(doc)
    assert doc["schema_version"] == SCHEMA_VERSION == 1 and doc["kind"] == "status"
    # schedule.window 24h, windows 30m and 72h, and the API's own 30m / 1 day / 7 days
    assert doc["windows"] == ["30m", "24h", "72h", "7d"] and doc["primary_window"] == "24h"
    assert doc["min_samples"] == {"p50": 1, "p90": 10, "p99": 100}
    series = {(s["endpoint"], s["workload"]): s for s in doc["series"]}
    assert set(series) == {("good", "seed000"), ("good", "tiny"), ("failing", "seed000")}

    good = series[("good", "seed000")]
    assert good["status"] == "ok" and good["labels"] == {"team": "a"} and good["model"] == "m"
    for label in doc["windows"]:
        w = good["windows"][label]
        assert (w["runs"], w["ok_runs"], w["uptime"]) == (3, 3, 1.0)
        decode = w["decode_tokens_per_second"]
        assert decode["samples"] == 3 and decode["p50"] is not None
        assert decode["p90"] is None and decode["p99"] is None  # 3 samples: below their minimum
        assert w["ttft_seconds"]["samples"] == 3 and 0 < w["ttft_seconds"]["p50"] < 5
    assert good["last_run"]["ok_tokens_per_second"] > 0
    # the p50 is the window median /metrics exports for the same series
    await app.refresh_windows()
    async with session.get(url + "/metrics") as resp:
        metrics = await resp.text()
    found = re.search(
        r'tokwatch_window_decode_percentile_tokens_per_second\{endpoint="good",percentile="50",'
        r'team="a",window="24h",workload="seed000"\} ([\d.e+]+)',
        metrics,
    )
    assert found is not None
    assert float(found.group(1)) == pytest.approx(good["windows"]["24h"]["decode_tokens_per_second"]["p50"])

    failing = series[("failing", "seed000")]
    assert failing["status"] == "provider_error" and failing["last_run"]["ok_time"] is None
    assert failing["windows"]["30m"]["uptime"] == 0.0
    assert failing["windows"]["30m"]["decode_tokens_per_second"] == {
        "samples": 0, "p50": None, "p90": None, "p99": None
    }  # fmt: skip
    assert series[("good", "tiny")]["windows"]["7d"]["runs"] == 1

    status, one = await _get(session, url + "/api/v1/endpoints/good")
    assert status == 200
    _valid(one)
    assert one["kind"] == "endpoint" and one["endpoint"] == "good"
    assert {s["workload"] for s in one["series"]} == {"seed000", "tiny"}
    assert all(s["endpoint"] == "good" for s in one["series"])
    # network vs server time (the endpoint view only): medians over the same 24 h runs as the TTFT p50
    net = {s["workload"]: s["network"] for s in one["series"]}
    seed = net["seed000"]
    assert seed["runs"] == 3 and seed["ttft_seconds"] == pytest.approx(
        good["windows"]["24h"]["ttft_seconds"]["p50"]
    )
    assert 1 <= seed["measured_runs"] <= 3  # the first round opened its connection; later ones may reuse it
    assert 0 < seed["network_rtt_seconds"] < seed["ttft_seconds"] and seed["server_seconds"] > 0
    assert seed["tls_seconds"] == 0.0 and 0 <= seed["network_share"] < 1  # plain HTTP on 127.0.0.1
    assert "network" not in series[("good", "seed000")]  # /status stays light

    status, missing = await _get(session, url + "/api/v1/endpoints/nope")
    assert status == 404
    _valid(missing)
    assert missing["kind"] == "error" and "nope" in missing["error"]
    async with session.get(url + "/api/v1/endpoints/good-old", allow_redirects=False) as resp:
        assert resp.status == 301 and resp.headers["Location"] == "/api/v1/endpoints/good"


async def test_answers_are_shared_for_a_few_seconds(exporter: tuple[App, str, aiohttp.ClientSession]) -> None:
    app, url, session = exporter
    await app.probe("good", "scheduled")
    await _stored(app, 1)
    first = (await _get(session, url + "/api/v1/status"))[1]
    await app.probe("good", "scheduled")
    await _stored(app, 2)
    again = (await _get(session, url + "/api/v1/status"))[1]
    assert again["generated_at"] == first["generated_at"]  # within MAX_AGE_S: the same computation
    good = next(s for s in again["series"] if s["endpoint"] == "good" and s["workload"] == "seed000")
    assert good["windows"]["24h"]["runs"] == 1


async def test_storage_off_and_store_outage_are_json_errors(tmp_path: Path, free_port: object) -> None:
    cfg = load_config_text(
        "storage: {enabled: false}\n"
        "endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}]",
        "t.yml",
    )
    off = await StatusApi(lambda: None, lambda: cfg).status()
    assert off.status == 503 and "storage.enabled: false" in _valid(off.body)["error"]
    dead = PostgresStore(f"postgresql://tokwatch:hunter2secret@127.0.0.1:{free_port()}/x", timeout_s=0.5)  # type: ignore[operator]
    try:
        out = await StatusApi(lambda: dead, lambda: cfg).endpoint("a")
    finally:
        await dead.close()
    assert out.status == 503 and "store unavailable" in _valid(out.body)["error"]
    assert "hunter2secret" not in json.dumps(out.body)


def test_docs_show_the_schema_the_code_validates_with() -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```json\n(.*?)\n```", text, re.S)
    assert json.loads(blocks[-1]) == SCHEMA  # the last block is the schema, verbatim
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
