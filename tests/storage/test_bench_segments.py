"""The segments of a split bench run in the bench store (SQLite and PostgreSQL, the `bench` fixture): claiming
the plan, writing each segment with its requests once, merging the run row under a lock; the run store's
clock, which segments agree on the start by."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from tokwatch.storage.base import BenchStore, RunStore
from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow, BenchSegmentRow
from tokwatch.storage.sqlite import SQLiteStore

T0 = 1_790_000_000.0


def _plan(start: float, n: int = 2) -> BenchRunRow:
    latency = {f"{m}_{q}_s": None for m in ("ttft", "tbt", "tpot", "e2e") for q in ("p50", "p90", "p99")}
    return BenchRunRow(
        id="split-1", started_at=start, finished_at=start, endpoint="ep", model="m", kind="openai",
        load="open loop 4/s poisson", arrivals="poisson", requested_rate=4.0, concurrency=None,
        complete=False, stop_reason="running", requests_measured=0, requests_ok=0, requests_errored=0,
        request_throughput=None, token_throughput=None, request_throughput_steady=None,
        token_throughput_steady=None, generated_tokens_per_s=None, goodput_ratio=None, goodput_per_s=None,
        all_slos_met=None, summary=json.dumps({"split": {"segments": n, "start_at": start}}),
        instance="pod-0", **latency,
    )  # fmt: skip


def _segment(k: int, offset: float | None = None) -> BenchSegmentRow:
    return BenchSegmentRow(
        bench_run_id="split-1", segment=k, segments=2, instance=f"pod-{k}", start_at=T0,
        started_at=T0 + 0.001, finished_at=T0 + 5.5, start_lag_s=0.0002, clock_offset_s=offset,
        clock_error_s=0.0001 if offset else None, complete=k == 0,
        stop_reason="finished" if k == 0 else "late_start", message=None if k == 0 else "late",
        arrivals_planned=3, requests_measured=3, requests_ok=3, cpu_s=0.25, summary=json.dumps({"k": k}),
    )  # fmt: skip


def _request(i: int) -> BenchRequestRow:
    return BenchRequestRow(
        bench_run_id="split-1", request_id=i, sent_at=T0 + 0.25 * i, status="ok", error_class=None,
        ttft_s=0.1 + i / 100, ttot_s=None, tpot_s=0.01, e2e_s=0.2, tbt_p50_s=0.01, tbt_p99_s=0.01,
        output_tokens=5, think_tokens=0, prompt_tokens=10, tokens_source="usage", fluidity_index=1.0,
        scheduling_lag_s=0.0001, queue_time_s=0.0, normalized_latency_s=0.04, decode_tokens_per_s=100.0,
        tbt_s=(0.01, 0.01, 0.01, 0.01),
    )  # fmt: skip


async def test_the_first_claim_fixes_the_plan_for_everyone(bench: BenchStore) -> None:
    first = await bench.claim_bench_run(_plan(T0))
    second = await bench.claim_bench_run(_plan(T0 + 30.0))
    assert first.started_at == second.started_at == pytest.approx(T0)
    assert json.loads(second.summary) == {"split": {"segments": 2, "start_at": T0}}


async def test_segments_are_written_once_with_their_requests_and_merged(bench: BenchStore) -> None:
    plan = _plan(T0)
    assert await bench.write_bench_segment(plan, _segment(1, offset=-0.002), [_request(1), _request(3)])
    assert await bench.write_bench_segment(plan, _segment(0, offset=0.003), [_request(0), _request(2)])
    # a segment run again (a retried pod) is kept as it was, its requests not doubled
    assert not await bench.write_bench_segment(plan, replace(_segment(0), instance="other"), [_request(4)])
    segments = await bench.bench_segments("split-1")
    assert segments == [_segment(0, offset=0.003), _segment(1, offset=-0.002)]
    seen: list[tuple[int, list[int]]] = []

    def merge(run: BenchRunRow, segs: list[BenchSegmentRow], reqs: list[BenchRequestRow]) -> BenchRunRow:
        seen.append((len(segs), [r.request_id for r in reqs]))
        done = {"complete": True, "stop_reason": "finished", "requests_measured": len(reqs)}
        return replace(run, **done, ttft_p99_s=0.5)

    merged = await bench.merge_bench_run("split-1", merge)
    assert seen == [(2, [0, 1, 2, 3])]
    stored = await bench.bench_run("split-1")
    assert stored is not None and stored[0] == merged
    assert (stored[0].complete, stored[0].requests_measured, stored[0].ttft_p99_s) == (True, 4, 0.5)
    assert stored[1][0].tbt_s == (0.01, 0.01, 0.01, 0.01)
    assert await bench.merge_bench_run("nope", merge) is None


async def test_a_failing_merge_leaves_the_row_as_it_was(bench: BenchStore) -> None:
    await bench.write_bench_segment(_plan(T0), _segment(0), [_request(0)])

    def broken(run: BenchRunRow, segs: list[BenchSegmentRow], reqs: list[BenchRequestRow]) -> BenchRunRow:
        raise RuntimeError("merge bug")

    with pytest.raises(RuntimeError, match="merge bug"):
        await bench.merge_bench_run("split-1", broken)
    stored = await bench.bench_run("split-1")
    assert stored is not None and stored[0] == _plan(T0)
    assert await bench.write_bench_segment(_plan(T0), _segment(1), [_request(1)])  # not left locked


async def test_the_database_clock(store: RunStore) -> None:
    clock = await store.clock()
    if isinstance(store, SQLiteStore):
        assert clock is None  # a file has no clock of its own
    else:
        assert clock is not None and abs(clock - time.time()) < 5.0
