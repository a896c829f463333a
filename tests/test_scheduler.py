"""Aligned schedule maths and round execution."""

from __future__ import annotations

import asyncio

from tokwatch.scheduler import Scheduler, next_round_time, run_round


def test_aligned_to_half_hour() -> None:
    # 2001-09-09 01:46:40 UTC -> next hh:30 is 02:30:00
    assert next_round_time(1_000_000_000.0, 3600, 1800) == 1_000_002_600.0
    t = next_round_time(1_000_000_000.0, 3600, 1800)
    assert (t - 1800) % 3600 == 0 and 0 <= t - 1_000_000_000.0 < 3600


def test_on_the_boundary_is_now() -> None:
    assert next_round_time(5400.0, 3600, 1800) == 5400.0


async def test_round_is_sequential_with_parallelism_one() -> None:
    active, peak, order = 0, 0, []

    async def probe(name: str) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        order.append(name)
        active -= 1

    await run_round(["a", "b", "c"], probe, parallelism=1)
    assert peak == 1 and order == ["a", "b", "c"]
    await run_round(["a", "b", "c", "d"], probe, parallelism=2)
    assert peak == 2


async def test_a_failing_probe_does_not_stop_the_round() -> None:
    seen = []

    async def probe(name: str) -> None:
        if name == "bad":
            raise RuntimeError("boom")
        seen.append(name)

    await run_round(["bad", "good"], probe, parallelism=1)
    assert seen == ["good"]


async def test_scheduler_runs_rounds_and_reports_lag() -> None:
    rounds: list[tuple[float, float, float]] = []
    probed: list[str] = []

    async def probe(name: str) -> None:
        probed.append(name)

    sched = Scheduler(lambda: (0.05, 0.0, 1, ["x"]), probe, lambda *a: rounds.append(a), run_on_start=True)
    task = asyncio.create_task(sched.run())
    try:
        for _ in range(200):
            if sched.rounds >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert sched.rounds >= 3 and probed[:3] == ["x", "x", "x"]
    planned, started, following = rounds[1]
    assert started >= planned and following > started
    assert abs((following / 0.05) - round(following / 0.05)) < 1e-6  # aligned to the interval
