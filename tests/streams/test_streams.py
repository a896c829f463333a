"""Stream parsers against real captures split at every byte boundary, plus edge cases."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import (
    Done,
    Finish,
    LlamaTimings,
    OllamaFinal,
    StreamEvent,
    StreamProtocolError,
    TextDelta,
    Usage,
)
from tokwatch.streams.framing import MAX_LINE_BYTES, NdjsonDecoder, SseDecoder
from tokwatch.streams.ollama import OllamaStreamParser
from tokwatch.streams.openai import OpenAIStreamParser, parse_chat_completion
from tokwatch.streams.think import ThinkTagSplitter

# Real server captures, copied into the repository (tests/data/README.md says where each came from).
SAMPLES = Path(__file__).resolve().parents[1] / "data"


def _feed_split(data: bytes, cuts: list[int], parser: OpenAIStreamParser | OllamaStreamParser) -> list:
    events: list[StreamEvent] = []
    prev = 0
    for i, cut in enumerate([*cuts, len(data)]):
        events.extend(parser.feed(data[prev:cut], float(i)))
        prev = cut
    events.extend(parser.close(float(len(cuts) + 1)))
    return events


def _strip_t(events: list[StreamEvent]) -> list[StreamEvent]:
    """Events with the receive time zeroed: splits change times, never content."""
    return [dataclasses.replace(e, t=0.0) for e in events]


@pytest.mark.parametrize("name", ["sse_sample.txt", "sse_sample_no_include_usage.txt"])
def test_sse_capture_identical_at_every_split(name: str) -> None:
    data = (SAMPLES / name).read_bytes()
    whole = _feed_split(data, [], OpenAIStreamParser())
    for cut in range(1, len(data)):
        assert _strip_t(_feed_split(data, [cut], OpenAIStreamParser())) == _strip_t(whole), cut
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        assert _strip_t(_feed_split(data, cuts, OpenAIStreamParser())) == _strip_t(whole)
    # byte by byte
    assert _strip_t(_feed_split(data, list(range(1, len(data))), OpenAIStreamParser())) == _strip_t(whole)


def test_sse_capture_values() -> None:
    col = StreamCollector()
    col.add(_feed_split((SAMPLES / "sse_sample.txt").read_bytes(), [], OpenAIStreamParser()))
    assert col.done
    # prompt_tokens_details.cached_tokens: 7 of the 35 prompt tokens came from llama-server's prompt cache
    assert col.usage == Usage(col.usage.t, 35, 22, None, 7) if col.usage else False
    assert col.timings is not None
    assert col.timings.predicted_n == 22
    assert col.timings.predicted_ms == pytest.approx(191.11)
    assert col.timings.prompt_n == 28
    assert col.finish_reason == "stop"
    assert len(col.deltas) == 21  # 21 content chunks; role-only and finish chunks are not token events
    assert col.text.startswith("The primary colors are:")
    assert all(d.phase == "output" and d.chars > 0 for d in col.deltas)


def test_sse_capture_without_usage_has_timings_on_last_content_chunk() -> None:
    col = StreamCollector()
    col.add(_feed_split((SAMPLES / "sse_sample_no_include_usage.txt").read_bytes(), [], OpenAIStreamParser()))
    assert col.usage is None
    assert col.timings is not None and col.timings.predicted_n == 22
    assert col.timings.predicted_ms == pytest.approx(201.44)
    assert col.finish_reason == "stop"
    assert len(col.deltas) == 21


def test_chat_nonstream_capture() -> None:
    obj = json.loads((SAMPLES / "chat_nonstream.json").read_text())
    col = StreamCollector()
    col.add(parse_chat_completion(obj, 1.5))
    assert col.usage is not None and col.usage.completion_tokens == 42 and col.usage.prompt_tokens == 25
    assert col.timings is not None and col.timings.predicted_n == 42
    assert col.timings.predicted_ms == pytest.approx(397.311)
    assert col.text.startswith("The primary colors are:")
    assert col.finish_reason == "stop"


def test_completion_native_capture_timings() -> None:
    obj = json.loads((SAMPLES / "completion_native.json").read_text())
    assert obj["timings"]["predicted_n"] == 24
    from tokwatch.figures.timing import llamacpp_engine_tps

    t = obj["timings"]
    assert llamacpp_engine_tps(
        t["predicted_n"], t["predicted_ms"], t["predicted_per_second"]
    ) == pytest.approx(72.20851306974086)
    # the server's figure is (n-1)/ms: the first token is sampled during prompt processing
    assert (t["predicted_n"] - 1) / (t["predicted_ms"] / 1000) == pytest.approx(t["predicted_per_second"])
    assert llamacpp_engine_tps(t["predicted_n"], t["predicted_ms"]) == pytest.approx(24 / 0.318522)


def _chunk(delta: dict, **extra: object) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta}], **extra}
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def test_sse_pings_comments_other_fields_and_crlf() -> None:
    p = OpenAIStreamParser()
    data = (
        b": ping\r\n\r\nevent: message\r\nid: 3\r\n"
        + _chunk({"content": "Hi"}).replace(b"\n", b"\r\n")
        + b":\n\n"
        + _chunk({"content": ""})
        + _chunk({"role": "assistant"})
        + b"data: [DONE]\n\n"
    )
    events = p.feed(data, 1.0)
    assert [type(e) for e in events] == [TextDelta, Done]
    assert events[0].text == "Hi" and p.done


def test_sse_several_events_in_one_read_and_split_event() -> None:
    p = OpenAIStreamParser()
    a, b = _chunk({"content": "A"}), _chunk({"content": "B"})
    first = p.feed(a + b[:7], 1.0)
    second = p.feed(b[7:], 2.0)
    assert [(e.text, e.t) for e in first] == [("A", 1.0)]
    assert [(e.text, e.t) for e in second] == [("B", 2.0)]


def test_sse_multiline_data_field_joined() -> None:
    dec = SseDecoder()
    assert dec.feed(b'data: {"a":\ndata: 1}\n\n', 0.5) == [(0.5, '{"a":\n1}')]


def test_invalid_utf8_is_a_bad_encoding_error() -> None:
    p = OpenAIStreamParser()
    raw = b'data: {"choices":[{"delta":{"content":"x\xff\xfey"}}]}\n\n'
    with pytest.raises(StreamProtocolError) as info:
        p.feed(raw, 1.0)
    assert info.value.error_class == "bad_encoding"
    with pytest.raises(StreamProtocolError, match="invalid UTF-8"):
        OllamaStreamParser().feed(b'{"response":"\xc3\x28","done":false}\n', 1.0)


def test_utf8_char_split_across_reads() -> None:
    p = OpenAIStreamParser()
    raw = _chunk({"content": "héllo"})
    i = raw.index("é".encode()) + 1
    assert p.feed(raw[:i], 1.0) == []
    (ev,) = p.feed(raw[i:], 2.0)
    assert ev.text == "héllo"


def test_error_object_after_200() -> None:
    p = OpenAIStreamParser()
    p.feed(_chunk({"content": "partial"}), 1.0)
    with pytest.raises(StreamProtocolError) as err:
        p.feed(b'data: {"error": {"message": "engine died", "code": 500}}\n\n', 2.0)
    assert err.value.error_class == "stream_error" and "engine died" in str(err.value)


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        (b"data: {not json\n\n", "malformed_json"),
        (b"data: [1,2]\n\n", "bad_shape"),
        (b'data: {"object": "x"}\n\n', "bad_shape"),
        (b'data: {"choices": [{"delta": {"content": 5}}]}\n\n', "bad_shape"),
    ],
)
def test_bad_payloads(payload: bytes, cls: str) -> None:
    with pytest.raises(StreamProtocolError) as err:
        OpenAIStreamParser().feed(payload, 0.0)
    assert err.value.error_class == cls


def test_reasoning_fields_and_phase() -> None:
    p = OpenAIStreamParser()
    evs = p.feed(
        _chunk({"reasoning_content": "hmm"}) + _chunk({"reasoning": "ok"}) + _chunk({"content": "A"}), 1.0
    )
    assert [(e.phase, e.text) for e in evs] == [("think", "hmm"), ("think", "ok"), ("output", "A")]


def test_think_tags_split_across_chunks_are_stripped() -> None:
    pieces = ["<th", "ink>Let", " me think</t", "hink>", "\n\nAns", "wer"]
    p = OpenAIStreamParser()
    events: list[StreamEvent] = []
    for i, piece in enumerate(pieces):
        events.extend(p.feed(_chunk({"content": piece}), float(i)))
    events.extend(p.close(9.0))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    think = "".join(d.text for d in deltas if d.phase == "think")
    out = "".join(d.text for d in deltas if d.phase == "output")
    assert think == "Let me think" and out == "\n\nAnswer"
    assert "<" not in think + out
    # the chunk that completes "</think>" is the last think event; the next chunk is the first output token
    assert [(d.t, d.phase) for d in deltas] == [
        (1.0, "think"),
        (2.0, "think"),
        (3.0, "think"),
        (4.0, "output"),
        (5.0, "output"),
    ]
    assert sum(d.chars for d in deltas) == sum(len(x) for x in pieces)


def test_think_splitter_flushes_a_lone_angle_bracket() -> None:
    s = ThinkTagSplitter()
    assert s.feed("a <") == [("output", "a ", 2)]
    assert s.feed("b") == [("output", "<b", 2)]
    assert s.feed("x<") == [("output", "x", 1)]
    assert s.flush() == [("output", "<", 1)]


def test_continuous_usage_gives_per_chunk_tokens() -> None:
    p = OpenAIStreamParser()
    data = (
        _chunk({"role": "assistant"}, usage={"prompt_tokens": 5, "completion_tokens": 0})
        + _chunk({"content": "ab"}, usage={"prompt_tokens": 5, "completion_tokens": 2})
        + _chunk({"content": "c"}, usage={"prompt_tokens": 5, "completion_tokens": 3})
        + b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\n'
    )
    deltas = [e for e in p.feed(data, 1.0) if isinstance(e, TextDelta)]
    assert [d.chunk_tokens for d in deltas] == [2, 1]


def test_ollama_ndjson_stream_and_final() -> None:
    lines = [
        {"message": {"role": "assistant", "content": "", "thinking": "hmm"}, "done": False},
        {"message": {"role": "assistant", "content": "Hi"}, "done": False},
        {
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "length",
            "eval_count": 2,
            "eval_duration": 50_000_000,
            "total_duration": 90_000_000,
            "load_duration": 1000,
            "prompt_eval_count": 7,
            "prompt_eval_duration": 20_000_000,
        },
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    whole = _feed_split(data, [], OllamaStreamParser())
    for cut in range(1, len(data)):
        assert _strip_t(_feed_split(data, [cut], OllamaStreamParser())) == _strip_t(whole)
    col = StreamCollector()
    col.add(whole)
    assert [(d.phase, d.text) for d in col.deltas] == [("think", "hmm"), ("output", "Hi")]
    assert col.ollama == OllamaFinal(col.ollama.t, 2, 50_000_000, 90_000_000, 1000, 7, 20_000_000, "length")
    assert col.finish_reason == "length" and col.done
    assert any(isinstance(e, Finish) for e in whole)


def test_ollama_generate_and_error_line() -> None:
    p = OllamaStreamParser()
    (ev,) = p.feed(b'{"response": "Hey", "done": false}\n', 1.0)
    assert isinstance(ev, TextDelta) and ev.text == "Hey"
    with pytest.raises(StreamProtocolError) as err:
        p.feed(b'{"error": "model not found"}\n', 2.0)
    assert err.value.error_class == "stream_error"
    with pytest.raises(StreamProtocolError) as err:
        OllamaStreamParser().feed(b'{"foo": 1}\n', 2.0)
    assert err.value.error_class == "bad_shape"


def test_llama_timings_event_type() -> None:
    data = (SAMPLES / "sse_sample.txt").read_bytes()
    events = _feed_split(data, [], OpenAIStreamParser())
    assert sum(isinstance(e, LlamaTimings) for e in events) == 1


@pytest.mark.parametrize("decoder", [SseDecoder, NdjsonDecoder])
def test_a_line_longer_than_the_bound_is_too_large_not_buffered(decoder: type) -> None:
    """A hostile 10 MB line is refused at MAX_LINE_BYTES instead of held up to the body's cap."""
    d = decoder()
    piece = b"x" * (64 * 1024)
    with pytest.raises(StreamProtocolError) as err:
        for _ in range(10 * 1024 * 1024 // len(piece)):
            d.feed(piece, 0.0)
    assert err.value.error_class == "too_large"
    d = decoder()
    with pytest.raises(StreamProtocolError):
        d.feed(b"data: " + b"y" * MAX_LINE_BYTES + b"\n\n", 0.0)
    assert decoder().feed(b"data: " + b"z" * 1000 + b"\n\n", 0.0)  # an ordinary line passes
