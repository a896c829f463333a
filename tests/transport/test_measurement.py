"""Measurement isolation: the probe loop's own thread, its stall monitor, and disturbed runs end to end."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.bench.processes import sim_process
from tokwatch.figures.result import RunResult, TimingSource
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.transport import rxwatch
from tokwatch.transport.measurement import (
    FREEZE_EVERY_S,
    YOUNG_COLLECTION_THRESHOLD,
    MeasurementLoop,
    StallMonitor,
    StampLateness,
    ThreadHeartbeat,
    collector_out_of_the_way,
)


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


def test_lateness_of_a_stamp_runs_from_the_last_beat_before_the_stall_it_was_taken_in() -> None:
    mon = StallMonitor(period_s=0.002, floor_s=0.001)  # a read up to 3 ms after a stall is its backlog
    mon.record(10.0, 0.05)  # due at 9.95, woke at 10.0: last seen on time at 9.948 (one period before)
    mon.record(10.006, 0.004)  # 10.002 to 10.006: no on-time beat in between, one episode from 9.948
    mon.record(11.0, 0.01)  # due at 10.99: an episode from 10.988
    stamps = [9.9, 9.96, 10.0, 10.004, 10.008, 10.0095, 10.5, 10.995, 11.002, 11.004]
    want = [0.0, 0.012, 0.052, 0.056, 0.060, 0.0, 0.0, 0.007, 0.014, 0.0]
    assert mon.lateness(stamps) == pytest.approx(want)
    assert mon.lateness(stamps[::-1]) == pytest.approx(want[::-1])  # any order
    assert mon.lateness([]) == [] and StallMonitor().lateness([5.0]) == [0.0]


def test_a_thread_heartbeat_sees_the_interpreter_lock_held_and_stops_when_idle() -> None:
    beat = ThreadHeartbeat()
    with beat.watching():
        deadline = time.monotonic() + 5
        while beat.beats < 3:  # the thread runs (a loaded machine may take a while to start it)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        t0 = time.perf_counter()
        sum(range(3_000_000))  # one C call: the interpreter lock is not handed over until it returns
        t1 = time.perf_counter()
        time.sleep(0.02)
    assert beat.lateness([t1])[0] >= 0.5 * (t1 - t0) > 0
    deadline = time.monotonic() + 5
    while any(t.name == "tokwatch-thread-heartbeat" for t in threading.enumerate()):
        assert time.monotonic() < deadline  # nothing watched: no thread waking 500 times a second
        time.sleep(0.01)


def test_a_watched_stamp_is_late_by_the_smaller_of_the_loops_and_the_watchers_lateness() -> None:
    loop = StallMonitor()
    loop.record(10.0, 0.05)  # the loop stalled 9.95-10.0 (last on time at 9.948); the watcher never did
    assert StampLateness(loop).lateness([9.99, 10.5]) == pytest.approx([0.042, 0.0])
    assert StampLateness(loop, ThreadHeartbeat()).lateness([9.99, 10.5]) == [0.0, 0.0]
    # A response the watcher did not stamp (HTTPS) is held to the loop's bound alone.
    unwatched = StampLateness(loop, ThreadHeartbeat()).lateness([9.99, 10.5], watched=False)
    assert unwatched == pytest.approx([0.042, 0.0])


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


# Every answer starts 0.5 s after the request (a load delay), then 60 tokens at 20 tok/s: the stream spans
# about 0.5 s to 3.5 s, so a stall can be placed around the first token or well inside the decode with
# hundreds of milliseconds to spare on a busy machine (where the simulator itself may answer late). The
# simulator runs in a process of its own, as a real server does: a stall of the exporter does not stop the
# tokens from arriving.
SIM = """
listen: 127.0.0.1:{port}
seed: 3
servers:
  - name: oa
    dialect: openai
    models: [{{name: mo, decode_tps: 20, prefill_tps: 100000, warm_load_duration: 0.5}}]
  - name: lc
    dialect: llamacpp
    models: [{{name: ml, decode_tps: 20, prefill_tps: 100000, warm_load_duration: 0.5}}]
"""


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    async with sim_process(tmp_path, SIM) as (_, port):
        # Wide tolerances, so that the stalls a loaded machine adds at random (tens of ms) set nothing aside
        # while the deliberate stalls below (a second and more) still decide: a 1 s stall anywhere in a 3 s
        # decode would exceed 20 % if it were counted by presence.
        cfg = load_config_text(f"""
probe: {{max_tokens: 60, warmup: false, tolerance: {{tokens_per_second: 20%, latency: 50%}}}}
storage: {{enabled: false}}
schedule: {{interval: 1h, run_on_start: false}}
metrics: {{histograms: true, diagnostics: true}}  # which figures feed the histograms, set aside: checked here
endpoints:
  - {{name: oa, kind: openai, base_url: 'http://127.0.0.1:{port}/oa/v1', model: mo}}
  - {{name: lc, kind: llamacpp, base_url: 'http://127.0.0.1:{port}/lc', model: ml}}
""")
        application = App(cfg)
        await application.start(schedule=False)
        try:
            yield application
        finally:
            await application.stop()


def _gil_holder(seconds: float) -> Callable[[], None]:
    """A call that keeps the interpreter lock for `seconds`, as a long parse or a starved process would stall
    every thread of the exporter (the loop, the receive watcher, the heartbeats): pure Python with the
    switch interval raised beyond the hold, so no waiting thread asks for the lock meanwhile."""

    def hold() -> None:
        previous = sys.getswitchinterval()
        sys.setswitchinterval(seconds + 1.0)
        try:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        finally:
            sys.setswitchinterval(previous)

    return hold


async def _probe_stalled(app: App, name: str, at_s: float, stall: Callable[[], None]) -> RunResult:
    """Probe `name` while `stall` runs on the measurement loop `at_s` after the call."""
    loop = app.probes.measurement.loop
    assert loop is not None
    loop.call_soon_threadsafe(loop.call_later, at_s, stall)
    return (await app.probe(name)).result


def _window(app: App, name: str, figure: str) -> float | None:
    labels = {"endpoint": name, "workload": "seed000", "window": "24h"}
    return app.exposition.get_sample_value(f"tokwatch_window_{figure}", labels)


@pytest.mark.skipif(not rxwatch.available(), reason="the receive watcher needs Linux epoll")
async def test_a_loop_stall_delays_the_reading_not_the_watchers_stamps(app: App) -> None:
    """The loop blocked from 0.2 s to 1.2 s, over the first token (due at 0.5 s), while every other thread
    runs: the receive watcher stamped the bytes as they came (a TTFT far below the 1.2 s the loop read them
    at), so no figure is set aside. A host so busy that the watcher's own thread was starved then is
    charged for it, rightly: up to three runs for one where it was not."""
    assert app.probes.stamps.watcher is not None
    for _ in range(3):
        result = await _probe_stalled(app, "oa", 0.2, lambda: time.sleep(1.0))
        assert result.ok and result.max_stall_s is not None and result.max_stall_s >= 0.9
        assert result.ttft_s is not None and result.ttft_error_s is not None
        if result.ttft_error_s < 0.1:
            assert result.ttft_s < 1.0  # the watcher's stamp, not the loop's
            assert not result.tps_set_aside and "ttft" not in result.set_aside
            return
    pytest.fail(f"the watcher's own lateness was charged in every run: {result}")


async def test_a_stall_inside_the_decode_moves_no_end_of_the_tps_window(app: App) -> None:
    """Every thread stalled for 1 s from 0.7 s after the first token: neither the first nor the last stamp
    was taken in it, so the TTFT and the client tok/s keep their figures; the gaps beside it carry the stall
    and the ITL is set aside."""
    result = await _probe_stalled(app, "oa", 1.25, _gil_holder(1.0))
    assert result.ok and result.max_stall_s is not None and result.max_stall_s >= 0.9
    assert result.source is TimingSource.CLIENT_STREAM and not result.tps_set_aside
    assert result.tps_error_ratio is not None and result.tps_error_ratio <= 0.2
    assert result.ttft_error_s is not None and result.ttft_error_s < result.max_stall_s
    assert result.itl_error_s is not None and result.itl_error_s >= 0.5  # the gaps beside the stall
    assert "itl" in result.set_aside and "ttft" not in result.set_aside and result.timing_disturbed
    value = app.exposition.get_sample_value
    labels = {"endpoint": "oa", "workload": "seed000"}
    tps = value("tokwatch_probe_decode_tokens_per_second", {**labels, "source": "client_stream"})
    assert tps == result.tokens_per_second
    assert value("tokwatch_ttft_seconds_count", labels) == 1  # kept
    assert value("tokwatch_inter_token_latency_seconds_count", labels) == 0  # set aside
    counter = "tokwatch_probe_figures_set_aside_total"
    assert value(counter, {**labels, "figure": "itl", "reason": "client_stall"}) == 1
    assert value(counter, {**labels, "figure": "tokens_per_second", "reason": "client_stall"}) is None
    assert _window(app, "oa", "decode_tokens_per_second_median") == result.tokens_per_second
    assert (_window(app, "oa", "runs"), _window(app, "oa", "uptime_ratio")) == (1, 1.0)


async def test_a_stall_over_the_first_token_sets_aside_client_figures_not_the_run(app: App) -> None:
    """Every thread stalled from 0.1 s to 2.1 s, over the first token (due at 0.5 s): TTFT and the client
    tok/s carry up to two seconds of lateness and are set aside; the run's status and uptime count."""
    result = await _probe_stalled(app, "oa", 0.1, _gil_holder(2.0))
    assert result.ok and result.timing_disturbed
    assert result.ttft_error_s is not None and result.ttft_error_s >= 0.5
    assert result.tps_error_ratio is not None and result.tps_error_ratio > 0.2
    assert set(result.set_aside) >= {"tokens_per_second", "ttft"}
    assert result.source is TimingSource.CLIENT_STREAM and result.tokens_per_second is not None  # on the run
    labels = {"endpoint": "oa", "workload": "seed000"}
    assert app.exposition.get_sample_value("tokwatch_probe_timing_disturbed_total", labels) == 1
    for figure in ("tokens_per_second", "ttft"):
        counter = {**labels, "figure": figure, "reason": "client_stall"}
        assert app.exposition.get_sample_value("tokwatch_probe_figures_set_aside_total", counter) == 1
    assert app.exposition.get_sample_value("tokwatch_ttft_seconds_count", labels) == 0
    assert app.exposition.get_sample_value("tokwatch_probe_last_ok_timestamp_seconds", labels) is None
    # the run counts in runs, ok runs and uptime; its tok/s is no sample of the median
    counted = [_window(app, "oa", figure) for figure in ("runs", "ok_runs", "uptime_ratio")]
    assert counted == [1, 1, 1.0]
    assert _window(app, "oa", "decode_tokens_per_second_median") is None
    assert _window(app, "oa", "decode_tokens_per_second_set_aside_runs") == 1
    assert _window(app, "oa", "timing_disturbed_runs") == 1


async def test_a_server_figure_is_never_set_aside_for_a_client_stall(app: App) -> None:
    """The same stall against llama.cpp: its client figures are set aside, its engine timings give tok/s."""
    result = await _probe_stalled(app, "lc", 0.1, _gil_holder(2.0))
    assert result.ok and "ttft" in result.set_aside and not result.tps_set_aside
    assert result.source is TimingSource.ENGINE and result.tps_error_ratio == 0.0
    assert result.tokens_per_second == pytest.approx(20, rel=0.05)
    labels = {"endpoint": "lc", "workload": "seed000", "source": "engine"}
    assert app.exposition.get_sample_value("tokwatch_probe_decode_tokens_per_second", labels) is not None
    assert _window(app, "lc", "decode_tokens_per_second_median") == result.tokens_per_second
    assert _window(app, "lc", "decode_tokens_per_second_set_aside_runs") == 0


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
