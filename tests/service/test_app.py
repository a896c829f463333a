"""App wiring: probes, server counters, Ollama signals and window figures reach the registry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.sim import StartSim
from tokwatch.figures.result import TimingSource
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.sim.testing import RunningSim

SIM = """
seed: 5
servers:
  - name: v
    dialect: vllm
    models: [{name: m, decode_tps: 400, prefill_tps: 100000}]
  - name: o
    dialect: ollama
    models: [{name: "q:1b", decode_tps: 400, prefill_tps: 100000, cold_load_probability: 1.0,
              cold_load_duration: 200ms}]
"""


@pytest.fixture
async def app(sim: RunningSim) -> AsyncIterator[App]:
    cfg = load_config_text(f"""
probe: {{max_tokens: 24}}
# The simulator runs in this process: a busy test machine can stall the probe loop now and then, and
# such runs are flagged timing_disturbed (tested in test_measurement.py); count them here.
schedule: {{interval: 1h, window: 1h, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
endpoints:
  - {{name: vllm, kind: vllm, base_url: '{sim.url}/v/v1', model: m, scrape_interval: 1s}}
  - {{name: ollama, kind: ollama, base_url: '{sim.url}/o', model: 'q:1b', scrape_interval: 1s}}
""")
    application = App(cfg)
    await application.start(schedule=False)
    try:
        yield application
    finally:
        await application.stop()


async def test_vllm_probe_uses_counter_deltas(app: App) -> None:
    outcome = await app.probe("vllm")
    r = outcome.result
    assert r.ok and r.source is TimingSource.VLLM_METRICS
    assert r.tokens_per_second == pytest.approx(400, rel=0.1)
    assert app.exposition.get_sample_value("tokwatch_server_up", {"endpoint": "vllm"}) == 1


async def test_ollama_cold_load_counts_as_reload(app: App) -> None:
    outcome = await app.probe("ollama")
    assert outcome.result.ok and outcome.result.cold is True
    assert outcome.result.source is TimingSource.ENGINE
    assert app.exposition.get_sample_value("tokwatch_server_model_reloads_total", {"endpoint": "ollama"}) == 1


async def test_window_figures_from_ok_runs(app: App) -> None:
    for _ in range(3):
        await app.probe("vllm")
    labels = {"endpoint": "vllm", "workload": "seed000", "window": "1h"}
    assert app.exposition.get_sample_value("tokwatch_window_runs", labels) == 3
    assert app.exposition.get_sample_value("tokwatch_window_uptime_ratio", labels) == 1.0
    median = app.exposition.get_sample_value("tokwatch_window_decode_tokens_per_second_median", labels)
    assert median == pytest.approx(400, rel=0.1)
    assert app.exposition.get_sample_value("tokwatch_window_decode_tokens_per_second_cv_ratio", labels) < 0.1


async def test_a_rotated_api_key_file_is_used_without_a_restart(tmp_path: Path, start_sim: StartSim) -> None:
    sim = await start_sim("""
servers:
  - name: k
    dialect: openai
    api_key: sk-rotated-NEW-key-0002
    models: [{name: m, decode_tps: 2000, prefill_tps: 100000}]
""")
    key_file = tmp_path / "key"
    key_file.write_text("sk-expired-OLD-key-0001\n")
    cfg = load_config_text(f"""
probe: {{max_tokens: 8}}
schedule: {{interval: 1h, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
endpoints:
  - {{name: k, kind: openai, base_url: '{sim.url}/k/v1', model: m, api_key_file: '{key_file}'}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        before = await app.probe("k")
        assert before.result.status.value == "auth_failure"
        assert "sk-expired-OLD-key-0001" not in (before.result.error_message or "")
        tmp = tmp_path / "key.new"
        tmp.write_text("sk-rotated-NEW-key-0002\n")
        tmp.replace(key_file)  # how secret managers rotate: a new file renamed over the old
        after = await app.probe("k")
        assert after.result.ok, after.result.error_message
        assert app.keys.redactor("x sk-rotated-NEW-key-0002 sk-expired-OLD-key-0001") == "x *** ***"
        key_file.unlink()  # mid-rotation: the last key read stays in use
        assert (await app.probe("k")).result.ok
    finally:
        await app.stop()


async def test_kind_openai_with_metrics_url_uses_counter_deltas(sim: RunningSim) -> None:
    cfg = load_config_text(f"""
probe: {{max_tokens: 24}}
schedule: {{interval: 1h, window_includes: [timing_disturbed]}}
storage: {{enabled: false}}
endpoints:
  - {{name: gw, kind: openai, base_url: '{sim.url}/v/v1', model: m, metrics_url: '{sim.url}/v/metrics'}}
  - {{name: plain, kind: openai, base_url: '{sim.url}/v/v1', model: m}}
""")
    app = App(cfg)
    await app.start(schedule=False)
    try:
        gw = (await app.probe("gw")).result
        assert gw.ok and gw.source is TimingSource.VLLM_METRICS, gw.candidates
        assert gw.tokens_per_second == pytest.approx(400, rel=0.1)
        plain = (await app.probe("plain")).result
        assert plain.ok and TimingSource.VLLM_METRICS not in plain.candidates
    finally:
        await app.stop()


async def test_skipped_rounds_reach_the_registry(start_sim: StartSim) -> None:
    # 16 tokens at 8 tok/s: each round takes about 2 s against an interval of 1 s, so slots are skipped.
    sim = await start_sim("""
servers:
  - name: s
    dialect: openai
    models: [{name: m, decode_tps: 8, prefill_tps: 100000}]
""")
    cfg = load_config_text(f"""
probe: {{max_tokens: 16, warmup: false}}
schedule: {{interval: 1s, offset: 0s, run_on_start: true}}
storage: {{enabled: false}}
endpoints:
  - {{name: slow, kind: openai, base_url: '{sim.url}/s/v1', model: m, timeout: 10s}}
""")
    app = App(cfg)
    await app.start()
    try:
        for _ in range(200):  # bounded: 10 s
            stats = app.scheduler_stats
            if stats is not None and stats.skipped_slots >= 1:
                break
            await asyncio.sleep(0.05)
        stats = app.scheduler_stats
        assert stats is not None and stats.skipped_slots >= 1
        skipped = app.exposition.get_sample_value("tokwatch_scheduler_skipped_rounds_total")
        assert skipped == stats.skipped_slots
        # ... and /metrics serves the same sample
        served = app.exposition.render().decode()
        assert f"tokwatch_scheduler_skipped_rounds_total {float(stats.skipped_slots)}" in served
    finally:
        await app.stop()


async def test_changed_metrics_parts_are_rendered_before_a_scrape(app: App) -> None:
    app.exposition.render()
    await app.probe("vllm")  # the probe's part and (scrape_interval 1 s) the server counters' part change
    before = app.exposition.parts_rendered
    for _ in range(60):  # bounded: 3 s, the background pass runs every second
        await asyncio.sleep(0.05)
        if app.exposition.parts_rendered > before:
            break
    assert app.exposition.parts_rendered > before  # rendered without any scrape
    app.exposition.prerender()  # catch up with a counter scrape that landed in between
    rendered = app.exposition.parts_rendered
    body = app.exposition.render()
    assert app.exposition.parts_rendered == rendered  # the scrape joined ready bytes
    assert b'tokwatch_probe_decode_tokens_per_second{endpoint="vllm"' in body
