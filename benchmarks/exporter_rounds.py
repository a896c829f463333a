"""Scheduled rounds of an in-process exporter for benchmarks, with every timed run handed back per round."""

from __future__ import annotations

from collections.abc import AsyncIterator

from tokwatch.figures.result import RunResult
from tokwatch.service.app import App
from tokwatch.service.scheduler import run_round


async def scheduled_rounds(app: App, rounds: int) -> AsyncIterator[list[RunResult]]:
    """`rounds` rounds on the scheduler's own plan, each followed by the window refresh the scheduler does;
    yields each round's timed runs (the app's own sinks still take every one)."""
    collected: list[RunResult] = []
    record = app.probes.record

    def keep(result: RunResult) -> None:
        collected.append(result)
        record(result)

    app.probes.record = keep  # type: ignore[method-assign]
    try:
        for _ in range(rounds):
            collected.clear()
            await run_round(app._schedule_settings()[2], app.probes.probe_target)
            await app.refresh_windows()
            yield list(collected)
    finally:
        app.probes.record = record  # type: ignore[method-assign]
