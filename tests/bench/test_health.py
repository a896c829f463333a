"""Health checks that are measured facts about the client: loop stalls and merged reads per request."""

from __future__ import annotations

from collections.abc import Callable

from tokwatch.bench.health import Check, _client_timing, _prompt_length
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.openai import OpenAIStreamParser


def _records(
    make_record: Callable[..., RequestRecord], stalls: list[float], lateness: list[float] | None = None
) -> list[RequestRecord]:
    out = []
    for i, stall in enumerate(stalls):
        r = make_record(i)
        r.max_stall_s = stall
        r.stamp_lateness_s = stall if lateness is None else lateness[i]
        r.merged_reads = 1 if stall else 0
        out.append(r)
    return out


def test_a_run_whose_client_stalled_often_does_not_pass(make_record: Callable[..., RequestRecord]) -> None:
    (clean,) = _client_timing(_records(make_record, [0.0] * 40))
    assert clean.verdict == "PASS" and "0/40 requests" in clean.detail
    (some,) = _client_timing(_records(make_record, [0.0] * 39 + [0.012]))
    assert some.verdict == "WARN" and "worst 12.0 ms" in some.detail
    (bad,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10))
    assert bad.verdict == "FAIL" and "10 merged reads in 10 requests" in bad.detail


def test_a_stall_counts_only_where_it_could_have_moved_a_used_stamp(
    make_record: Callable[..., RequestRecord],
) -> None:
    # Ten of forty requests streamed through a 20 ms stall of the loop, but none of their stamps could have
    # been delayed by it (between two tokens, or stamped by the receive watcher): a clean run.
    records = _records(make_record, [0.0] * 30 + [0.02] * 10, [0.0] * 30 + [0.001] * 10)
    (watched,) = _client_timing(records, "kernel+watcher_thread")
    assert watched.verdict == "PASS" and "0/40 requests have a stamp" in watched.detail
    assert "stalled >= 5 ms while 10 requests streamed (worst 20.0 ms" in watched.detail
    assert "not the watcher's stamps" in watched.detail
    # The same stalls under stamps the loop took at them: the run's client timings are not trusted.
    (loop,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10), "event_loop")
    assert loop.verdict == "FAIL" and "10/40 requests have a stamp" in loop.detail
    assert "taken by the event loop" in loop.detail
    # The kernel's stamps on the loop's reads are held to the loop's bound: a read the loop came to late
    # can carry bytes that arrived before its newest segment.
    (kernel,) = _client_timing(_records(make_record, [0.0] * 30 + [0.02] * 10), "kernel")
    assert kernel.verdict == "FAIL" and "taken by the kernel (its receive time on each" in kernel.detail


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
