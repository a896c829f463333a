"""vLLM probe against the simulator: request shape, reasoning_content, multi-token chunks, counters hook."""

from __future__ import annotations

import pytest

from tokwatch.figures.result import Status, TimingSource
from tokwatch.probes import get_probe
from tokwatch.probes.base import CounterMeasurement, run_probe
from tokwatch.probes.http import plan_for
from tokwatch.probes.vllm import VllmProbe
from tokwatch.transport.request_options import merge_body


async def test_streamed_reasoning_and_chunks(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("v", "vllm", decode_tps=200, think_tokens=8, tokens_per_chunk=2))
    r = await run_probe(get_probe("vllm"), make_ctx(sim.base_url("v") + "/v1", "vllm", max_tokens=32))
    truth = sim.last_truth("v")
    assert r.status is Status.OK, r.error_message
    assert (r.think_tokens, r.output_tokens) == (8, 24)
    assert r.source is TimingSource.CLIENT_STREAM and r.tokens_per_second == pytest.approx(
        truth.decode_tps, rel=0.1
    )


def test_body_requests_continuous_usage(make_ctx) -> None:
    ctx = make_ctx(
        "http://127.0.0.1:1/v1", "vllm", endpoint={"extra_body": {"stream_options": {"x": 1}, "top_k": 5}}
    )
    _, body = VllmProbe().request(ctx, plan_for(ctx))
    body = merge_body(body, ctx.endpoint.extra_body)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True, "x": 1}
    assert body["top_k"] == 5 and body["model"] == "m"


class Counters:
    def __init__(self) -> None:
        self.calls = 0

    async def snapshot(self) -> object | None:
        self.calls += 1
        return self.calls

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement | None:
        return CounterMeasurement(123.0, False)


async def test_counter_figure_wins_over_client(start_sim, server, make_ctx) -> None:
    sim = await start_sim(server("v", "vllm", decode_tps=300))
    counters = Counters()
    r = await run_probe(
        get_probe("vllm"), make_ctx(sim.base_url("v"), "vllm", counters=counters, max_tokens=16)
    )
    assert r.source is TimingSource.VLLM_METRICS and r.tokens_per_second == 123.0 and counters.calls == 2
