"""Merging the stored parts of a split run: the figures of the union, from the one-process functions."""

import dataclasses
import json

import pytest

from tokwatch.bench.aggregate import all_summaries
from tokwatch.bench.merge import (
    NOT_MERGED,
    SPLIT_KEY,
    merge_run,
    merged_outcome,
    merged_summary,
    plan_summary,
    record_from_row,
)
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.run_report import render_text
from tokwatch.bench.storing import bench_rows, planned_run_row, request_row
from tokwatch.figures.result import Status
from tokwatch.figures.stats import percentile
from tokwatch.settings.redact import Redactor
from tokwatch.storage.bench_rows import BenchSegmentRow

START = 1_800_000_000.0


def _records(make_record, ids, ttft):
    out = []
    for i in ids:
        r = make_record(i, ttft=ttft + 0.001 * i, gap=0.01 + 0.0001 * i, tokens=5 + i % 3, sent=0.05 * i)
        r.intended_at_s = r.sent_at_s - 0.002
        r.dispatched_at_s = r.sent_at_s - 0.0005
        r.started_at_s = r.dispatched_at_s + 0.0001
        out.append(r)
    return out


def _segment(k, n, records, *, complete=True, stop="finished", offset=None):
    options = {"load": "open loop 10/s poisson", "model": "m", "rate": 10.0, "arrivals": "poisson"}
    options["max_error_rate"] = 0.05
    slo = {"name": "ttft:p90<=0.2", "metric": "ttft", "percentile": 0.9, "value": 0.2}
    summary = {"options": options, "slo_definitions": [slo]}
    return BenchSegmentRow(
        bench_run_id="run-1",
        segment=k,
        segments=n,
        instance=f"pod-{k}",
        start_at=START,
        started_at=START,
        finished_at=START + 2.0 + k,
        start_lag_s=0.001 * (k + 1),
        clock_offset_s=offset,
        clock_error_s=None if offset is None else 0.0002,
        complete=complete,
        stop_reason=stop,
        message=None if complete else "stopped",
        arrivals_planned=len(records),
        requests_measured=len(records),
        requests_ok=sum(r.ok for r in records),
        cpu_s=0.5,
        summary=json.dumps(summary),
    )


def _plan(n):
    options = {"load": "open loop 10/s poisson", "model": "m", "kind": "openai", "rate": 10.0}
    options["arrivals"] = "poisson"
    summary = plan_summary(n, START)
    return planned_run_row("run-1", options, START, summary, instance="pod-0", redact=Redactor())


def _rows(records):
    return [request_row("run-1", START, r, Redactor()) for r in records]


def test_a_stored_request_comes_back_with_its_figures(make_record):
    (r,) = _records(make_record, [3], 0.1)
    back = record_from_row(_rows([r])[0], START)
    assert back.sent_at_s == pytest.approx(r.sent_at_s, abs=1e-6)
    assert back.scheduling_lag_s == pytest.approx(r.scheduling_lag_s, abs=1e-9)
    assert back.queue_time_s == pytest.approx(r.queue_time_s, abs=1e-9)
    assert (back.ttft_s, back.e2e_s, back.tpot_s, back.tbt_s) == (r.ttft_s, r.e2e_s, r.tpot_s, r.tbt_s)
    assert back.token_times_s() == pytest.approx(r.token_times_s())


def test_the_merged_figures_are_the_union_s_from_the_one_process_functions(make_record):
    a = _records(make_record, range(0, 30, 2), 0.10)  # segment 0: fast
    b = _records(make_record, range(1, 30, 2), 0.30)  # segment 1: slow
    b[3].status, b[3].error_class = Status.PROVIDER_ERROR, "http_5xx"
    segments = [_segment(0, 2, a), _segment(1, 2, b)]
    requests = sorted(_rows(a) + _rows(b), key=lambda r: r.request_id)
    summary = merged_summary(_plan(2), segments, requests)
    one = all_summaries(a + b)
    for name in ("ttft", "tbt", "tpot", "e2e", "normalized_latency", "scheduling_lag", "queue_time"):
        assert summary["metrics"][name] == pytest.approx(one[name]), name
    union = [r.ttft_s for r in a + b if r.ok]
    averaged = (percentile([r.ttft_s for r in a], 90) + percentile([r.ttft_s for r in b if r.ok], 90)) / 2
    assert summary["metrics"]["ttft"]["p90"] == pytest.approx(percentile(union, 90))
    assert summary["metrics"]["ttft"]["p90"] != pytest.approx(averaged)  # the union's, not an average
    assert summary["requests"] | {"by_status": None} == {
        "total": 30, "ok": 29, "errored": 1, "warmup_excluded": 0, "error_rate": 1 / 30, "by_status": None,
        "max_error_rate": 0.05, "error_rate_exceeded": False,  # the run's limit, judged on the union
    }  # fmt: skip
    assert set(NOT_MERGED).isdisjoint(summary["metrics"]) and summary["not_merged"] == list(NOT_MERGED)
    split = summary[SPLIT_KEY]
    assert (split["stored"], split["missing"], split["arrivals_planned"]) == ([0, 1], [], 30)
    assert summary["complete"] and summary["stop_reason"] == "finished"
    assert summary["slo_results"]["results"][0]["observed_value"] == pytest.approx(percentile(union, 90))


def test_missing_and_stopped_segments_make_the_run_incomplete(make_record):
    a = _records(make_record, range(0, 12, 3), 0.1)
    c = _records(make_record, range(2, 12, 3), 0.1)
    segments = [_segment(0, 3, a), _segment(2, 3, c, complete=False, stop="late_start")]
    outcome = merged_outcome(_plan(3), segments, sorted(_rows(a) + _rows(c), key=lambda r: r.request_id))
    assert not outcome.complete and outcome.stop_reason == "segments_missing"
    assert outcome.message == "segment(s) 1 of 3 not stored"
    assert outcome.exit_code() == 3
    outcome = merged_outcome(_plan(3), segments[1:], _rows(c))
    assert outcome.message == "segment(s) 0, 1 of 3 not stored"
    nothing = merged_outcome(_plan(3), [], [])
    assert nothing.stop_reason == "segments_missing" and nothing.exit_code() == 4


def test_a_stopped_segment_names_itself(make_record):
    a = _records(make_record, range(0, 6, 2), 0.1)
    b = _records(make_record, range(1, 6, 2), 0.1)
    segments = [_segment(0, 2, a), _segment(1, 2, b, complete=False, stop="late_start")]
    outcome = merged_outcome(_plan(2), segments, _rows(a) + _rows(b))
    assert (outcome.stop_reason, outcome.message) == ("late_start", "segment 1: stopped")


def test_clock_offsets_are_compared_only_when_every_segment_measured_one(make_record):
    a, b = _records(make_record, [0], 0.1), _records(make_record, [1], 0.1)
    both = merged_summary(_plan(2), [_segment(0, 2, a, offset=0.004), _segment(1, 2, b, offset=-0.001)], [])
    assert both[SPLIT_KEY]["clock_offset_spread_s"] == pytest.approx(0.005)
    assert both[SPLIT_KEY]["clock_offset_error_s"] == pytest.approx(0.0002)
    one = merged_summary(_plan(2), [_segment(0, 2, a, offset=0.004), _segment(1, 2, b)], [])
    assert one[SPLIT_KEY]["clock_offset_spread_s"] is None


def test_the_merged_row_is_the_run_row_of_the_merged_outcome(make_record):
    a = _records(make_record, range(0, 10, 2), 0.1)
    b = _records(make_record, range(1, 10, 2), 0.1)
    rows = sorted(_rows(a) + _rows(b), key=lambda r: r.request_id)
    row = merge_run(_plan(2), [_segment(0, 2, a), _segment(1, 2, b)], rows)
    assert (row.id, row.instance, row.complete, row.stop_reason) == ("run-1", "pod-0", True, "finished")
    assert (row.requests_measured, row.requests_ok, row.all_slos_met) == (10, 10, True)
    assert row.ttft_p99_s == pytest.approx(percentile([r.ttft_s for r in a + b], 99))
    assert (row.started_at, row.finished_at) == (START, START + 3.0)
    assert json.loads(row.summary)[SPLIT_KEY]["segments"] == 2


def test_a_one_process_run_reports_as_itself(make_record):
    records = _records(make_record, range(8), 0.1)
    outcome = BenchOutcome(
        options={"load": "closed loop, concurrency 2", "model": "m", "slos": ["ttft:p99<=1s"]},
        records=records, started_at_unix=START, wall_s=1.0, complete=False, stop_reason="interrupted",
        message="interrupted: ...", run_id="run-1",
    )  # fmt: skip
    run, requests = bench_rows(outcome)
    summary = merged_summary(run, [], requests)
    assert SPLIT_KEY not in summary
    assert (summary["complete"], summary["stop_reason"]) == (False, "interrupted")
    assert summary["message"] == "interrupted: ..."
    assert summary["slo_results"]["results"][0]["met"] is True


def test_a_clock_skew_shows_in_the_arrivals_on_the_database_clock(make_record):
    # Constant 10/s over two machines; machine 1's clock runs 5 ms ahead, so it sends 5 ms early in true time
    # while its own stamps say it was on time: only on the database's clock does the skew show.
    a = _records(make_record, range(0, 40, 2), 0.1)
    b = _records(make_record, range(1, 40, 2), 0.1)
    for r in a + b:
        r.sent_at_s = 0.1 * r.request_id
    rows = sorted(_rows(a) + _rows(b), key=lambda r: r.request_id)
    plan = dataclasses.replace(_plan(2), arrivals="constant")
    own = merged_summary(plan, [_segment(0, 2, a), _segment(1, 2, b)], rows)["arrivals"]
    assert own["clock"] == "own" and own["gap_error_p99_s"] < 1e-6
    skewed = merged_summary(plan, [_segment(0, 2, a, offset=0.0), _segment(1, 2, b, offset=-0.005)], rows)
    arrivals = skewed["arrivals"]
    assert arrivals["clock"] == "database"
    assert arrivals["gap_error_p99_s"] == pytest.approx(0.005, abs=1e-6)
    assert arrivals["lag1_autocorrelation"] < -0.9  # every other gap long, the next short
    text = render_text(skewed)
    assert "the segments' clocks were 5.000 ms apart against the database's" in text
    assert "arrivals (constant, merged send stamps on the database's clock): 10.0/s of 10/s" in text
    assert "|gap - 1/R| p99 5.000 ms" in text
    assert "merged send stamps on each machine's own clock" in render_text(merged_summary(plan, [], rows))


def test_a_missing_segments_share_of_the_plan_is_counted(make_record):
    """Segment 1 of 3 stored nothing: its share of the schedule (every third of the 100 arrivals, from the
    options a stored segment ran with) is still planned, and the report says how much of it is missing."""
    a = _records(make_record, range(0, 12, 3), 0.1)
    c = _records(make_record, range(2, 12, 3), 0.1)
    segments = [_segment(0, 3, a), _segment(2, 3, c)]
    rows = sorted(_rows(a) + _rows(c), key=lambda r: r.request_id)
    summary = merged_summary(_plan(3), segments, rows)
    split = summary[SPLIT_KEY]
    assert split["missing"] == [1] and split["arrivals_planned_missing"] == 33  # ids 1, 4, ..., 97
    assert split["arrivals_planned"] == len(a) + len(c) + 33
    assert f"of {len(a) + len(c) + 33} planned (33 of them in the missing segments)" in render_text(summary)


def test_reasoning_figures_are_not_merged(make_record):
    """A stored row keeps no category or think budget: a split run's summary has no `reasoning` section."""
    a = _records(make_record, range(0, 6, 2), 0.10)
    b = _records(make_record, range(1, 6, 2), 0.10)
    for r in (a[0], b[0]):
        r.category, r.think_budget, r.think_budget_field = "reasoning", 4, "thinking_token_budget"
        r.think_tokens = 4  # thought its whole budget
    assert BenchOutcome({}, a + b, START, 1.0, True, "finished").summary()["reasoning"]["think_end"]["budget"]
    requests = sorted(_rows(a) + _rows(b), key=lambda r: r.request_id)
    summary = merged_summary(_plan(2), [_segment(0, 2, a), _segment(1, 2, b)], requests)
    assert "reasoning" not in summary and summary["not_merged"] == list(NOT_MERGED)
