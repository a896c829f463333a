"""Health checks that are measured facts about the client: loop stalls and merged reads per request."""

from __future__ import annotations

from collections.abc import Callable

from tokwatch.bench.health import Check, _client_timing, _prompt_length, run_checks
from tokwatch.bench.outcome import BenchOutcome, ExitCode
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.openai import OpenAIStreamParser


def _records(
    make_record: Callable[..., RequestRecord], stalls: list[float], beyond: list[list[str]] | None = None
) -> list[RequestRecord]:
    """Requests whose TTFT (and E2E) a loop stall of `stalls[i]` may have made late: measured that much slower
    than the others (100 ms), so the late ones are the run's tail."""
    out = []
    for i, stall in enumerate(stalls):
        r = make_record(i, ttft=0.1 + stall)
        r.max_stall_s = r.stamp_lateness_s = stall
        r.ttft_error_s = r.e2e_error_s = stall
        r.tpot_error_s = 0.0
        # What the exchange found (tokwatch.probes.exchange.latencies_beyond_tolerance): here, a stall moved
        # the request's TTFT beyond its tolerance unless told otherwise.
        r.beyond_tolerance = (["ttft"] if stall else []) if beyond is None else beyond[i]
        r.merged_reads = 1 if stall else 0
        out.append(r)
    return out


def test_a_run_whose_published_figures_the_client_moved_beyond_tolerance_does_not_pass(
    make_record: Callable[..., RequestRecord],
) -> None:
    (clean,) = _client_timing(_records(make_record, [0.0] * 40))
    assert clean.verdict == "PASS" and "0/40 requests have a figure" in clean.detail
    assert clean.detail.startswith("0 of 20 published figures beyond tolerance (closest: ")
    # Ten of forty requests 20 ms slower, each by at most the stall it streamed through: the tail (p90 and
    # up) may be 20 ms off, beyond 5 % of its 120 ms; the median is exact.
    (bad,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10))
    assert bad.verdict == "FAIL" and "10/40 requests" in bad.detail and "exit 6" in bad.detail
    assert "ttft p90 ± 20.00 ms > 6.00 ms" in bad.detail and "ttft p50" not in bad.detail
    assert "10 merged reads in 10 requests" in bad.detail and "worst stamp lateness 20.0 ms" in bad.detail


def test_loose_requests_that_move_no_published_figure_warn(make_record: Callable[..., RequestRecord]) -> None:
    # A fifth of the requests carry a bound beyond their own tolerance, but were measured no slower than the
    # rest: no percentile can be off, the mean by 4 ms of its 5 ms tolerance. The requests are flagged (a
    # WARN), the run's figures stand: under a per-request share this run failed.
    records = _records(make_record, [0.0] * 40)
    for r in records[:8]:
        r.max_stall_s = r.stamp_lateness_s = r.ttft_error_s = r.e2e_error_s = 0.02
        r.beyond_tolerance = ["ttft"]
    (check,) = _client_timing(records)
    assert check.verdict == "WARN" and "8/40 requests have a figure of their own" in check.detail
    closest = "0 of 20 published figures beyond tolerance (closest: ttft mean ± 4.00 ms of 5.00 ms)"
    assert closest in check.detail


def test_a_stall_counts_only_where_it_moved_a_figure_beyond_tolerance(
    make_record: Callable[..., RequestRecord],
) -> None:
    # Ten of forty requests streamed through a 20 ms stall of the loop, but it moved none of their stamps
    # (between two tokens of a long answer, or stamped by the receive watcher): clean.
    records = _records(make_record, [0.0] * 40)
    for r in records[30:]:
        r.max_stall_s = 0.02
    (watched,) = _client_timing(records, "kernel+watcher_thread")
    assert watched.verdict == "PASS" and "0/40 requests have a figure" in watched.detail
    assert "stalled >= 5 ms while 10 requests streamed (worst 20.0 ms" in watched.detail
    assert "not the watcher's stamps" in watched.detail
    # The same stalls where they moved the stamps: the run's client timings are untrusted.
    beyond = [[]] * 30 + [["ttft", "itl"]] * 10
    (loop,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10, beyond), "event_loop")
    assert loop.verdict == "FAIL" and "10/40 requests" in loop.detail and "(ttft 10, itl 10)" in loop.detail
    assert "taken by the event loop" in loop.detail
    (kernel,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10), "kernel")
    assert kernel.verdict == "FAIL" and "taken by the kernel (its receive time on each" in kernel.detail


def test_client_timing_beyond_tolerance_is_exit_6(make_record: Callable[..., RequestRecord]) -> None:
    def outcome(records: list[RequestRecord]) -> BenchOutcome:
        return BenchOutcome(
            options={}, records=records, started_at_unix=0, wall_s=10, complete=True, stop_reason="finished"
        )

    clean = outcome(_records(make_record, [0.0] * 40))
    assert clean.exit_code() is ExitCode.OK and not clean.client_timing_failed
    # One request of 400 slower by its stall: past the p99 (interpolated between the 396th and 397th
    # values), so no published figure moves beyond tolerance: a WARN, not a FAIL.
    one = outcome(_records(make_record, [0.0] * 399 + [0.02]))
    assert one.exit_code() is ExitCode.OK and one.beyond_tolerance_share == 1 / 400
    assert [c.verdict for c in run_checks(one) if c.name == "client timing"] == ["WARN"]
    busy = outcome(_records(make_record, [0.0] * 30 + [0.02] * 10))
    assert busy.exit_code() is ExitCode.CLIENT_TIMING == 6
    assert [c.verdict for c in run_checks(busy) if c.name == "client timing"] == ["FAIL"]
    # Records without bounds (a merged run read back from the store) are not judged.
    unjudged = outcome([make_record(i) for i in range(40)])
    assert unjudged.beyond_tolerance_share is None and unjudged.exit_code() is ExitCode.OK


def test_merged_reads_are_counted_per_read() -> None:
    def chunk(text: str) -> bytes:
        return b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n'

    parser, col = OpenAIStreamParser(), StreamCollector()
    col.add(parser.feed(chunk("a"), 1.0))
    col.add(parser.feed(chunk("b"), 1.1))
    assert col.merged_reads == 0
    col.add(parser.feed(chunk("c") + chunk("d") + chunk("e"), 1.2))  # three chunks in one read
    assert col.merged_reads == 1 and len(col.deltas) == 5


def _prompt_check(records: list[RequestRecord]) -> Check:
    (check,) = _prompt_length(records)
    return check


def _prompted(make_record, pairs: list[tuple[int, int]]) -> list[RequestRecord]:
    out = []
    for i, (target, counted) in enumerate(pairs):
        r = make_record(i)
        r.prompt_tokens_target, r.prompt_tokens = target, counted
        out.append(r)
    return out


def test_prompt_length_sets_the_chat_template_apart(make_record) -> None:
    # A correct 128-token prompt counted with a 31-token template (ratio 1.24) is not a wrong prompt ...
    check = _prompt_check(_prompted(make_record, [(128, 159)] * 20))
    assert check.verdict == "PASS" and "1.24" in check.detail and "excess of 31 tokens" in check.detail
    # ... but prompts twice as long as asked are, whatever the template.
    assert _prompt_check(_prompted(make_record, [(128, 290)] * 20)).verdict == "FAIL"
    # ... and so are prompts 1.3 x as long at one length: an excess a template could give, but not at 1.3 x
    check = _prompt_check(_prompted(make_record, [(128, 166)] * 20))
    assert check.verdict == "FAIL" and "above the 1.25x a chat template is taken for" in check.detail
    # With several lengths the template is the intercept and the slope must be 1.
    check = _prompt_check(_prompted(make_record, [(t, t + 30) for t in (64, 128, 256, 512)] * 5))
    assert check.verdict == "PASS" and "1.00 x target + 30" in check.detail
    check = _prompt_check(_prompted(make_record, [(t, 2 * t + 30) for t in (64, 128, 256, 512)] * 5))
    assert check.verdict == "FAIL" and "2.00 x target" in check.detail
