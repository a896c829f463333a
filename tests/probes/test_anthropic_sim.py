"""The anthropic kind against the simulator's Messages dialect: figures against its truth, thinking blocks,
cached prompt tokens, pings, error events, 529 and every HTTP fault, the key in x-api-key, and the bench."""

from __future__ import annotations

import pytest
from rich.console import Console

from tokwatch.bench.config import build_options
from tokwatch.bench.session import run_bench
from tokwatch.figures.result import Status, TimingSource
from tokwatch.figures.stats import percentile
from tokwatch.probes import get_probe, probe_class
from tokwatch.probes.base import run_probe
from tokwatch.settings.access import Credentials

KEY = "sk-ant-sim-0123456789"


def anthropic_server(**model: object) -> dict[str, object]:
    return {"name": "a", "dialect": "anthropic", "api_key": KEY, "models": [{"name": "claude-sim", **model}]}


@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ("http_529", Status.RATE_LIMITED, "http_529"),
        ("overloaded_mid_stream", Status.RATE_LIMITED, "overloaded"),
        ("http_429", Status.RATE_LIMITED, "http_429"),
        ("http_401", Status.AUTH_FAILURE, "http_401"),
        ("http_403", Status.AUTH_FAILURE, "http_403"),
        ("http_5xx", Status.PROVIDER_ERROR, "http_5xx"),
        ("error_mid_stream", Status.PROVIDER_ERROR, "stream_error"),
        ("malformed_json", Status.PROVIDER_ERROR, "malformed_json"),
        ("wrong_shape", Status.PROVIDER_ERROR, "bad_shape"),
        ("stall", Status.TIMEOUT, "read_timeout"),
        ("reset", Status.PROVIDER_ERROR, "reset"),
    ],
)
async def test_every_fault_status(start_sim, make_ctx, fault: str, status: Status, error_class: str) -> None:
    sim = await start_sim(anthropic_server(decode_tps=400, fault_after_tokens=3, stall_seconds=30))
    sim.set_faults("a", "claude-sim", **{fault: 1.0})
    ctx = make_ctx(
        sim.base_url("a"), "anthropic", "claude-sim", api_key=KEY, endpoint={"timeout": 1.0}, max_tokens=16
    )
    r = await run_probe(get_probe("anthropic"), ctx)
    assert (r.status, r.error_class) == (status, error_class), r.error_message
    assert r.tokens_per_second is None and r.error_message and len(r.error_message) <= 500


async def test_overloaded_without_streaming_is_a_529(start_sim, make_ctx) -> None:
    sim = await start_sim(anthropic_server(faults={"overloaded_mid_stream": 1.0}))
    ctx = make_ctx(sim.base_url("a"), "anthropic", "claude-sim", api_key=KEY, max_tokens=8, stream=False)
    r = await run_probe(get_probe("anthropic"), ctx)
    assert (r.status, r.error_class, r.http_status) == (Status.RATE_LIMITED, "http_529", 529)
    assert "overloaded_error" in (r.error_message or "")


async def test_figures_match_the_simulators_truth(start_sim, make_ctx) -> None:
    sim = await start_sim(
        anthropic_server(decode_tps=100.0, prefill_tps=5000, think_tokens=12, ping_interval=0.004)
    )
    ctx = make_ctx(
        sim.base_url("a") + "/v1",
        "anthropic",
        "claude-sim",
        api_key=KEY,
        max_tokens=64,
        system_prompt="Be brief.",
    )
    r = await run_probe(get_probe("anthropic"), ctx)
    truth = sim.last_truth("a")
    assert r.status is Status.OK, r.error_message
    assert r.source is TimingSource.CLIENT_STREAM
    assert r.tokens_per_second == pytest.approx(truth.decode_tps, rel=0.05)
    assert r.ttft_s == pytest.approx(truth.emitted_at[0] - truth.arrival, abs=0.05)
    assert (r.think_tokens, r.output_tokens) == (truth.think_tokens, truth.output_tokens) == (12, 52)
    assert len(r.itl_s) == 63 and percentile(r.itl_s, 50) == pytest.approx(0.01, abs=0.005)
    first_out = truth.phases.index("output")
    assert r.ttot_s == pytest.approx(truth.emitted_at[first_out] - truth.emitted_at[first_out - 1], abs=0.02)
    assert r.prompt_tokens == truth.prompt_tokens and r.finish_reason == "max_tokens"
    assert r.cached_tokens == truth.cached_tokens == 0


async def test_cached_prompt_tokens_are_the_cache_reads(start_sim, make_ctx) -> None:
    sim = await start_sim(anthropic_server(decode_tps=400))
    long_system = "You answer questions about physics in plain words. " * 12
    ctx = make_ctx(
        sim.base_url("a"), "anthropic", "claude-sim", api_key=KEY, max_tokens=8,
        system_prompt=long_system, timed_prompt="same",
    )  # fmt: skip
    r = await run_probe(get_probe("anthropic"), ctx)  # the warm-up sent the same prompt
    truth = sim.last_truth("a")
    assert r.status is Status.OK, r.error_message
    assert truth.cached_tokens > 0
    assert (r.prompt_tokens, r.cached_tokens) == (truth.prompt_tokens, truth.cached_tokens)


async def test_not_streamed_is_client_wall_with_the_thinking_block(start_sim, make_ctx) -> None:
    sim = await start_sim(anthropic_server(decode_tps=400, think_tokens=5))
    ctx = make_ctx(sim.base_url("a"), "anthropic", "claude-sim", api_key=KEY, max_tokens=24, stream=False)
    r = await run_probe(get_probe("anthropic"), ctx)
    truth = sim.last_truth("a")
    assert r.status is Status.OK and r.source is TimingSource.CLIENT_WALL and not r.streamed
    assert r.output_tokens + r.think_tokens == truth.tokens == 24 and r.think_tokens > 0
    assert r.ttft_s is None and r.tokens_per_second == pytest.approx(24 / r.e2e_s)


async def test_the_key_goes_in_x_api_key_and_is_never_logged(start_sim, make_ctx) -> None:
    sim = await start_sim(anthropic_server())
    ctx = make_ctx(sim.base_url("a"), "anthropic", "claude-sim", api_key=KEY, max_tokens=4)
    assert (await run_probe(get_probe("anthropic"), ctx)).status is Status.OK
    wrong = make_ctx(sim.base_url("a"), "anthropic", "claude-sim", api_key="sk-ant-wrong-000", max_tokens=4)
    r = await run_probe(get_probe("anthropic"), wrong)
    assert (r.status, r.error_class) == (Status.AUTH_FAILURE, "http_401")
    assert "authentication_error" in (r.error_message or "")
    assert KEY not in "\n".join(ctx.log.lines)
    # a Bearer token is not how Anthropic takes its key: an endpoint that says so is refused
    bearer = make_ctx(
        sim.base_url("a"),
        "anthropic",
        "claude-sim",
        api_key=KEY,
        max_tokens=4,
        endpoint={"auth": {"type": "bearer"}},
    )
    bearer.headers = probe_class("anthropic").endpoint_headers(bearer.endpoint, Credentials(api_key=KEY))
    assert bearer.headers["Authorization"] == f"Bearer {KEY}" and "x-api-key" not in bearer.headers
    assert (await run_probe(get_probe("anthropic"), bearer)).status is Status.AUTH_FAILURE


async def test_bench_kind_anthropic_matches_the_truth(start_sim, tmp_path, monkeypatch) -> None:
    sim = await start_sim(anthropic_server(decode_tps=200, think_tokens=4, ping_interval=0.005))
    monkeypatch.setenv("ANTHROPIC_KEY", KEY)
    opts = build_options(
        {
            "url": sim.base_url("a"), "kind": "anthropic", "model": "claude-sim",
            "api_key_env": "ANTHROPIC_KEY", "concurrency": 2, "number": 4, "output_tokens": "16",
            "input_tokens": "32", "plots": False, "live_interval": 60,
        }
    )  # fmt: skip
    outcome, out_dir = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    assert outcome.complete and len(outcome.records) == 4
    for r in outcome.records:
        truth = sim.truth(r.server_request_id)
        assert truth is not None and r.ok, r.error_message
        assert (r.think_tokens, r.output_tokens) == (truth.think_tokens, truth.output_tokens) == (4, 12)
        assert r.ttft_s == pytest.approx(truth.emitted_at[0] - truth.arrival, abs=0.02)
        assert r.decode_tokens_per_s == pytest.approx(truth.decode_tps, rel=0.05)
    for path in out_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
