from tokwatch.figures.result import Status, TimingSource
from tokwatch.figures.timing import normalized_latency


def test_record_lifecycle_figures_and_run_result(make_record):
    r = make_record(3, ttft=0.2, gap=0.01, tokens=5, sent=2.0)
    r.intended_at_s = 1.5
    r.dispatched_at_s = 1.502
    r.started_at_s = 1.9
    r.decode_tokens_per_s = 100.0
    assert round(r.scheduling_lag_s, 6) == 0.002
    assert round(r.queue_time_s, 6) == 0.398
    assert round(r.connect_s, 6) == 0.1
    assert r.normalized_latency_s == r.e2e_s / 5
    # seed 004: per generated token, so a reasoning request is divided by its think tokens too, and one
    # that spent its whole budget thinking still has a value.
    r.think_tokens = 15
    assert r.normalized_latency_s == r.e2e_s / 20
    rr = r.to_run_result("e", run_started_unix=0.0)
    assert normalized_latency(rr.e2e_s, (rr.output_tokens or 0) + (rr.think_tokens or 0)) == r.e2e_s / 20
    r.output_tokens = 0
    assert r.normalized_latency_s == r.e2e_s / 15
    r.think_tokens = 0
    assert r.normalized_latency_s is None
    r.output_tokens, r.think_tokens = 5, 0
    assert [round(t, 6) for t in r.token_times_s()] == [2.2, 2.21, 2.22, 2.23, 2.24]
    d = r.to_dict()
    assert d["queue_time_s"] == r.queue_time_s and "reply_text" not in d
    rr = r.to_run_result("vllm-a", run_started_unix=1000.0)
    assert rr.started_at == 1002.0 and rr.status is Status.OK
    assert rr.source is TimingSource.CLIENT_STREAM and rr.tokens_per_second == 100.0
    assert rr.itl_s == r.tbt_s and rr.ttft_s == 0.2 and rr.tokens_source == "usage"
