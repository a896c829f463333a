"""Energy from a DCGM-style /metrics against the simulator's exact energy (its truth): sampled by the
sampler every run uses, over an interval with requests starting and finishing, within 1 %."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.support.waiting import wait_until
from tokwatch.counters.parse import parse_metrics
from tokwatch.counters.power import PowerTrace, read_power, sample_power
from tokwatch.figures.energy import integrate_power, joules_per_token, run_energy
from tokwatch.sim.config import SimConfig
from tokwatch.sim.testing import run_sim
from tokwatch.transport.http import HttpClient

MODEL = "sim-model"
GPUS = {"gpus": 2, "idle_watts": 60.0, "watts_per_running": 45.0, "max_watts": 350.0}


def config() -> SimConfig:
    return SimConfig.model_validate(
        {
            "servers": [
                {
                    "name": "gpu",
                    "dialect": "vllm",
                    "models": [{"name": MODEL, "decode_tps": 100.0, "prefill_tps": 20000.0}],
                    "gpu_power": GPUS,
                }
            ]
        }
    )


async def complete(http: HttpClient, url: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}
    async with http.stream("POST", f"{url}/v1/chat/completions", json_body=body, timeout=30.0) as resp:
        raw = b"".join([data async for _, data in resp.chunks()])
    return dict(json.loads(raw))


def test_a_dcgm_scrape_reads_every_gpus_power_and_energy_in_joules() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 250.5\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b"} 100.0\n'
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a"} 123456789\n'
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-b"} 1000\n'
    )
    reading = read_power(parse_metrics(text))
    assert reading is not None
    assert (reading.watts, reading.energy_j, reading.devices) == (350.5, pytest.approx(123457.789), 2)
    only = read_power(parse_metrics(text), gpus=frozenset({"1"}))
    assert only is not None and (only.watts, only.energy_j) == (100.0, 1.0)
    rapl = read_power(parse_metrics('node_rapl_package_joules_total{index="0",path="x"} 5000.5\n'))
    assert rapl is not None and (rapl.watts, rapl.energy_j) == (None, 5000.5)
    assert read_power(parse_metrics("vllm:num_requests_running 1\n")) is None


async def test_energy_over_a_busy_interval_matches_the_simulators_truth_within_one_percent() -> None:
    async with run_sim(config()) as sim, HttpClient() as http:
        meter = sim.server("gpu").power
        assert meter is not None
        url = f"{sim.base_url('gpu')}/dcgm/metrics"
        trace, stop = PowerTrace(), asyncio.Event()
        sampler = asyncio.create_task(sample_power(http, url, 0.02, trace, stop))
        # The sampler has readings before the interval starts.
        await wait_until(lambda: len(trace.samples) >= 3, 10.0, "three power readings", interval=0.01)
        t0, truth0 = time.monotonic(), meter.energy_j()
        # Requests that start and finish inside the interval: idle, one, three, one running, idle again.
        # Several seconds, so that a reading stamped a few tens of milliseconds off on a busy host (each is
        # stamped halfway between asking and answering) stays well inside 1 %.
        first = asyncio.create_task(complete(http, sim.base_url("gpu"), 300))
        await asyncio.sleep(0.5)
        answers = await asyncio.gather(*(complete(http, sim.base_url("gpu"), 100) for _ in range(2)), first)
        await asyncio.sleep(0.5)
        t1, truth1 = time.monotonic(), meter.energy_j()
        stop.set()
        await asyncio.wait_for(sampler, 5.0)
        truth = truth1 - truth0

        assert trace.failures == 0
        by_counter = trace.joules(t0, t1)
        by_power = integrate_power(trace.samples, t0, t1)
        assert by_counter is not None and by_power is not None
        assert by_counter == pytest.approx(truth, rel=0.01)
        assert by_power == pytest.approx(truth, rel=0.01)
        # More than idle was drawn, and what the work added over idle is per token of output.
        idle_w = GPUS["gpus"] * GPUS["idle_watts"]
        energy = run_energy(by_counter, idle_w, t1 - t0)
        assert energy.net_j > 0.05 * energy.total_j
        tokens = sum(a["usage"]["completion_tokens"] for a in answers)
        assert tokens == 500
        per_token = joules_per_token(energy.net_j, tokens)
        assert per_token is not None and per_token > 0
