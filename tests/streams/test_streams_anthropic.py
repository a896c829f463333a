"""The Anthropic Messages stream parser on recorded event shapes: phases, usage and cache counts, pings,
signatures, unknown events, error events by type, and any split of the bytes."""

from __future__ import annotations

import json

import pytest

from tokwatch.figures.result import Status
from tokwatch.probes.status import classify_exception
from tokwatch.streams.anthropic import AnthropicStreamParser, parse_message
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamProtocolError


def sse(*events: dict) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


START = {
    "type": "message_start",
    "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
        "content": [], "stop_reason": None,
        "usage": {"input_tokens": 20, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 1000,
                  "output_tokens": 1},
    },
}  # fmt: skip
STREAM = sse(
    START,
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0,
     "delta": {"type": "thinking_delta", "thinking": "Let me think"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQB"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hello"}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": " world"}},
    {"type": "content_block_stop", "index": 1},
    {"type": "some_future_event", "detail": 1},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
     "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
)  # fmt: skip


def collect(data: bytes, piece: int) -> StreamCollector:
    parser, col = AnthropicStreamParser(), StreamCollector()
    for i in range(0, len(data), piece):
        col.add(parser.feed(data[i : i + piece], float(i)))
    col.add(parser.close(float(len(data))))
    return col


@pytest.mark.parametrize("piece", [1, 7, 64, 100_000])
def test_phases_usage_and_stop_whatever_the_split(piece: int) -> None:
    col = collect(STREAM, piece)
    assert [(d.phase, d.text) for d in col.deltas] == [
        ("think", "Let me think"),
        ("output", "Hello"),
        ("output", " world"),
    ]
    assert col.model == "claude-sonnet-4-5-20250929" and col.done and col.finish_reason == "max_tokens"
    usage = col.usage
    assert usage is not None
    # the prompt is all three counts; only the cache reads are cached (written ones were computed)
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (1050, 1000, 7)


def test_the_prompt_counts_of_message_start_hold_before_the_output_count() -> None:
    parser = AnthropicStreamParser()
    (_model, usage) = parser.feed(sse(START), 0.0)
    assert usage.completion_tokens is None and usage.prompt_tokens == 1050  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("error_type", "status", "error_class"),
    [
        ("overloaded_error", Status.RATE_LIMITED, "overloaded"),
        ("rate_limit_error", Status.RATE_LIMITED, "rate_limit"),
        ("authentication_error", Status.AUTH_FAILURE, "auth_error"),
        ("api_error", Status.PROVIDER_ERROR, "stream_error"),
    ],
)
def test_error_events_by_type(error_type: str, status: Status, error_class: str) -> None:
    data = sse(START, {"type": "error", "error": {"type": error_type, "message": "Overloaded"}})
    with pytest.raises(StreamProtocolError) as info:
        collect(data, 100_000)
    outcome = classify_exception(info.value)
    assert (outcome.status, outcome.error_class) == (status, error_class)
    assert "Overloaded" in outcome.message


def test_a_delta_that_is_not_an_object_is_a_bad_shape() -> None:
    with pytest.raises(StreamProtocolError, match="delta") as info:
        collect(sse({"type": "content_block_delta", "index": 0, "delta": "x"}), 100_000)
    assert info.value.error_class == "bad_shape"


def test_the_non_streamed_message() -> None:
    message = {
        "type": "message", "model": "claude-x", "stop_reason": "end_turn",
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Hi"}],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 9},
    }  # fmt: skip
    col = StreamCollector()
    col.add(parse_message(message, 1.0))
    assert [(d.phase, d.text) for d in col.deltas] == [("think", "hmm"), ("output", "Hi")]
    assert col.usage is not None and (col.usage.prompt_tokens, col.usage.cached_tokens) == (7, 2)
    assert col.finish_reason == "end_turn"
    with pytest.raises(StreamProtocolError) as info:
        parse_message({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, 1.0)
    assert info.value.error_class == "overloaded"
