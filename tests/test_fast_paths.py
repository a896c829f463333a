"""Every shortcut on the per-chunk and per-request path gives exactly what the general path gives.

Each fast path (SSE framing of a whole one-line event, json.loads' scanner called directly, a read of the
stream's learnt chunk shape taken without parsing, a plain content chunk's delta, one delta per chunk in the
token counts, one token per chunk in the gaps, the output gaps of a stream without think tokens) is compared
with the general code on the real captures in tests/data and on generated edge cases.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tokwatch.bench.client import Deadlines, _fill_figures
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.figures import timing
from tokwatch.figures.result import TokenEvent
from tokwatch.probes.exchange import Exchange, fill_figures
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.streams.collector import StreamCollector
from tokwatch.streams.events import StreamEvent, StreamProtocolError, TextDelta
from tokwatch.streams.framing import SseDecoder
from tokwatch.streams.openai import OpenAIStreamParser
from tokwatch.streams.payload import loads_json
from tokwatch.streams.shape import ShapeMemory
from tokwatch.streams.think import ThinkTagSplitter, general_text_deltas, text_deltas

SAMPLES = Path(__file__).resolve().parent / "data"
CAPTURES = ["sse_sample.txt", "sse_sample_no_include_usage.txt"]


def _events_of(data: bytes) -> list[bytes]:
    """A capture cut into its SSE events (what a server writes one read at a time)."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]


class _NoShapes(ShapeMemory):
    """Learns nothing: every chunk is parsed."""

    def learn(self, payload: str, obj: dict[str, Any], content: str) -> None:
        return None


def _general_parser() -> OpenAIStreamParser:
    p = OpenAIStreamParser()
    p._sse.feed = p._sse.feed_lines  # type: ignore[method-assign]  # every read through the line machinery
    p._shapes = _NoShapes()
    return p


def _parse(parser: OpenAIStreamParser, reads: list[bytes]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for i, data in enumerate(reads):
        out.extend(parser.feed(data, float(i)))
    out.extend(parser.close(float(len(reads))))
    return out


# --- SSE framing --------------------------------------------------------------------------------------------

SSE_PIECES = [
    b'data: {"a": 1}\n\n',
    b"data: \n\n",
    b"data:x\n\n",
    b"data: [DONE]\n\n",
    b"data: a\r\n\r\n",
    b"data: a\r\n\n",
    b"data: two\ndata: lines\n\n",
    b": ping\n\n",
    b"event: message\ndata: e\n\n",
    b"data: caf\xc3\xa9\n\n",
    b"data: a\rb\n\n",
    b"data: no end",
    b"\n\n",
    b"da",
    b"ta: split\n",
    b"\n",
]


@pytest.mark.parametrize("seed", range(40))
def test_sse_fast_path_equals_the_line_path_on_generated_reads(seed: int) -> None:
    rng = random.Random(seed)
    stream = b"".join(rng.choice(SSE_PIECES) for _ in range(30))
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 12))))
    reads = [stream[a:b] for a, b in itertools.pairwise([0, *cuts, len(stream)])]
    # whole pieces as reads too, so the fast path is taken often
    reads += [rng.choice(SSE_PIECES) for _ in range(10)]
    fast, general = SseDecoder(), SseDecoder()
    for i, data in enumerate(reads):
        assert fast.feed(data, float(i)) == general.feed_lines(data, float(i)), (seed, i, data)
    assert fast.close(99.0) == general.close(99.0)


def test_sse_fast_path_keeps_the_utf8_error() -> None:
    for decoder_feed in (SseDecoder().feed, SseDecoder().feed_lines):
        with pytest.raises(StreamProtocolError) as err:
            decoder_feed(b"data: \xff\xfe\n\n", 1.0)
        assert err.value.error_class == "bad_encoding"
        assert str(err.value) == "invalid UTF-8 at byte 0 of a 2-byte line"


@pytest.mark.parametrize("name", CAPTURES)
def test_parser_events_are_the_same_by_either_framing_path(name: str) -> None:
    reads = _events_of((SAMPLES / name).read_bytes())
    assert _parse(OpenAIStreamParser(), reads) == _parse(_general_parser(), reads)
    # and whole-capture reads, which take the line path anyway
    data = (SAMPLES / name).read_bytes()
    assert _parse(OpenAIStreamParser(), [data]) == _parse(_general_parser(), [data])


# --- the stream's chunk shape ------------------------------------------------------------------------------

# Texts that must not be taken from the bytes (quote, backslash, control byte, a second literal) next to
# texts that may (non-ASCII, tags, the learning probe's own text, U+2028); INVALID stands for bytes that are
# not UTF-8 once encoded.
INVALID = "@@invalid@@"
SHAPE_TEXTS = [
    "tok ",
    " the",
    "",
    '"',
    "a\\b",
    "a\nb",
    "\x01",
    "é",
    "日本",
    "<think>",
    "</think>",
    "<th",
    "tokwatch shape probe",
    'x", "content": "y',
    "\u2028",
    "}]}",
    INVALID,
]


def _vllm_chunk(content: str, created: int, style: int, **delta_extra: object) -> bytes:
    """One chunk as vLLM writes it; `style` picks the separators and the escaping (a server keeps its own)."""
    delta = {**delta_extra, "content": content}
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": created,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }
    text = json.dumps(obj, ensure_ascii=style & 1 == 1, separators=(",", ":") if style & 2 else None)
    return b"data: " + text.encode().replace(INVALID.encode(), b"\xff\xfe") + b"\n\n"


MORE_THAN_TEXT = {
    "reasoning": '{"choices":[{"index":0,"delta":{"reasoning_content":"why","content":"%s"}}]}',
    "usage": '{"choices":[{"index":0,"delta":{"content":"%s"}}],"usage":{"completion_tokens":3}}',
    "timings": '{"choices":[{"index":0,"delta":{"content":"%s"}}],"timings":{"predicted_n":3}}',
    "finish": '{"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":"stop"}]}',
    # the delta's text escaped, a plain text elsewhere under the same key: only the parse tells them apart
    "escaped text": '{"meta":{"content":"%s"},"choices":[{"index":0,"delta":{"content":"\\u0074ok"}}]}',
}


def _shape_stream(rng: random.Random) -> list[bytes]:
    """A stream of mostly plain chunks with every kind of chunk a shape must not swallow, in bursts."""
    created, style = 1700000000, rng.randrange(4)
    events: list[bytes] = []

    def text() -> str:
        return rng.choice(SHAPE_TEXTS[:3] * 4 + SHAPE_TEXTS)

    for _ in range(rng.randint(1, 25)):
        kind, reasoning = rng.random(), rng.choice([None, "", "why"])
        for _ in range(rng.randint(1, 4)):  # the same kind again: a shape learnt from it would be used
            if kind < 0.5:
                events.append(_vllm_chunk(text(), created, style))
            elif kind < 0.55:
                created += 1  # the bytes around the text change (llama.cpp's `created` each second)
            elif kind < 0.6:
                events.append(_vllm_chunk(text(), created, style, reasoning_content=reasoning))
            elif kind < 0.63:
                events.append(_vllm_chunk(text(), created, style, role="assistant"))
            elif kind < 0.66:
                events.append(b'data: {"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}\n\n')
            elif kind < 0.8:  # what only a parse yields besides the text, or an escaped text
                template = list(MORE_THAN_TEXT.values())[int(kind * 1000) % len(MORE_THAN_TEXT)]
                events.append(b"data: " + (template % text()).encode() + b"\n\n")
            elif kind < 0.84:
                events.append(b": ping\n\n")
            elif kind < 0.86:
                events.append(b"data: [DONE]\n\n")
            elif kind < 0.9:
                events.append(b'data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}\r\n\r\n')
            elif kind < 0.95:
                events.append(b"data: x\n")  # an event still open: the next read continues it
            else:
                events.append(b'data: {"choices":')  # a line still open
    return events


def _outcome(parser: OpenAIStreamParser, reads: list[bytes]) -> tuple[list[StreamEvent], str]:
    """The events of `reads` up to the first error, and that error's class and message."""
    out: list[StreamEvent] = []
    try:
        for i, data in enumerate(reads):
            out.extend(parser.feed(data, float(i)))
        out.extend(parser.close(float(len(reads))))
    except StreamProtocolError as exc:
        return out, f"{exc.error_class}: {exc}"
    return out, ""


@pytest.mark.parametrize("seed", range(60))
def test_chunk_shape_reads_give_what_parsing_gives(seed: int) -> None:
    rng = random.Random(seed)
    events = _shape_stream(rng)
    if seed % 3 == 0:  # reads cut anywhere and merged, as a busy client gets them
        stream = b"".join(events)
        cuts = sorted(rng.sample(range(1, len(stream)), max(0, min(len(stream) - 1, rng.randint(0, 20)))))
        reads = [stream[a:b] for a, b in itertools.pairwise([0, *cuts, len(stream)])]
    else:
        reads = events
    shaped = OpenAIStreamParser()
    assert _outcome(shaped, reads) == _outcome(_general_parser(), reads)


def test_chunk_shape_is_used_on_captures_and_plain_streams() -> None:
    for name in CAPTURES:
        reads = _events_of((SAMPLES / name).read_bytes())
        parser = OpenAIStreamParser()
        assert _parse(parser, reads) == _parse(_general_parser(), reads)
        plain = sum(b'"content":"' in r and b'"finish_reason":null' in r and b"\\" not in r for r in reads)
        assert parser._shapes.hits == plain - 1, name  # every unescaped text chunk after the first, unparsed
    texts = ["Hello", " wor", "ld", " é", "", "日本"]
    for style in range(4):
        events = [_vllm_chunk(t, 1, style) for t in texts]
        parser = OpenAIStreamParser()
        assert _parse(parser, events) == _parse(_general_parser(), events)
        # every event after the first (learnt from) but those the server escaped (" é" in ASCII styles)
        assert parser._shapes.hits == sum(b"\\" not in e for e in events[1:])
        # several whole events in one read, as a busy client reads them
        reads = [events[1] + events[0], events[2] + events[3] + events[0], events[5] + events[5]]
        parser = OpenAIStreamParser()
        assert _parse(parser, events[:1] + reads) == _parse(_general_parser(), events[:1] + reads)
        assert parser._shapes.hits == sum(r.count(b"\n\n") for r in reads if b"\\" not in r) > 0


@pytest.mark.parametrize("kind", MORE_THAN_TEXT)
def test_chunks_that_yield_more_than_their_text_are_always_parsed(kind: str) -> None:
    reads = [b"data: " + (MORE_THAN_TEXT[kind] % text).encode() + b"\n\n" for text in ["tok", "a", "b", "c"]]
    parser = OpenAIStreamParser()
    assert _parse(parser, reads) == _parse(_general_parser(), reads)
    assert parser._shapes.hits == 0


def test_a_shape_changing_every_chunk_costs_at_most_two_extra_parses() -> None:
    reads = [
        b'data: {"created":%d,"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n' % k for k in range(50)
    ]
    parser = OpenAIStreamParser()
    assert _parse(parser, reads) == _parse(_general_parser(), reads)
    assert (parser._shapes.hits, parser._shapes.learns) == (0, 2)


# --- JSON ---------------------------------------------------------------------------------------------------

JSON_CASES = [
    '{"a": 1}',
    ' {"a": 1}',
    '{"a": 1} ',
    '{"a": 1}\n',
    "\ufeff{}",
    "[1, 2]",
    "12",
    "-0.5e3",
    "NaN",
    '"text"',
    "null",
    "true",
    "{}",
    "",
    "{",
    '{"a": }',
    '{"a": 1} x',
    '{"a": 1}{"b": 2}',
    '{"s": "\\u00e9\\n"}',
    '{"deep": ' + "[" * 50 + "]" * 50 + "}",
]


@pytest.mark.parametrize("text", JSON_CASES)
def test_loads_json_equals_json_loads(text: str) -> None:
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(StreamProtocolError) as err:
            loads_json(text)
        assert err.value.error_class == "malformed_json"
        assert str(err.value) == f"invalid JSON ({exc.msg}): {text[:120]!r}"
        return
    got = loads_json(text)
    assert got == expected or (got != got and expected != expected)  # NaN is not equal to itself
    assert type(got) is type(expected)


@pytest.mark.parametrize("name", CAPTURES)
def test_loads_json_equals_json_loads_on_captures(name: str) -> None:
    for event in _events_of((SAMPLES / name).read_bytes()):
        payload = event.decode()[len("data: ") : -2]
        if payload != "[DONE]":
            assert loads_json(payload) == json.loads(payload)


# --- text deltas --------------------------------------------------------------------------------------------

TEXTS = ["", "tok ", "a<b", "<think>", "hm</think>ok", "<th", "ink>x", "</", "think>", "plain", "é"]


@pytest.mark.parametrize("seed", range(30))
def test_text_deltas_fast_path_equals_the_general_one(seed: int) -> None:
    rng = random.Random(seed)
    fast, general = ThinkTagSplitter(), ThinkTagSplitter()
    for chunk in range(40):
        reasoning = rng.choice(["", "", "", "why"])
        content = rng.choice(TEXTS)
        tokens = rng.choice([None, None, 0, 1, 3, -2])
        assert text_deltas(1.0, reasoning, content, fast, tokens, chunk) == general_text_deltas(
            1.0, reasoning, content, general, tokens, chunk
        ), (seed, chunk)
        assert (fast.phase, fast._held) == (general.phase, general._held)


# --- the collector ------------------------------------------------------------------------------------------


def _reference_add(col: dict[str, int], events: list[StreamEvent]) -> None:
    """The collector's merged-read and client-token accounting as the bench did it before (a set per read)."""
    chunks = {ev.chunk for ev in events if isinstance(ev, TextDelta)}
    col["merged"] += len(chunks) > 1
    col["tokens"] += sum((ev.chunk_tokens or 1) for ev in events if isinstance(ev, TextDelta))


@pytest.mark.parametrize("seed", range(10))
def test_collector_counts_equal_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    col, ref = StreamCollector(), {"merged": 0, "tokens": 0}
    chunk = 0
    for _ in range(60):
        events: list[StreamEvent] = []
        for _ in range(rng.randint(0, 4)):
            chunk += rng.randint(0, 1)
            for phase in rng.sample(["think", "output"], rng.randint(1, 2)):
                events.append(TextDelta(1.0, "x", phase, 1, rng.choice([None, 0, 2]), chunk))  # type: ignore[arg-type]
        col.add(events)
        _reference_add(ref, events)
        assert (col.merged_reads, col.client_tokens) == (ref["merged"], ref["tokens"])


# --- token counts and gaps ----------------------------------------------------------------------------------


def _reference_apportion(total: int, weights: list[int], *, at_least_one: bool = True) -> list[int]:
    """timing.apportion before its shortcuts (one weight; nothing left to split)."""
    n = len(weights)
    if n == 0:
        return []
    total = max(total, 0)
    base = 1 if at_least_one and total >= n else 0
    rest = total - base * n
    w = [max(x, 0) for x in weights]
    wsum = sum(w)
    if wsum == 0:
        w, wsum = [1] * n, n
    shares = [rest * x // wsum for x in w]
    remainders = [rest * x % wsum for x in w]
    left = rest - sum(shares)
    for i in sorted(range(n), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return [base + s for s in shares]


def test_apportion_equals_the_reference() -> None:
    rng = random.Random(3)
    for _ in range(3000):
        weights = [rng.choice([0, 0, 1, 3, 17, -2]) for _ in range(rng.randint(0, 6))]
        total = rng.randint(-2, 40)
        for flag in (True, False):
            assert timing.apportion(total, weights, at_least_one=flag) == _reference_apportion(
                total, weights, at_least_one=flag
            ), (total, weights, flag)


def _reference_gaps(events: list[TokenEvent]) -> list[float]:
    out: list[float] = []
    for i, e in enumerate(events):
        if i:
            out.append(e.t - events[i - 1].t)
        out.extend([0.0] * (e.tokens - 1))
    return out


def _deltas(rng: random.Random, n: int, spanning: bool) -> list[TextDelta]:
    out, t = [], 0.0
    for chunk in range(1, n + 1):
        t += rng.random() / 100
        phases = ["think", "output"] if spanning and rng.random() < 0.3 else [rng.choice(["think", "output"])]
        out += [TextDelta(t, "ab", p, rng.randint(0, 9), None, chunk) for p in phases]  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("seed", range(30))
def test_token_counts_of_one_delta_per_chunk_equal_the_grouped_path(seed: int) -> None:
    rng = random.Random(seed)
    deltas = _deltas(rng, rng.randint(1, 40), spanning=False)
    for total in (None, 0, len(deltas) - 1, len(deltas), len(deltas) + 7, 5 * len(deltas)):
        events, source = timing.token_events(deltas, 0.0, total, "usage")
        counts, expected_source = timing.chunk_token_counts(deltas, total, "usage")
        assert source == expected_source
        assert [(e.t, e.tokens, e.phase, e.chars) for e in events] == [
            (d.t, k, d.phase, d.chars) for d, k in zip(deltas, counts, strict=True) if k > 0
        ]


@pytest.mark.parametrize("seed", range(30))
def test_gaps_equal_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for spanning in (False, True):
        deltas = _deltas(rng, rng.randint(0, 30), spanning)
        total = rng.choice([None, len(deltas), 3 * len(deltas)])
        events, _ = timing.token_events(deltas, 0.0, total, "usage")
        assert timing.itl(events) == _reference_gaps(events)
        assert timing.output_itl(events) == _reference_gaps([e for e in events if e.phase == "output"])


# --- a request's figures ------------------------------------------------------------------------------------


def _figures_by_the_general_path(c: StreamCollector, sent_at: float, end: float) -> dict[str, object]:
    total = c.usage.completion_tokens if c.usage is not None else None
    if total is None and c.timings is not None:
        total = c.timings.predicted_n
    events, source = timing.token_events(c.deltas, sent_at, total, "usage" if c.usage else "engine")
    return {
        "tbt_s": _reference_gaps(events),
        "output_itl_s": _reference_gaps([e for e in events if e.phase == "output"]),
        "inter_chunk_s": [b.t - a.t for a, b in itertools.pairwise(events)],
        "ttft_s": timing.ttft(events),
        "chunks": len(events),
        "tokens_source": source,
    }


def _think_stream() -> bytes:
    parts = ["<think>", "Let me", " think", "</think>", "\n\nThe", " answer"]
    return b"".join(
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}).encode() + b"\n\n"
        for p in parts
    )


@pytest.mark.parametrize("source", [*CAPTURES, "think"])
def test_request_figures_equal_the_general_path(source: str) -> None:
    data = _think_stream() if source == "think" else (SAMPLES / source).read_bytes()
    reads = _events_of(data)
    collector = StreamCollector()
    parser = OpenAIStreamParser()
    for i, read in enumerate(reads):
        collector.add(parser.feed(read, 0.5 + 0.01 * i + 0.001 * (i % 3)))
    collector.add(parser.close(2.0))
    record = RequestRecord(1, "chat")
    ex = Exchange(sent_at=0.25, collector=copy.deepcopy(collector))
    fill_figures(ex, OpenAIProbe, 2.0)
    _fill_figures(record, ex, Deadlines(1.0, 0.05))
    expected = _figures_by_the_general_path(collector, 0.25, 2.0)
    assert {k: getattr(record, k) for k in expected} == expected
    assert record.think_tokens == (4 if source == "think" else 0)  # "<think>" to "</think>": 4 chunks
