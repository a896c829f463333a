"""OpenAI probe against the simulator: every status, both client timing sources, chunks, pings, reasoning."""

from __future__ import annotations

import pytest

from tokwatch.figures.result import Status, TimingSource
from tokwatch.figures.stats import percentile
from tokwatch.probes import get_probe
from tokwatch.probes.base import run_probe


@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ("http_429", Status.RATE_LIMITED, "http_429"),
        ("http_401", Status.AUTH_FAILURE, "http_401"),
        ("http_403", Status.AUTH_FAILURE, "http_403"),
        ("http_5xx", Status.PROVIDER_ERROR, "http_5xx"),
        ("malformed_json", Status.PROVIDER_ERROR, "malformed_json"),
        ("wrong_shape", Status.PROVIDER_ERROR, "bad_shape"),
        ("error_mid_stream", Status.PROVIDER_ERROR, "stream_error"),
        ("stall", Status.TIMEOUT, "read_timeout"),
        ("reset", Status.PROVIDER_ERROR, "reset"),
    ],
)
async def test_every_fault_status(
    start_sim, server, make_ctx, fault: str, status: Status, error_class: str
) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=400, fault_after_tokens=3, stall_seconds=30))
    sim.set_faults("s", "m", **{fault: 1.0})
    ctx = make_ctx(sim.base_url("s") + "/v1", endpoint={"timeout": 1.0}, max_tokens=16)
    r = await run_probe(get_probe("openai"), ctx)
    assert (r.status, r.error_class) == (status, error_class), r.error_message
    assert r.tokens_per_second is None
    assert r.error_message and len(r.error_message) <= 500


async def test_ok_and_degraded_short_output(start_sim, server, make_ctx) -> None:
    sim = await start_sim(
        server("s", "openai", decode_tps=400), server("short", "openai", natural_stop_tokens=5)
    )
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=16))
    assert r.status is Status.OK and r.output_tokens == 16
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("short"), max_tokens=16))
    assert (r.status, r.error_class) == (Status.DEGRADED, "short_output") and r.output_tokens == 5
    assert r.finish_reason == "stop"


async def test_client_stream_matches_true_decode_rate(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=100.0, prefill_tps=5000))
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=64))
    truth = sim.last_truth("s")
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_STREAM
    assert truth.decode_tps == pytest.approx(100.0, rel=0.05)
    assert r.tokens_per_second == pytest.approx(truth.decode_tps, rel=0.05)
    true_ttft = truth.emitted_at[0] - truth.arrival
    assert r.ttft_s == pytest.approx(true_ttft, abs=0.05)
    assert len(r.itl_s) == 63 and percentile(r.itl_s, 50) == pytest.approx(0.01, abs=0.005)


async def test_non_streamed_is_client_wall(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=400))
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=32, stream=False))
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_WALL and not r.streamed
    assert r.output_tokens == 32 and r.ttft_s is None and r.itl_s == []
    assert r.tokens_per_second == pytest.approx(32 / r.e2e_s)


async def test_multi_token_chunks(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=200, tokens_per_chunk=4))
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=32))
    truth = sim.last_truth("s")
    assert r.status is Status.OK and r.output_tokens == 32
    assert len(r.itl_s) == 31
    assert sum(1 for g in r.itl_s if g == 0.0) == 32 - len(truth.chunks)  # k-1 zeros per chunk
    assert r.tokens_per_second == pytest.approx(truth.decode_tps, rel=0.08)


async def test_pings_are_not_tokens(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=50, prefill_tps=200, ping_interval=0.005))
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=12, prompt="word " * 40))
    truth = sim.last_truth("s")
    assert r.status is Status.OK and r.output_tokens == 12 and len(r.itl_s) == 11
    assert r.ttft_s == pytest.approx(truth.emitted_at[0] - truth.arrival, abs=0.05)


@pytest.mark.parametrize("fmt", ["reasoning_content", "reasoning", "think_tags"])
async def test_reasoning_phase_all_formats(start_sim, server, make_ctx, fmt: str) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=200, think_tokens=12, reasoning_format=fmt))
    r = await run_probe(get_probe("openai"), make_ctx(sim.base_url("s"), max_tokens=40))
    truth = sim.last_truth("s")
    assert r.status is Status.OK, r.error_message
    assert (r.think_tokens, r.output_tokens) == (truth.think_tokens, truth.output_tokens) == (12, 28)
    first_out = truth.phases.index("output")
    true_ttot = truth.emitted_at[first_out] - truth.emitted_at[first_out - 1]
    assert r.ttot_s is not None and r.ttot_s == pytest.approx(true_ttot, abs=0.02)
    assert len(r.output_itl_s) == 27 and len(r.itl_s) == 39


async def test_api_key_accepted_and_never_logged(start_sim, make_ctx) -> None:
    key = "sk-sim-secret-abcdef"
    sim = await start_sim({"name": "s", "dialect": "openai", "api_key": key, "models": [{"name": "m"}]})
    ctx = make_ctx(sim.base_url("s"), api_key=key, max_tokens=4)
    r = await run_probe(get_probe("openai"), ctx)
    assert r.status is Status.OK
    r = await run_probe(
        get_probe("openai"), make_ctx(sim.base_url("s"), api_key="wrong-key-xyz", max_tokens=4)
    )
    assert r.status is Status.AUTH_FAILURE
    assert key not in "\n".join(ctx.log.lines)


@pytest.mark.parametrize(
    ("hostile", "status", "error_class"),
    [
        ({"endless_stream": True}, Status.PROVIDER_ERROR, "too_large"),
        ({"huge_body_bytes": 2_000_000}, Status.PROVIDER_ERROR, "too_large"),
        ({"invalid_utf8": True}, Status.PROVIDER_ERROR, "bad_encoding"),
    ],
)
async def test_hostile_simulated_endpoints(
    start_sim, server, make_ctx, hostile: dict, status: Status, error_class: str | None
) -> None:
    sim = await start_sim(server("s", "openai", decode_tps=5000, **hostile))
    ctx = make_ctx(sim.base_url("s"), endpoint={"timeout": 5.0}, max_tokens=16, max_response_bytes=64 * 1024)
    r = await run_probe(get_probe("openai"), ctx)
    assert (r.status, r.error_class) == (status, error_class), r.error_message
