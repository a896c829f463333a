"""W3C traceparent: what goes on a traced request, what the simulator accepts from one."""

from __future__ import annotations

from tokwatch.tracing.context import (
    TRACEPARENT,
    RequestTrace,
    TraceIds,
    new_ids,
    parse_traceparent,
    traced_headers,
)


def test_traceparent_round_trips_and_names_the_span_as_parent() -> None:
    ids = new_ids()
    header = ids.traceparent
    assert header == f"00-{ids.trace_id:032x}-{ids.span_id:016x}-01"
    assert parse_traceparent(header) == ids
    child = new_ids(ids.trace_id)
    assert child.trace_id == ids.trace_id and child.span_id != ids.span_id


def test_malformed_or_invalid_traceparents_are_ignored() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(good) == TraceIds(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)
    for bad in (
        None,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short
    ):
        assert parse_traceparent(bad) is None


def test_only_a_traced_request_gets_the_header() -> None:
    base = {"Authorization": "Bearer k"}
    assert traced_headers(base, None) is base
    trace = RequestTrace(new_ids())
    headers = traced_headers(base, trace)
    assert headers == {**base, TRACEPARENT: trace.ids.traceparent}
    assert trace.called_at > 0 and TRACEPARENT not in base
