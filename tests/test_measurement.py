"""Measurement isolation: the probe loop's own thread, its stall monitor, and disturbed runs end to end."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator

import pytest

from tokwatch.app import App
from tokwatch.config import load_config_text
from tokwatch.measurement import (
    FREEZE_EVERY_S,
    YOUNG_COLLECTION_THRESHOLD,
    MeasurementLoop,
    StallMonitor,
    collector_out_of_the_way,
)
from tokwatch.result import TimingSource
from tokwatch.sim.config import load_sim_config_text
from tokwatch.sim.testing import run_sim


def test_max_stall_counts_only_the_part_inside_the_window() -> None:
    mon = StallMonitor()
    mon.record(10.0, 0.05)  # the loop was stalled from 9.95 to 10.0
    assert mon.max_stall(9.90, 10.50) == pytest.approx(0.05)
    assert mon.max_stall(9.98, 10.50) == pytest.approx(0.02)  # request left 30 ms into the stall
    assert mon.max_stall(9.96, 9.97) == pytest.approx(0.01)
    assert mon.max_stall(10.01, 11.0) == 0.0
    assert mon.max_stall(9.0, 9.9) == 0.0


def test_lateness_at_the_timer_floor_is_not_a_stall() -> None:
    mon = StallMonitor(floor_s=0.001)
    mon.record(5.0, 0.0008)
    assert mon.max_stall(0.0, 10.0) == 0.0
    assert mon.largest_s == 0.0


def test_old_stalls_are_forgotten() -> None:
    mon = StallMonitor(keep_s=60.0)
    mon.record(10.0, 0.02)
    mon.record(100.0, 0.03)
    assert mon.max_stall(0.0, 20.0) == 0.0
    assert mon.max_stall(99.0, 101.0) == pytest.approx(0.03)


@pytest.fixture
def measurement() -> MeasurementLoop:
    loop = MeasurementLoop()
    loop.start()
    yield loop  # type: ignore[misc]
    loop.stop()


async def test_heartbeat_sees_a_blocked_loop_and_stops_when_idle(measurement: MeasurementLoop) -> None:
    mon = measurement.monitor

    async def blocked() -> tuple[float, float]:
        with mon.watching():
            await asyncio.sleep(0.01)
            start = time.perf_counter()
            time.sleep(0.05)  # noqa: ASYNC251 - a deliberate 50 ms block of the measurement loop
            await asyncio.sleep(0.01)
            return start, time.perf_counter()

    start, end = await measurement.call(blocked())
    assert mon.max_stall(start, end) >= 0.04
    beats = mon.beats
    await asyncio.sleep(0.05)
    assert mon.beats == beats  # nothing in flight: no heartbeat


async def test_a_block_on_the_main_loop_does_not_stall_the_measurement_loop(
    measurement: MeasurementLoop,
) -> None:
    mon = measurement.monitor
    started = threading.Event()

    async def watched() -> tuple[float, float]:
        with mon.watching():
            started.set()
            t0 = time.perf_counter()
            await asyncio.sleep(0.3)
            return t0, time.perf_counter()

    task = asyncio.ensure_future(measurement.call(watched()))
    await asyncio.to_thread(started.wait, 5)
    # Pure-Python work on this (main) thread for 200 ms, as a slow /metrics render would be.
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        sum(range(1000))
    t0, t1 = await task
    # The interpreter lock is handed over every 0.5 ms: far below the 200 ms a shared loop would stall.
    assert mon.max_stall(t0, t1) < 0.15


async def test_cancelling_the_caller_cancels_the_coroutine_on_the_measurement_loop(
    measurement: MeasurementLoop,
) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(measurement.call(forever()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(cancelled.wait, 5)


SIM = """
seed: 3
servers:
  - name: oa
    dialect: openai
    models: [{name: m, decode_tps: 100, prefill_tps: 100000}]
  - name: lc
    dialect: llamacpp
    models: [{name: m, decode_tps: 100, prefill_tps: 100000}]
"""


@pytest.fixture
async def app() -> AsyncIterator[App]:
    async with run_sim(load_sim_config_text(SIM)) as sim:
        cfg = load_config_text(f"""
probe: {{max_tokens: 30, warmup: false}}
storage: {{enabled: false}}
schedule: {{interval: 1h, run_on_start: false}}
endpoints:
  - {{name: oa, kind: openai, base_url: '{sim.url}/oa/v1', model: m}}
  - {{name: lc, kind: llamacpp, base_url: '{sim.url}/lc', model: m}}
""")
        application = App(cfg)
        await application.start(schedule=False)
        try:
            yield application
        finally:
            await application.stop()


async def _probe_with_block(app: App, name: str, block_s: float) -> object:
    loop = app.measurement.loop
    assert loop is not None
    # 100 ms into a ~300 ms stream, block the measurement loop (as a stalled client would be).
    loop.call_soon_threadsafe(loop.call_later, 0.1, time.sleep, block_s)
    return (await app.probe(name)).result


async def test_a_run_whose_loop_was_blocked_is_flagged_and_kept_out_of_figures(app: App) -> None:
    result = await _probe_with_block(app, "oa", 0.06)
    assert result.ok  # type: ignore[attr-defined]
    assert result.timing_disturbed  # type: ignore[attr-defined]
    assert result.max_stall_s >= 0.05  # type: ignore[attr-defined]
    labels = {"endpoint": "oa"}
    assert app.registry.get_sample_value("tokwatch_probe_timing_disturbed_total", labels) == 1
    assert app.registry.get_sample_value("tokwatch_probe_max_stall_seconds", labels) >= 0.05
    # not a plain ok figure: no histogram observation, no last-ok tok/s from a client source
    assert app.registry.get_sample_value("tokwatch_ttft_seconds_count", labels) == 0
    assert app.registry.get_sample_value("tokwatch_probe_last_ok_timestamp_seconds", labels) is None


async def test_a_disturbed_run_falls_back_to_the_servers_own_timing(app: App) -> None:
    result = await _probe_with_block(app, "lc", 0.06)
    assert result.timing_disturbed  # type: ignore[attr-defined]
    assert TimingSource.CLIENT_STREAM in result.candidates  # type: ignore[attr-defined]
    assert result.source is TimingSource.ENGINE  # type: ignore[attr-defined]
    assert result.tokens_per_second == pytest.approx(100, rel=0.05)  # type: ignore[attr-defined]
    labels = {"endpoint": "lc", "source": "engine"}
    assert app.registry.get_sample_value("tokwatch_probe_decode_tokens_per_second", labels) is not None


async def test_the_collector_is_kept_out_of_the_way_and_restored() -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with collector_out_of_the_way():
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
        kept = [[i] for i in range(1000)]  # objects a run keeps, as its records
        await asyncio.sleep(FREEZE_EVERY_S + 0.2)
        assert gc.get_freeze_count() >= len(kept)  # frozen out of every later collection's walk
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() <= frozen  # unfrozen at the end: collectable again
    assert kept
