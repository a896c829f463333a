"""Aligned schedule maths and round execution."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from tokwatch.metrics.exporter import ExporterCollector, ExporterStatus
from tokwatch.service.scheduler import RoundPlan, Scheduler, next_round_time, run_round


def test_aligned_to_half_hour() -> None:
    # 2001-09-09 01:46:40 UTC -> next hh:30 is 02:30:00
    assert next_round_time(1_000_000_000.0, 3600, 1800) == 1_000_002_600.0
    t = next_round_time(1_000_000_000.0, 3600, 1800)
    assert (t - 1800) % 3600 == 0 and 0 <= t - 1_000_000_000.0 < 3600


def test_on_the_boundary_is_now() -> None:
    assert next_round_time(5400.0, 3600, 1800) == 5400.0


def plan(servers: dict[str, list[str]], parallelism: int = 4, per_server: int = 1) -> RoundPlan:
    return RoundPlan(servers, parallelism, per_server)


async def test_one_server_at_a_time_within_a_server_several_servers_at_once() -> None:
    active: dict[str, int] = {}
    peak: dict[str, int] = {}
    order: list[str] = []

    async def probe(name: str) -> None:
        server = name[0]
        active[server] = active.get(server, 0) + 1
        peak[server] = max(peak.get(server, 0), active[server])
        peak["all"] = max(peak.get("all", 0), sum(active.values()))
        await asyncio.sleep(0.01)
        order.append(name)
        active[server] -= 1

    await run_round(plan({"a": ["a1", "a2", "a3"], "b": ["b1", "b2"]}), probe)
    assert peak["a"] == 1 and peak["b"] == 1 and peak["all"] == 2
    assert [n for n in order if n[0] == "a"] == ["a1", "a2", "a3"]
    peak.clear()
    await run_round(plan({"a": ["a1", "a2"], "b": ["b1"], "c": ["c1"]}, parallelism=1), probe)
    assert peak["all"] == 1
    peak.clear()
    await run_round(plan({"a": ["a1", "a2", "a3"]}, per_server=2), probe)
    assert peak["a"] == 2


async def test_a_slow_server_does_not_delay_another_servers_probes() -> None:
    done: dict[str, float] = {}
    t0 = asyncio.get_running_loop().time()

    async def probe(name: str) -> None:
        await asyncio.sleep(0.5 if name.startswith("slow") else 0.01)
        done[name] = asyncio.get_running_loop().time() - t0

    await run_round(plan({"slow": ["slow1", "slow2"], "fast": ["fast1", "fast2", "fast3"]}), probe)
    assert max(done[n] for n in ("fast1", "fast2", "fast3")) < min(done["slow1"], done["slow2"])


async def test_a_failing_probe_does_not_stop_the_round() -> None:
    seen = []

    async def probe(name: str) -> None:
        if name == "bad":
            raise RuntimeError("boom")
        seen.append(name)

    await run_round(plan({"s": ["bad", "good"]}), probe)
    assert seen == ["good"]


async def _until(predicate: Callable[[], bool], limit: int = 300) -> None:
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0.01)


async def test_scheduler_runs_rounds_and_reports_lag() -> None:
    rounds: list[tuple[float, float, float]] = []
    probed: list[str] = []

    async def probe(name: str) -> None:
        probed.append(name)

    sched = Scheduler(
        lambda: (0.05, 0.0, plan({"s": ["x"]})), probe, lambda *a: rounds.append(a), run_on_start=True
    )
    task = asyncio.create_task(sched.run())
    try:
        await _until(lambda: sched.rounds >= 3)
    finally:
        task.cancel()
    assert sched.rounds >= 3 and probed[:3] == ["x", "x", "x"]
    planned, started, following = rounds[1]
    assert started >= planned and following > started
    assert abs((following / 0.05) - round(following / 0.05)) < 1e-6  # aligned to the interval


async def test_an_overrunning_round_skips_the_missed_slots_and_counts_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tokwatch.service.scheduler")
    starts: list[float] = []

    async def probe(name: str) -> None:
        await asyncio.sleep(0.13)  # each round overruns 2.6 intervals of 50 ms

    sched = Scheduler(
        lambda: (0.05, 0.0, plan({"s": ["x"]})), probe, lambda p, s, f: starts.append(p), run_on_start=False
    )
    # The self-metrics collector as the app registers it (App: ExporterCollector(..., scheduler_stats)).
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ExporterStatus(), lambda: 0, lambda: sched.stats))
    task = asyncio.create_task(sched.run())
    try:
        await _until(lambda: sched.rounds >= 3)
    finally:
        task.cancel()
    assert sched.stats.skipped_slots >= 4  # at least two per overrun round
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and all(m.startswith("the round took longer than the interval (") for m in warned)
    assert all("s of 0.05s): " in m for m in warned)
    assert "planned rounds skipped" in warned[0]
    # ... and exported as the counter that docs/metrics.md and the scaling guide point at
    assert registry.get_sample_value("tokwatch_scheduler_skipped_rounds_total") == sched.stats.skipped_slots
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # never back to back: the next round waits for a slot after the overrun, on the aligned grid
    assert all(g >= 0.15 - 1e-6 for g in gaps)
    assert all(abs(p / 0.05 - round(p / 0.05)) < 1e-6 for p in starts)


async def test_a_round_that_started_off_the_grid_and_ended_past_a_slot_did_not_overrun(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The start-up round runs at no slot: ending past the next one after less than an interval is no
    overrun, so no warning and nothing counted in tokwatch_scheduler_skipped_rounds_total."""
    caplog.set_level(logging.INFO, logger="tokwatch.service.scheduler")
    interval = 0.5
    real = time.time()
    shift = next_round_time(real, interval, 0.0) + 10 * interval - 0.02 - real  # 20 ms before a slot
    ended = asyncio.Event()

    async def probe(name: str) -> None:
        await asyncio.sleep(0.1)  # a fifth of the interval, across the slot

    sched = Scheduler(
        lambda: (interval, 0.0, plan({"s": ["x"]})),
        probe,
        lambda *a: None,
        run_on_start=True,
        after_round=ended.set,
        clock=lambda: time.time() + shift,
    )
    task = asyncio.create_task(sched.run())
    try:
        await asyncio.wait_for(ended.wait(), 5)
    finally:
        task.cancel()
    assert sched.rounds == 1 and sched.stats.skipped_slots == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    skipped = [r.getMessage() for r in caplog.records if "ended past the next one" in r.getMessage()]
    assert len(skipped) == 1 and re.match(r"the round \(0\.\ds, started 0\.0s after its slot\)", skipped[0])


async def test_a_crashed_scheduler_is_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokwatch.service.scheduler")
    calls = 0
    probed: list[str] = []

    def settings() -> tuple[float, float, RoundPlan]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("interval went bad")
        return 0.05, 0.0, plan({"s": ["x"]})

    async def probe(name: str) -> None:
        probed.append(name)

    sched = Scheduler(settings, probe, lambda *a: None, run_on_start=True)
    task = asyncio.create_task(sched.supervise(backoff_s=(0.2, 0.4)))
    try:
        await _until(lambda: sched.stats.crashes == 1)
        assert not sched.stats.running  # /-/ready answers 503 meanwhile
        assert sched.stats.last_error == "ValueError: interval went bad"
        await _until(lambda: sched.rounds >= 1)
    finally:
        task.cancel()
    assert sched.stats.running and probed
    # The crash is logged once, as an error naming it, with the exception and its traceback.
    crashes = [r for r in caplog.records if r.getMessage().startswith("the scheduler crashed")]
    assert len(crashes) == 1
    record = crashes[0]
    assert record.levelno == logging.ERROR and record.name == "tokwatch.service.scheduler"
    assert record.getMessage().startswith("the scheduler crashed (restart 1 in ")
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
    assert str(record.exc_info[1]) == "interval went bad"
    assert "ValueError: interval went bad" in caplog.text  # the traceback reaches the log output


async def test_each_round_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokwatch.service.scheduler")

    async def probe(name: str) -> None:
        await asyncio.sleep(0.001)

    servers = plan({"a:1": ["a1", "a2"], "b:2": ["b1"]})
    sched = Scheduler(lambda: (0.05, 0.0, servers), probe, lambda *a: None, run_on_start=True)
    task = asyncio.create_task(sched.run())
    try:
        await _until(lambda: sched.rounds >= 3)
    finally:
        task.cancel()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert len(lines) == sched.rounds >= 3  # one line per round, no more
    for n, line in enumerate(lines, 1):
        assert line.startswith(f"round {n}: 3 probes on 2 servers in "), line
    one = Scheduler(lambda: (0.05, 0.0, plan({"a:1": ["a1"]})), probe, lambda *a: None, run_on_start=True)
    caplog.clear()
    task = asyncio.create_task(one.run())
    try:
        await _until(lambda: one.rounds >= 1)
    finally:
        task.cancel()
    assert caplog.records[0].getMessage().startswith("round 1: 1 probe on 1 server in ")  # never "1 servers"
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage().startswith("round "))
