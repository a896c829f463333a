"""Spans as plain data: the receiver URL, the peer's attributes, error.type, the token events."""

from __future__ import annotations

from tokwatch.figures.result import RunResult, Status
from tokwatch.tracing.context import RequestTrace, new_ids
from tokwatch.tracing.otlp import traces_url
from tokwatch.tracing.spans import (
    FIRST_TOKEN,
    LAST_TOKEN,
    OUTPUT_START,
    REQUEST_SENT,
    THINK_END,
    Clock,
    Peer,
    figure_attributes,
    probe_span,
    timeline_events,
)


def test_an_endpoint_without_a_path_sends_to_v1_traces() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"


def test_peer_attributes_name_the_provider_and_the_server() -> None:
    a = Peer("anthropic", "claude", "https://api.example.com/v1/messages").attributes()
    assert a["gen_ai.provider.name"] == "anthropic"
    assert (a["server.address"], a["server.port"]) == ("api.example.com", 443)
    b = Peer("vllm", "m", "http://10.0.0.5:8000/v1/chat/completions").attributes()
    assert (b["gen_ai.provider.name"], b["server.port"], b["gen_ai.operation.name"]) == ("vllm", 8000, "chat")


def test_a_degraded_run_has_its_error_class_as_error_type() -> None:
    run = RunResult("e", 0.0, Status.DEGRADED, error_class="no_tokens", http_status=200, output_tokens=0)
    attrs = figure_attributes(run)
    assert attrs["error.type"] == "no_tokens" and attrs["tokwatch.status"] == "degraded"
    assert "gen_ai.usage.output_tokens" not in attrs  # nothing generated, nothing claimed
    ok = RunResult("e", 0.0, Status.OK, output_tokens=3, think_tokens=2, finish_reason="stop")
    attrs = figure_attributes(ok)
    assert "error.type" not in attrs
    assert attrs["gen_ai.usage.output_tokens"] == 5 and attrs["gen_ai.usage.reasoning.output_tokens"] == 2
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]


def test_token_events_mark_the_end_of_reasoning() -> None:
    clock = Clock(offset_ns=0)
    events = {e.name: e.at_ns for e in timeline_events(clock, [1.0, 1.5, 2.0, 2.25, 3.0], think_tokens=2)}
    assert events == {
        FIRST_TOKEN: 10**9, THINK_END: 15 * 10**8, OUTPUT_START: 2 * 10**9, LAST_TOKEN: 3 * 10**9
    }
    plain = {e.name for e in timeline_events(clock, [1.0, 2.0], think_tokens=0)}
    assert plain == {FIRST_TOKEN, LAST_TOKEN}
    assert timeline_events(clock, [], 0) == []


def test_a_probe_span_is_timed_from_the_result() -> None:
    clock = Clock(offset_ns=0)
    trace = RequestTrace(new_ids(), called_at=10.0)
    run = RunResult("e", 0.0, Status.OK, send_delay_s=0.5, ttft_s=1.0, e2e_s=2.0, itl_s=[0.25, 0.25])
    run.streamed = True
    span = probe_span(trace, run, Peer("vllm", "m", "http://h:1/v1"), clock, max_tokens=3, now=99.0)
    events = {e.name: e.at_ns for e in span.events}
    assert (span.start_ns, span.end_ns) == (10 * 10**9, 125 * 10**8)
    assert events == {REQUEST_SENT: 105 * 10**8, FIRST_TOKEN: 115 * 10**8, LAST_TOKEN: 12 * 10**9}
    assert span.kind == "client" and span.name == "chat m" and span.error is None


def test_a_run_that_failed_before_its_request_is_a_point_when_it_came_back() -> None:
    run = RunResult("e", 0.0, Status.PROVIDER_ERROR, error_class="workload")
    span = probe_span(RequestTrace(new_ids()), run, Peer("vllm", "m", "http://h:1/v1"), Clock(offset_ns=0),
                      max_tokens=3, now=7.0)  # fmt: skip
    assert (span.start_ns, span.end_ns, span.events, span.error) == (7 * 10**9, 7 * 10**9, (), "workload")
