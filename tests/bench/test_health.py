"""Health checks that are measured facts about the client: loop stalls and merged reads per request."""

from __future__ import annotations

from collections.abc import Callable

from tokwatch.bench.health import _client_timing
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.streams import OpenAIStreamParser, StreamCollector


def _records(make_record: Callable[..., RequestRecord], stalls: list[float]) -> list[RequestRecord]:
    out = []
    for i, stall in enumerate(stalls):
        r = make_record(i)
        r.max_stall_s = stall
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


def test_merged_reads_are_counted_per_read() -> None:
    def chunk(text: str) -> bytes:
        return b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n'

    parser, col = OpenAIStreamParser(), StreamCollector()
    col.add(parser.feed(chunk("a"), 1.0))
    col.add(parser.feed(chunk("b"), 1.1))
    assert col.merged_reads == 0
    col.add(parser.feed(chunk("c") + chunk("d") + chunk("e"), 1.2))  # three chunks in one read
    assert col.merged_reads == 1 and len(col.deltas) == 5
