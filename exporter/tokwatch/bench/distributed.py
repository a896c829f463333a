"""`tokwatch bench --segment K/N`: one segment of a run split over machines, e.g. the pods of a Kubernetes
Indexed Job (deploy/kubernetes/bench-job.yaml), which share nothing but the store and the start time.

A segment agrees on the start (`--start-at`, or the first segment to reach the store fixes now +
`--start-delay` for all), measures how far its wall clock is from the database's, runs its part of the one
schedule (tokwatch.bench.segments) like any run, then stores itself (a `bench_segments` row and its
requests, under the one `--run-id`) and merges: the run's row then holds the figures of every segment
stored so far, recomputed from their requests (tokwatch.bench.merge). The last segment to finish leaves
the whole run merged; `tokwatch bench report RUN` recomputes it at any time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from tokwatch.bench.arrivals import arrival_offsets
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.merge import SPLIT_KEY, merge_run, plan_summary
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.plan import resolve_target
from tokwatch.bench.segments import planned_arrivals
from tokwatch.bench.session import echo_options, run_bench
from tokwatch.bench.storing import instance_name, planned_run_row, request_row, summary_text
from tokwatch.bench.wallclock import ClockOffset, measure_offset
from tokwatch.figures.wording import counted
from tokwatch.settings.config import Config
from tokwatch.settings.redact import Redactor
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.storage.base import BenchStore, RunStore
from tokwatch.storage.bench_rows import BenchRunRow, BenchSegmentRow
from tokwatch.storage.errors import StorageError
from tokwatch.storage.factory import bench_store, open_store

_SAME_START_S = 1e-3  # a stored plan whose start differs by more is another run under the same id


def _plan_row(opts: BenchOptions, start_at: float, instance: str, redact: Redactor) -> BenchRunRow:
    assert opts.run_id is not None
    options = echo_options(opts, resolve_target(opts).target)
    summary = plan_summary(opts.segment_part.count, start_at)
    return planned_run_row(opts.run_id, options, start_at, summary, instance=instance, redact=redact)


async def _agree(bench: BenchStore, opts: BenchOptions, instance: str, redact: Redactor) -> float:
    """The common start: claimed in the store (the first claim fixes it); a run id already used with
    another start or another number of segments is refused."""
    proposed = opts.start_at if opts.start_at is not None else time.time() + opts.start_delay
    stored = await bench.claim_bench_run(_plan_row(opts, proposed, instance, redact))
    plan = json.loads(stored.summary).get(SPLIT_KEY)
    n = opts.segment_part.count
    if plan is None or int(plan.get("segments") or 0) != n:
        planned = "as one run" if plan is None else f"with {plan.get('segments')} segments"
        raise ConfigError(f"--run-id {opts.run_id}: already stored {planned}, not as {n} segments")
    start = float(plan["start_at"])
    if opts.start_at is not None and abs(start - opts.start_at) > _SAME_START_S:
        raise ConfigError(
            f"--run-id {opts.run_id}: already planned to start at {start:.3f}, not at --start-at "
            f"{opts.start_at:.3f}: give every segment the same --start-at (or a new --run-id)"
        )
    return start


async def _offset(store: RunStore) -> ClockOffset | None:
    """The database's clock minus ours, when it has a clock of its own."""
    if await store.clock() is None:
        return None

    async def read() -> float:
        value = await store.clock()
        assert value is not None
        return value

    return await measure_offset(read, f"{store.backend} {store.location}")


def planned(opts: BenchOptions) -> int | None:
    """Arrivals of this segment's share of the schedule (open loop); None for a closed loop."""
    if opts.rate is None:
        return None
    offsets = arrival_offsets(opts.arrivals, opts.rate, opts.seed, opts.burstiness)
    return planned_arrivals(opts.segment_part, offsets, opts.effective_number, opts.duration)


def segment_row(
    outcome: BenchOutcome,
    opts: BenchOptions,
    *,
    instance: str,
    offset: ClockOffset | None,
    redact: Redactor,
) -> BenchSegmentRow:
    """This segment's `bench_segments` row."""
    assert opts.start_at is not None
    segment = opts.segment_part
    measured = outcome.measured
    first = min(
        (r for r in measured if r.intended_at_s is not None),
        key=lambda r: r.intended_at_s or 0.0,
        default=None,
    )
    summary: dict[str, Any] = {**outcome.summary(), "slo_definitions": [asdict(s) for s in outcome.slos]}
    cpu = outcome.client.get("cpu_s")
    return BenchSegmentRow(
        bench_run_id=outcome.run_id,
        segment=segment.index,
        segments=segment.count,
        instance=instance,
        start_at=opts.start_at,
        started_at=outcome.started_at_unix + (outcome.measure_start_s or 0.0),
        finished_at=outcome.started_at_unix + outcome.wall_s,
        start_lag_s=first.scheduling_lag_s if first is not None else None,
        clock_offset_s=offset.offset_s if offset else None,
        clock_error_s=offset.error_s if offset else None,
        complete=outcome.complete,
        stop_reason=outcome.stop_reason,
        message=redact(outcome.message) if outcome.message else None,
        arrivals_planned=planned(opts),
        requests_measured=len(measured),
        requests_ok=sum(1 for r in measured if r.ok),
        cpu_s=float(cpu) if isinstance(cpu, int | float) and math.isfinite(cpu) else None,
        summary=summary_text(summary, redact),
    )


def merged_line(run: BenchRunRow) -> str:
    """One line on the merged run as stored now."""
    split = json.loads(run.summary).get(SPLIT_KEY) or {}
    missing = split.get("missing") or []
    stored = f"{len(split.get('stored') or [])}/{split.get('segments', '?')} segments stored"
    if missing:
        stored += f" (missing {', '.join(map(str, missing))})"
    ttft = "-" if run.ttft_p99_s is None else f"{run.ttft_p99_s * 1e3:.1f}ms"
    return (
        f"merged: bench run {run.id}: {stored}; {run.requests_ok}/{run.requests_measured} ok; "
        f"TTFT p99 {ttft}; `tokwatch bench report {run.id}` recomputes it"
    )


async def run_segment(
    opts: BenchOptions, console: Console, config: Config | None, secrets: Iterable[str | None]
) -> tuple[BenchOutcome, Path, list[str]]:
    """Agree on the start, run this segment, store it and merge; returns its outcome, its directory and what
    became of it in the store. Raises ConfigError before anything is sent when no start can be agreed."""
    redact = Redactor(secrets)
    offset: ClockOffset | None = None
    instance = instance_name(config) if config is not None else ""
    if config is None:
        if opts.start_at is None:
            raise ConfigError(
                "--segment without --start-at needs a store to agree on the start through: give --start-at, "
                "or --config with storage enabled"
            )
    else:
        try:
            store = await open_store(config.storage, instance=instance)
            try:
                start_at = await _agree(bench_store(store), opts, instance, redact)
                opts = opts.model_copy(update={"start_at": start_at})
                offset = await _offset(store)
            finally:
                await store.close()  # nothing of the store's stays open while the segment measures
        except StorageError as exc:  # already redacted by the store
            raise ConfigError(f"the store cannot take this segment, so nothing was sent: {exc}") from None
    outcome, out_dir = await run_bench(opts, console=console)
    if config is None:
        return outcome, out_dir, ["not stored (no --config): nothing merges this segment with the others"]
    segment = segment_row(outcome, opts, instance=instance, offset=offset, redact=redact)
    requests = [request_row(outcome.run_id, outcome.started_at_unix, r, redact) for r in outcome.measured]
    assert opts.start_at is not None
    try:
        store = await open_store(config.storage, instance=instance)
        try:
            plan = _plan_row(opts, opts.start_at, instance, redact)
            bench = bench_store(store)
            new = await bench.write_bench_segment(plan, segment, requests)
            merged = await bench.merge_bench_run(outcome.run_id, merge_run)
            where = f"{store.backend} {store.location}"
        finally:
            await store.close()
    except (StorageError, OSError) as exc:
        return outcome, out_dir, [f"warning: segment not stored: {exc} (result files are kept)"]
    label = opts.segment_part.label
    what = "stored" if new else "already stored (kept as it was)"
    size = counted(len(requests), "request")
    lines = [f"{what}: segment {label} of bench run {outcome.run_id} ({size}) in {where}"]
    if merged is not None:
        lines.append(merged_line(merged))
    return outcome, out_dir, lines
