"""One result from the stored parts of a split run (`--segment K/N`): every figure recomputed from the
requests of every stored segment, never averaged over segments.

The stored requests become request records again (the figures a stored request carries), so the merged
summary, throughput, goodput and SLO verdicts come from the very functions that make a one-process run's
(tokwatch.bench.aggregate, tokwatch.bench.slo): a percentile of the union, counts summed. What a stored
request does not carry (send delay, per-chunk gaps, output-phase ITL) is listed as not merged instead of
shown as zeros. Segments that never stored anything are named, and so are the segments' clocks: when each
started against the common start and, with PostgreSQL, how far its clock was from the database's.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, cast

from tokwatch.bench.arrival_check import check_arrivals
from tokwatch.bench.arrivals import arrival_offsets
from tokwatch.bench.config import DEFAULT_NUMBER
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.segments import Segment, planned_arrivals
from tokwatch.bench.slo import Slo, SloError, parse_slo
from tokwatch.bench.storing import run_row
from tokwatch.figures.result import Status
from tokwatch.figures.timing import TokensSource
from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow, BenchSegmentRow

# Figures a stored request row does not carry: left out of the merged summary, never shown as zeros.
NOT_MERGED = ("connect", "inter_chunk", "output_itl")
SPLIT_KEY = "split"  # the summary key of what a split run's row says about its segments


def plan_summary(segments: int, start_at: float) -> str:
    """The summary text of a split run's row before any segment has stored anything."""
    return json.dumps({SPLIT_KEY: {"segments": segments, "start_at": start_at, "stored": []}})


def record_from_row(row: BenchRequestRow, origin: float) -> RequestRecord:
    """A stored request as a record, its times in seconds after `origin` (unix seconds). The send delay is
    not stored: the record's client-side stamps are placed so that scheduling lag and queue time are the
    stored ones and the send delay is 0 (left out of the merged figures, NOT_MERGED)."""
    sent = row.sent_at - origin
    queue = row.queue_time_s or 0.0
    dispatched = sent - queue
    status = Status(row.status)
    record = RequestRecord(
        request_id=row.request_id,
        category="dataset",
        intended_at_s=None if row.scheduling_lag_s is None else dispatched - row.scheduling_lag_s,
        dispatched_at_s=dispatched,
        started_at_s=sent,
        sent_at_s=sent,
        status=status,
        error_class=row.error_class,
        prompt_tokens=row.prompt_tokens,
        output_tokens=row.output_tokens,
        think_tokens=row.think_tokens,
        tokens_source=cast("TokensSource | None", row.tokens_source),
        ttft_s=row.ttft_s,
        ttot_s=row.ttot_s,
        tpot_s=row.tpot_s,
        e2e_s=row.e2e_s,
        tbt_s=list(row.tbt_s or ()),
        fluidity_index=row.fluidity_index,
        decode_tokens_per_s=row.decode_tokens_per_s,
    )
    record.completed_at_s = sent + row.e2e_s if row.e2e_s is not None else sent
    return record


def _expected(run: BenchRunRow, segments: Sequence[BenchSegmentRow]) -> tuple[int, float]:
    """(N, the common start) from the segments, else from the row the first segment claimed."""
    if segments:
        return segments[0].segments, segments[0].start_at
    plan = json.loads(run.summary).get(SPLIT_KEY) or {}
    return int(plan.get("segments") or 1), float(plan.get("start_at") or run.started_at)


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if len(values) > 1 else (0.0 if values else None)


def _planned_missing(segments: Sequence[BenchSegmentRow], n: int, missing: Sequence[int]) -> int | None:
    """Arrivals the missing segments' shares of the schedule held, from a stored segment's options (the
    schedule is the seed's, the same for every segment); None for a closed loop or with nothing stored."""
    if not missing:
        return 0
    if not segments:
        return None
    options = json.loads(segments[0].summary).get("options") or {}
    rate = options.get("rate")
    if not rate:
        return None
    number, duration = options.get("number"), options.get("duration")
    if number is None and duration is None:
        number = DEFAULT_NUMBER
    kind, seed, burstiness = (
        options.get("arrivals", "poisson"),
        options.get("seed", 0),
        options.get("burstiness", 1.0),
    )
    return sum(
        planned_arrivals(
            Segment(k, n), arrival_offsets(kind, float(rate), int(seed), float(burstiness)), number, duration
        )
        for k in missing
    )


def segments_doc(run: BenchRunRow, segments: Sequence[BenchSegmentRow]) -> dict[str, Any]:
    """What the merged result says about its segments: which are missing, and how their clocks agreed."""
    n, start_at = _expected(run, segments)
    stored = sorted(s.segment for s in segments)
    missing = [k for k in range(n) if k not in stored]
    planned_missing = _planned_missing(segments, n, missing)
    offsets = [s.clock_offset_s for s in segments if s.clock_offset_s is not None]
    errors = [s.clock_error_s for s in segments if s.clock_error_s is not None]
    lags = [s.start_lag_s for s in segments if s.start_lag_s is not None]
    return {
        "segments": n,
        "start_at": start_at,
        "stored": stored,
        "missing": missing,
        # Every segment's share, the missing ones' computed from the stored options: a report of a run with a
        # segment missing said "138 measured of 138 planned" where ~300 were planned (issue 37).
        "arrivals_planned": sum(s.arrivals_planned or 0 for s in segments) + (planned_missing or 0),
        "arrivals_planned_missing": planned_missing,
        # Each segment's own view: how late its first request went out against its planned instant.
        "start_lag_max_s": max(lags, default=None),
        # Against the database's clock (PostgreSQL): how far apart the segments' clocks were, within
        # +- the largest read error; None when the store has no clock or fewer than all segments measured.
        "clock_offset_spread_s": _spread(offsets) if len(offsets) == len(segments) else None,
        "clock_offset_error_s": max(errors, default=None),
        "per_segment": [
            {k: v for k, v in asdict(s).items() if k not in ("bench_run_id", "summary")} for s in segments
        ],
    }


def _slos(summary: dict[str, Any]) -> list[Slo]:
    """A segment's SLO definitions; a one-process run stored only their names: those that parse back."""
    if "slo_definitions" in summary:
        return [Slo(**d) for d in summary["slo_definitions"]]
    out = []
    for name in (summary.get("options") or {}).get("slos") or []:
        with contextlib.suppress(SloError):
            out.append(parse_slo(str(name)))
    return out


def _options(run: BenchRunRow, segments: Sequence[BenchSegmentRow]) -> tuple[dict[str, Any], list[Slo]]:
    """The run's options (the first stored segment's, without its segment) and its SLOs."""
    summary = json.loads(segments[0].summary if segments else run.summary)
    options = summary.get("options") or {"load": run.load, "model": run.model, "kind": run.kind}
    return {**options, "segment": None}, _slos(summary)


def is_split(run: BenchRunRow, segments: Sequence[BenchSegmentRow]) -> bool:
    """Whether the run was split into segments (else one process stored it whole)."""
    return bool(segments) or SPLIT_KEY in json.loads(run.summary)


def common_clock_sends(
    requests: Sequence[BenchRequestRow], segments: Sequence[BenchSegmentRow], warmup: int
) -> tuple[list[float], str]:
    """The send times on one clock, and which: each segment's stamps moved by its measured offset onto the
    database's ("database") when every segment of a split run measured one, else as stored ("own": each
    machine's own wall clock, in which its own skew cannot show). A measured request's id is its schedule
    index, so its segment is (id - warmup) mod N."""
    offsets = {s.segment: s.clock_offset_s for s in segments}
    if not segments or any(v is None for v in offsets.values()):
        return [r.sent_at for r in requests], "own"
    n = segments[0].segments
    return [r.sent_at + (offsets.get((r.request_id - warmup) % n) or 0.0) for r in requests], "database"


def merged_outcome(
    run: BenchRunRow, segments: Sequence[BenchSegmentRow], requests: Sequence[BenchRequestRow]
) -> BenchOutcome:
    """The split run as one outcome: its records on the common start's time axis, counts and stop reason
    over every segment."""
    n, start_at = _expected(run, segments)
    doc = segments_doc(run, segments)
    records = [record_from_row(r, start_at) for r in requests]
    options, slos = _options(run, segments)
    incomplete = [s for s in segments if not s.complete]
    if not is_split(run, segments):
        reason, message = run.stop_reason, json.loads(run.summary).get("message")
    elif doc["missing"]:
        reason = "segments_missing"
        message = f"segment(s) {', '.join(map(str, doc['missing']))} of {n} not stored"
    elif incomplete:
        first = incomplete[0]
        reason, message = first.stop_reason, f"segment {first.segment}: {first.message}"
    else:
        reason, message = "finished", None
    end = max((s.finished_at for s in segments), default=start_at)
    cpu = [s.cpu_s for s in segments if s.cpu_s is not None]
    outcome = BenchOutcome(
        options=options,
        records=records,
        started_at_unix=start_at,
        wall_s=max(0.0, end - start_at),
        complete=run.complete if not is_split(run, segments) else not doc["missing"] and not incomplete,
        stop_reason=reason,
        message=message,
        slos=slos,
        requested_rate=run.requested_rate,
        run_id=run.id,
        measure_start_s=0.0,
        max_error_rate=options.get("max_error_rate"),  # the run's --max-error-rate, judged on the union
    )
    outcome.client = {
        "cpu_s": math.fsum(cpu) if cpu else None,
        "cpu_per_request_s": math.fsum(cpu) / len(records) if cpu and records else None,
    }
    return outcome


def merged_summary(
    run: BenchRunRow,
    segments: Sequence[BenchSegmentRow],
    requests: Sequence[BenchRequestRow],
    outcome: BenchOutcome | None = None,
) -> dict[str, Any]:
    """summary.json of the merged run, with its segments and the arrival process of the merged sends."""
    outcome = outcome or merged_outcome(run, segments, requests)
    summary = outcome.summary()
    for name in NOT_MERGED:
        summary["metrics"].pop(name, None)
    summary["not_merged"] = list(NOT_MERGED)
    if is_split(run, segments):
        summary[SPLIT_KEY] = segments_doc(run, segments)
    summary["throughput"] = outcome.throughput()
    if run.arrivals is not None and run.requested_rate:
        sends, clock = common_clock_sends(requests, segments, int(outcome.options.get("warmup") or 0))
        check = check_arrivals(sends, run.arrivals, run.requested_rate)
        summary["arrivals"] = {**check.to_dict(), "clock": clock}
    if outcome.slos:
        summary["slo_results"] = outcome.slo_results()
    return summary


def merge_run(
    run: BenchRunRow, segments: list[BenchSegmentRow], requests: list[BenchRequestRow]
) -> BenchRunRow:
    """The run row from every stored part (the store's merge callback)."""
    outcome = merged_outcome(run, segments, requests)
    summary = merged_summary(run, segments, requests, outcome)
    return run_row(outcome, instance=run.instance, summary=summary)
