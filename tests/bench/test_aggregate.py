import pytest

from tokwatch.bench.aggregate import (
    all_summaries,
    error_counts,
    metric_values,
    prefill_stats,
    summarize,
    throughput,
)
from tokwatch.figures.result import Status


def test_summarize_matches_numpy():
    np = pytest.importorskip("numpy")
    values = [0.3, 0.1, 0.4, 0.15, 0.9, 0.26, 0.5]
    s = summarize(values)
    assert s["count"] == 7
    for q in (50, 90, 95, 99):
        assert s[f"p{q}"] == pytest.approx(float(np.percentile(values, q)))
    assert s["mean"] == pytest.approx(float(np.mean(values)))
    assert s["std"] == pytest.approx(float(np.std(values)))
    assert (s["min"], s["max"]) == (0.1, 0.9)
    assert summarize([])["p99"] is None


def test_list_metrics_are_per_token_and_ok_only(make_record):
    records = [make_record(0, tokens=5, gap=0.02), make_record(1, status=Status.TIMEOUT)]
    assert metric_values(records, "tbt") == [0.02] * 4
    assert metric_values(records, "ttft") == [0.1]
    # Send-side figures cover failed requests too.
    assert len(metric_values(records, "queue_time")) == 2
    assert all_summaries(records)["tbt"]["count"] == 4


def test_throughput_windows(make_record):
    # 10 requests sent 1 s apart, 11 tokens each over 0.1 + 10 * 0.01 s.
    records = [make_record(i, sent=float(i)) for i in range(10)]
    out = throughput(records, wall_s=10.0)
    overall = out["overall"]
    assert overall["tokens_received"] == 110
    assert overall["tokens_per_s"] == pytest.approx(11.0)
    assert overall["requests_per_s"] == pytest.approx(1.0)
    steady = out["steady_state"]
    assert steady["window_start_s"] == pytest.approx(2.0)  # first 20 % of the wall time dropped
    assert steady["completed_requests"] == 8
    assert out["last_30s"]["window_start_s"] == 0.0


def test_error_counts_list_every_status(make_record):
    records = [make_record(0), make_record(1, status=Status.RATE_LIMITED), make_record(2, warmup=True)]
    counts = error_counts(records)
    assert set(counts) == {s.value for s in Status}
    assert counts["ok"] == 1 and counts["rate_limited"] == 1 and counts["timeout"] == 0


def test_prefill_stats_group_by_prompt_length(make_record):
    records = []
    for i, (n, ttft) in enumerate([(128, 0.1), (128, 0.3), (256, 0.5)]):
        r = make_record(i, ttft=ttft)
        r.prompt_tokens_target = n
        records.append(r)
    out = prefill_stats(records)
    assert out["group_by"] == "prompt_tokens_target"
    assert out["groups"]["128"]["count"] == 2
    assert out["groups"]["128"]["mean"] == pytest.approx(0.2)
    assert out["groups"]["256"]["p99"] == pytest.approx(0.5)
    many = []
    for i in range(40):
        r = make_record(i)
        r.prompt_tokens_target = 100 + i
        many.append(r)
    bucketed = prefill_stats(many)
    assert bucketed["group_by"].endswith("pow2_bucket")
    assert set(bucketed["groups"]) == {"128", "256"}
