"""Ollama probe against the simulator: engine and server_wall sources, cold loads, both APIs, statuses."""

from __future__ import annotations

import pytest

from tokwatch.figures.result import Status, TimingSource
from tokwatch.probes import get_probe
from tokwatch.probes.base import run_probe


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", ["chat", "generate"])
async def test_engine_source(start_sim, server, make_ctx, stream: bool, api: str) -> None:
    sim = await start_sim(server("o", "ollama", decode_tps=150))
    ctx = make_ctx(sim.base_url("o"), "ollama", endpoint={"ollama_api": api}, max_tokens=24, stream=stream)
    r = await run_probe(get_probe("ollama"), ctx)
    truth = sim.last_truth("o")
    assert r.status is Status.OK, r.error_message
    assert r.source is TimingSource.ENGINE and r.tokens_source == "engine"
    assert r.output_tokens == 24 and r.tokens_per_second == pytest.approx(150, rel=0.05)
    # Ollama's engine figure is eval_count over eval_duration (end of prefill to the last token). The
    # simulator's first-to-last decode rate is not that figure: a first token stamped late on a loaded
    # machine (the simulator then catches up with its plan) inflates it while eval_duration stays put.
    eval_s = truth.generated_at[-1] - truth.prefill_end
    assert r.tokens_per_second == pytest.approx(truth.tokens / eval_s, rel=1e-3)
    assert truth.route.endswith(api)
    assert r.streamed is stream and (r.ttft_s is not None) is stream
    assert r.cold is False


async def test_stripped_eval_duration_falls_back_to_server_wall(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("o", "ollama", decode_tps=150, strip_eval_duration=True))
    r = await run_probe(get_probe("ollama"), make_ctx(sim.base_url("o"), "ollama", max_tokens=24))
    assert r.status is Status.OK and r.source is TimingSource.SERVER_WALL
    assert TimingSource.ENGINE not in r.candidates and TimingSource.CLIENT_STREAM in r.candidates
    assert r.tokens_per_second < 150 * 1.02  # total_duration includes prompt evaluation: conservative


async def test_cold_load_on_timed_run(start_sim, server, make_ctx) -> None:
    sim = await start_sim(
        server("o", "ollama", decode_tps=300, cold_load_probability=1.0, cold_load_duration=0.2),
        server("w", "ollama", decode_tps=300, warm_load_duration=0.004),
    )
    r = await run_probe(get_probe("ollama"), make_ctx(sim.base_url("o"), "ollama", max_tokens=8))
    assert r.status is Status.OK and r.cold is True
    # a resident model still reports a few ms of load_duration: not a cold load
    r = await run_probe(get_probe("ollama"), make_ctx(sim.base_url("w"), "ollama", max_tokens=8))
    assert r.status is Status.OK and r.cold is False


async def test_thinking_field(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("o", "ollama", decode_tps=300, think_tokens=6))
    r = await run_probe(get_probe("ollama"), make_ctx(sim.base_url("o"), "ollama", max_tokens=20))
    assert r.status is Status.OK and (r.think_tokens, r.output_tokens) == (6, 14)
    assert r.ttot_s is not None and len(r.output_itl_s) == 13


@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ("http_429", Status.RATE_LIMITED, "http_429"),
        ("http_5xx", Status.PROVIDER_ERROR, "http_5xx"),
        ("error_mid_stream", Status.PROVIDER_ERROR, "stream_error"),
        ("malformed_json", Status.PROVIDER_ERROR, "malformed_json"),
        ("stall", Status.TIMEOUT, "read_timeout"),
    ],
)
async def test_faults(start_sim, server, make_ctx, fault: str, status: Status, error_class: str) -> None:
    sim = await start_sim(server("o", "ollama", fault_after_tokens=2, stall_seconds=30))
    sim.set_faults("o", "m", **{fault: 1.0})
    r = await run_probe(get_probe("ollama"), make_ctx(sim.base_url("o"), "ollama", endpoint={"timeout": 1.0}))
    assert (r.status, r.error_class) == (status, error_class), r.error_message
