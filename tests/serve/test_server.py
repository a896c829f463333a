"""The exporter over real loopback HTTP against the simulated server: /metrics, /probe, reload, secrets."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tokwatch.figures.result import Status
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.testing import RunningSim

SECRET = "sk-test-0123456789abcdef"

SIM = """
seed: 1
servers:
  - name: oa
    dialect: openai
    api_key: sk-test-0123456789abcdef
    models:
      - {name: m, decode_tps: 2000, prefill_tps: 100000}
  - name: slow
    dialect: openai
    models:
      - {name: stall, decode_tps: 2000, prefill_tps: 100000, faults: {stall: 1.0}}
      - {name: slowish, decode_tps: 10, prefill_tps: 100000}
"""


def exporter_config(url: str, extra: str = "") -> str:
    return f"""
probe: {{max_tokens: 16, warmup: false}}
storage: {{enabled: false}}
schedule: {{interval: 1h, offset: 0s, run_on_start: false}}
endpoints:
  - {{name: good, kind: openai, base_url: '{url}/oa/v1', model: m, api_key: {SECRET}, labels: {{team: a}}}}
  - {{name: stalled, kind: openai, base_url: '{url}/slow/v1', model: stall, timeout: 1s}}
  - {{name: slowish, kind: openai, base_url: '{url}/slow/v1', model: slowish}}
{extra}"""


@dataclass
class Running:
    app: App
    url: str
    sim_url: str
    session: aiohttp.ClientSession


@pytest.fixture
async def running(sim: RunningSim, tmp_path: Path) -> AsyncIterator[Running]:
    cfg_file = tmp_path / "tokwatch.yml"
    cfg_file.write_text(exporter_config(sim.url))
    app = App(load_config_text(cfg_file.read_text(), str(cfg_file)), str(cfg_file))
    await app.start()
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield Running(app, f"http://127.0.0.1:{port}", sim.url, session)
    finally:
        await app.stop()
        await runner.cleanup()


async def get(r: Running, path: str, **kw: object) -> tuple[int, str]:
    async with r.session.get(r.url + path, **kw) as resp:  # type: ignore[arg-type]
        return resp.status, await resp.text()


ON_DEMAND_OK = 'tokwatch_probe_success{endpoint="good",team="a",trigger="on_demand",workload="seed000"} 1.0'


async def test_probe_returns_only_that_runs_metrics(running: Running) -> None:
    status, body = await get(running, "/probe?target=good")
    assert status == 200
    assert ON_DEMAND_OK in body
    # client_stream, or client_wall when a busy host merged this 8 ms stream into one read
    tps = (
        r'tokwatch_probe_decode_tokens_per_second\{endpoint="good",source="client_(stream|wall)",team="a",'
        r'trigger="on_demand",workload="seed000"\}'
    )
    assert re.search(tps, body)
    assert "stalled" not in body and "tokwatch_probe_runs_total" not in body
    # the run is also recorded for /metrics
    status, metrics = await get(running, "/metrics")
    assert 'tokwatch_probe_runs_total{endpoint="good",status="ok",team="a",workload="seed000"} 1.0' in metrics


@pytest.mark.parametrize("target", ["http://127.0.0.1:1/v1", "unknown", "", "good%0Aevil"])
async def test_probe_rejects_urls_and_unknown_names(running: Running, target: str) -> None:
    before = running.app.probe_metrics.state("good").runs.copy()  # type: ignore[union-attr]
    status, body = await get(running, f"/probe?target={target}")
    assert status == 400
    assert "configured endpoint names" in body or "missing" in body
    assert running.app.probe_metrics.state("good").runs == before  # type: ignore[union-attr]


async def test_probe_debug_shows_log_without_secret(running: Running) -> None:
    status, body = await get(running, "/probe?target=good&debug=true")
    assert status == 200
    assert "Logs for the probe:" in body and "timed run: ok" in body
    assert SECRET not in body
    _, metrics = await get(running, "/metrics")
    assert SECRET not in metrics


async def test_timeout_is_a_status_and_does_not_block_others(running: Running) -> None:
    stalled = asyncio.create_task(get(running, "/probe?target=stalled"))
    status, body = await get(running, "/probe?target=good")  # answers while the other stalls
    assert status == 200
    assert ON_DEMAND_OK in body
    assert not stalled.done()
    status, body = await asyncio.wait_for(stalled, 10)
    labels = 'endpoint="stalled",status="timeout",trigger="on_demand",workload="seed000"'
    assert f"tokwatch_probe_status{{{labels}}} 1.0" in body


async def test_concurrent_probes_of_one_target_share_one_run(running: Running) -> None:
    results = await asyncio.gather(*(get(running, "/probe?target=slowish") for _ in range(3)))
    assert all(s == 200 for s, _ in results)
    state = running.app.probe_metrics.state("slowish")
    assert state is not None and sum(state.runs.values()) == 1


async def test_scrape_timeout_header_cannot_turn_a_slow_run_into_a_stored_timeout(running: Running) -> None:
    headers = {"X-Prometheus-Scrape-Timeout-Seconds": "1.5"}
    t0 = asyncio.get_running_loop().time()
    status, body = await get(running, "/probe?target=slowish", headers=headers)  # 16 tokens at 10 tok/s
    assert asyncio.get_running_loop().time() - t0 < 5
    assert status == 503 and "still running" in body
    state = running.app.probe_metrics.state("slowish")
    assert state is not None
    for _ in range(100):  # the run goes on with the endpoint's own timeout and is recorded when it ends
        if state.last is not None:
            break
        await asyncio.sleep(0.05)
    assert state.last is not None and state.last.ok and state.last.trigger == "on_demand"
    assert state.runs[Status.TIMEOUT] == 0


async def test_probe_within_the_minimum_interval_returns_the_last_run(running: Running) -> None:
    status, first = await get(running, "/probe?target=good")
    assert status == 200
    status, again = await get(running, "/probe?target=good")
    assert status == 200 and again == first  # the same run, not a new request to the endpoint
    state = running.app.probe_metrics.state("good")
    assert state is not None and sum(state.runs.values()) == 1


async def test_health_ready_and_metrics_self(running: Running) -> None:
    assert (await get(running, "/-/healthy"))[0] == 200
    assert (await get(running, "/-/ready"))[0] == 200
    _, metrics = await get(running, "/metrics")
    assert "tokwatch_build_info{" in metrics
    assert "tokwatch_config_last_reload_successful 1.0" in metrics
    assert "tokwatch_scheduler_interval_seconds 3600.0" in metrics


async def test_reload_applies_and_bad_reload_keeps_config(running: Running, tmp_path: Path) -> None:
    cfg = Path(running.app.config_path or "")
    cfg.write_text(
        exporter_config(
            running.sim_url, "  - {name: added, kind: ollama, base_url: 'http://127.0.0.1:9', model: x}"
        )
    )
    async with running.session.post(running.url + "/-/reload") as resp:
        assert resp.status == 200 and "reloaded" in await resp.text()
    assert running.app.config.endpoint("added") is not None
    cfg.write_text("endpoints: [{name: broken}]\n")
    async with running.session.post(running.url + "/-/reload") as resp:
        assert resp.status == 500
        assert "endpoints[0].kind: Field required" in await resp.text()
    assert running.app.config.endpoint("added") is not None
    _, metrics = await get(running, "/metrics")
    assert "tokwatch_config_last_reload_successful 0.0" in metrics
    # the bad edit reverted: the file is the running config again, so the alert must clear
    cfg.write_text(
        exporter_config(
            running.sim_url, "  - {name: added, kind: ollama, base_url: 'http://127.0.0.1:9', model: x}"
        )
    )
    async with running.session.post(running.url + "/-/reload") as resp:
        assert resp.status == 200 and "unchanged" in await resp.text()
    _, metrics = await get(running, "/metrics")
    assert "tokwatch_config_last_reload_successful 1.0" in metrics


ECHOED_KEY = "tw-echoed-Key-7781"  # not credential-shaped: only the known-secret redaction can mask it


async def test_a_failed_run_is_logged_once_at_debug_with_its_class_and_message(
    running: Running, caplog: pytest.LogCaptureFixture, serve: Any
) -> None:
    async def rejects(request: web.Request) -> web.Response:
        # As OpenAI does: the 401 body quotes the key it was given.
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        message = f"Incorrect API key provided: {key}. Check it."
        return web.json_response({"error": {"message": message, "code": "invalid_api_key"}}, status=401)

    echo_url = await serve({"/v1/chat/completions": rejects})
    cfg = Path(running.app.config_path or "")
    cfg.write_text(
        exporter_config(
            running.sim_url,
            f"  - {{name: echo, kind: openai, base_url: '{echo_url}/v1', model: m, api_key: {ECHOED_KEY}}}",
        )
    )
    async with running.session.post(running.url + "/-/reload") as resp:
        assert resp.status == 200, await resp.text()
    caplog.set_level(logging.DEBUG, logger="tokwatch")
    await get(running, "/probe?target=stalled")
    await get(running, "/probe?target=echo")

    def lines(name: str) -> list[str]:
        # One line per run at DEBUG only: at INFO a round's failed runs are one line
        # (tokwatch.logs.round_log).
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith(f"endpoint {name}:") and r.levelno == logging.DEBUG
        ]

    stalled = lines("stalled")
    assert len(stalled) == 1, stalled
    assert stalled[0].startswith("endpoint stalled: timeout (read_timeout): "), stalled[0]
    echo = lines("echo")
    assert len(echo) == 1, echo
    assert echo[0].startswith("endpoint echo: auth_failure (http_401): HTTP 401: "), echo[0]
    assert "Incorrect API key provided: ***. Check it." in echo[0]  # the message, with the key masked
    assert ECHOED_KEY not in caplog.text


async def test_ready_is_503_while_the_scheduler_restarts_after_a_crash(running: Running) -> None:
    app = running.app
    sched = app._scheduler
    assert sched is not None
    real = sched._settings
    calls = 0

    def crash_once():  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected")
        return real()

    sched._settings = crash_once  # type: ignore[method-assign]
    sched.reschedule()  # wake it: it reads its settings again, and fails
    for _ in range(100):
        if app.scheduler_stats is not None and app.scheduler_stats.crashes:
            break
        await asyncio.sleep(0.01)
    assert (await get(running, "/-/ready"))[0] == 503
    _, metrics = await get(running, "/metrics")
    assert "tokwatch_scheduler_crashes_total 1.0" in metrics and "tokwatch_scheduler_up 0.0" in metrics
    for _ in range(300):  # restarted after the 1 s back-off
        if app.ready:
            break
        await asyncio.sleep(0.02)
    assert (await get(running, "/-/ready"))[0] == 200


async def test_secret_never_logged(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await get(running, "/probe?target=good&debug=true")
    assert SECRET not in caplog.text
