"""ServerCounters and the counter window against the simulator's real-name /metrics (tokwatch.sim)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tokwatch.counters import ServerCollector, ServerCounters
from tokwatch.counters.window import ServerCounterWindow, WindowSnapshot
from tokwatch.figures.result import Status, TimingSource
from tokwatch.probes import get_probe
from tokwatch.probes.base import CounterMeasurement, ProbeContext, ProbeLog, run_probe
from tokwatch.settings.config import EndpointSettings, ProbeSettings
from tokwatch.sim.config import SimConfig
from tokwatch.sim.testing import RunningSim, run_sim
from tokwatch.transport.http import HttpClient

MODEL = "sim-model"


class RecordingWindow:
    """Passes through to a real window and keeps the last measurement for assertions."""

    def __init__(self, window: ServerCounterWindow) -> None:
        self.window = window
        self.last: CounterMeasurement | None = None

    async def snapshot(self) -> WindowSnapshot | None:
        return await self.window.snapshot()

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement:
        self.last = self.window.measure(before, after)
        return self.last


def sim_config(**server: Any) -> SimConfig:
    settings = {
        "name": "srv",
        "dialect": "vllm",
        "models": [{"name": MODEL, "decode_tps": 400.0, "prefill_tps": 20000.0}],
        **server,
    }
    return SimConfig.model_validate({"servers": [settings]})


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    async with HttpClient() as client:
        yield client


def endpoint(sim: RunningSim, kind: str = "vllm", **kw: Any) -> EndpointSettings:
    return EndpointSettings.model_validate(
        {
            "name": "sim-ep",
            "kind": kind,
            "base_url": f"{sim.base_url('srv')}/v1",
            "model": MODEL,
            "max_tokens": 64,
            "timeout": 20,
            **kw,
        }
    )


def context(ep: EndpointSettings, http: HttpClient, window: Any = None) -> ProbeContext:
    return ProbeContext(
        endpoint=ep,
        settings=ProbeSettings(max_tokens=64, warmup=False),
        http=http,
        api_key=None,
        log=ProbeLog(),
        counters=window,
    )


@pytest.mark.parametrize(
    ("dialect", "server"),
    [
        ("vllm", {}),
        ("vllm", {"legacy_names": True}),
        ("vllm", {"data_parallel": 2}),
        ("llamacpp", {}),
        ("sglang", {}),
    ],
)
async def test_counter_delta_matches_the_true_decode_rate(
    http: HttpClient, dialect: str, server: dict[str, Any]
) -> None:
    async with run_sim(sim_config(dialect=dialect, **server)) as sim:
        ep = endpoint(sim, dialect)
        window = RecordingWindow(ServerCounters(ep, http).window)
        ctx = context(ep, http, window)
        result = await run_probe(get_probe(dialect), ctx)
        assert result.status is Status.OK, result.error_message
        truth = sim.last_truth("srv")
        assert truth is not None and truth.decode_tps is not None
        m = window.last
        assert m is not None and m.tokens_per_second is not None, m
        assert not m.shared, m.reason
        assert m.tokens_per_second == pytest.approx(truth.decode_tps, rel=0.02)
        assert result.candidates[TimingSource.VLLM_METRICS] == m.tokens_per_second


async def test_background_traffic_flags_the_window_as_shared(http: HttpClient) -> None:
    async with run_sim(sim_config(background_rps=40.0, background_max_tokens=200)) as sim:
        ep = endpoint(sim)
        window = RecordingWindow(ServerCounters(ep, http).window)
        await asyncio.sleep(0.3)  # let background requests start
        result = await run_probe(get_probe("vllm"), context(ep, http, window))
        assert result.status is Status.OK
        assert window.last is not None and window.last.shared
        assert window.last.reason and "requests" in window.last.reason


async def test_counter_reset_between_snapshots_gives_no_figure(http: HttpClient) -> None:
    async with run_sim(sim_config()) as sim:
        ep = endpoint(sim)
        window = ServerCounters(ep, http).window
        before = await window.snapshot()
        assert (await run_probe(get_probe("vllm"), context(ep, http))).status is Status.OK
        sim.restart_counters("srv")
        assert (await run_probe(get_probe("vllm"), context(ep, http))).status is Status.OK
        after = await window.snapshot()
        m = window.measure(before, after)
        assert m.tokens_per_second is None
        assert m.reason is not None and "reset" in m.reason


async def test_preemptions_mirroring_and_server_down(http: HttpClient) -> None:
    cfg = sim_config(kv_capacity_tokens=400, background_prompt_tokens=16)
    registry = CollectorRegistry()
    labels = {"endpoint": "sim-ep"}
    async with run_sim(cfg) as sim:
        ep = endpoint(
            sim, mirror_metrics=("vllm:num_preemptions", "vllm:num_requests_running"), max_tokens=150
        )
        counters = ServerCounters(ep, http)
        registry.register(ServerCollector([counters.state]))
        assert await counters.scrape_once() is not None
        # Six concurrent 150-token requests cannot all fit in 400 KV tokens: the engine preempts.
        results = await asyncio.gather(*(run_probe(get_probe("vllm"), context(ep, http)) for _ in range(6)))
        assert all(r.status is Status.OK for r in results), [r.error_message for r in results]
        assert await counters.scrape_once() is not None
        preempted = registry.get_sample_value("tokwatch_server_preemptions_total", labels)
        assert preempted is not None and preempted > 0
        assert (
            registry.get_sample_value(
                "tokwatch_server_mirrored_total", {**labels, "metric": "vllm:num_preemptions"}
            )
            == preempted
        )
        assert (
            registry.get_sample_value(
                "tokwatch_server_mirrored_value", {**labels, "metric": "vllm:num_requests_running"}
            )
            == 0
        )
        assert registry.get_sample_value("tokwatch_server_kv_cache_usage_ratio", labels) is not None
        # A restart resets the server's counter; tokwatch's total keeps every preemption.
        sim.restart_counters("srv")
        assert await counters.scrape_once() is not None
        assert registry.get_sample_value("tokwatch_server_preemptions_total", labels) == preempted
    assert await counters.scrape_once() is None  # the simulator is gone
    assert registry.get_sample_value("tokwatch_server_up", labels) == 0
    assert registry.get_sample_value("tokwatch_server_requests_running", labels) is None
    assert registry.get_sample_value("tokwatch_server_preemptions_total", labels) == preempted
    assert registry.get_sample_value("tokwatch_server_scrape_errors_total", labels) == 1
