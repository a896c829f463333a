"""Incremental parsers for streamed LLM answers: OpenAI-style SSE and Ollama NDJSON.

Parsers are fed `(receive time, bytes)` pieces as they arrive (from `HttpClient` or any other source) and
return typed events immediately; they never buffer more than one unfinished line. Payload problems raise
`StreamProtocolError` with an `error_class` from the status vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from tokwatch.result import Phase
from tokwatch.timing import apportion

ProtocolErrorClass = Literal["malformed_json", "bad_shape", "stream_error", "bad_encoding", "not_json"]
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_MAX_ERROR_TEXT = 300


class StreamProtocolError(Exception):
    """The server answered, but the payload is malformed, mis-shaped or carries an error object."""

    def __init__(self, error_class: ProtocolErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class: ProtocolErrorClass = error_class


# --- events --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Generated text from one chunk. `t` is the absolute perf_counter receive time.

    `chars` counts every generated character, including stripped `<think>` tags (so a tag-only chunk is a
    token event with empty `text`); `chunk_tokens` is the token count the server reported for this part.
    A chunk whose text spans both phases yields one delta per phase, all with the same `chunk` number.
    """

    t: float
    text: str
    phase: Phase
    chars: int
    chunk_tokens: int | None = None
    chunk: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """A `usage` object (final chunk with include_usage, or every chunk with continuous usage stats)."""

    t: float
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens: prompt served from cache


@dataclass(frozen=True, slots=True)
class LlamaTimings:
    """llama.cpp `timings` (milliseconds as sent by the server)."""

    t: float
    predicted_n: int | None
    predicted_ms: float | None
    prompt_n: int | None  # prompt tokens evaluated (llama-server leaves the cached ones out)
    prompt_ms: float | None
    predicted_per_second: float | None = None
    cache_n: int | None = None  # prompt tokens reused from the slot's cache


@dataclass(frozen=True, slots=True)
class OllamaFinal:
    """Ollama's last (`done: true`) object; durations in nanoseconds as sent."""

    t: float
    eval_count: int | None
    eval_duration_ns: int | None
    total_duration_ns: int | None
    load_duration_ns: int | None
    prompt_eval_count: int | None
    prompt_eval_duration_ns: int | None
    done_reason: str | None


@dataclass(frozen=True, slots=True)
class AnswerModel:
    """The `model` an answer says produced it (first chunk that names one)."""

    t: float
    name: str


@dataclass(frozen=True, slots=True)
class Finish:
    """A choice's `finish_reason`."""

    t: float
    reason: str


@dataclass(frozen=True, slots=True)
class Done:
    """The SSE `data: [DONE]` terminator."""

    t: float


StreamEvent = TextDelta | Usage | LlamaTimings | OllamaFinal | Finish | Done | AnswerModel


# --- <think> tags ----------------------------------------------------------------------------------------


class ThinkTagSplitter:
    """Strips `<think>`/`</think>` from content and tracks the phase across chunk boundaries.

    A chunk ending in a possible tag prefix (e.g. `"<thi"`) holds those characters back until the next
    chunk decides; tags count as think-phase characters.
    """

    def __init__(self) -> None:
        self.phase: Phase = "output"
        self._held = ""

    def feed(self, text: str) -> list[tuple[Phase, str, int]]:
        """Split `text` into `(phase, visible text, generated chars)` segments."""
        if not self._held and "<" not in text:
            return [(self.phase, text, len(text))] if text else []  # fast path: no tag can start here
        buf = self._held + text
        self._held = ""
        out: list[tuple[Phase, str, int]] = []
        while buf:
            tag = THINK_OPEN if self.phase == "output" else THINK_CLOSE
            idx = buf.find(tag)
            if idx >= 0:
                if idx:
                    out.append((self.phase, buf[:idx], idx))
                out.append(("think", "", len(tag)))
                self.phase = "think" if tag == THINK_OPEN else "output"
                buf = buf[idx + len(tag) :]
                continue
            hold = _partial_suffix(buf, tag)
            if hold:
                self._held = buf[-hold:]
                buf = buf[:-hold]
            if buf:
                out.append((self.phase, buf, len(buf)))
            break
        return _merge(out)

    def flush(self) -> list[tuple[Phase, str, int]]:
        """Release held-back characters at the end of the stream."""
        held, self._held = self._held, ""
        return [(self.phase, held, len(held))] if held else []


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `buf` ends with."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0


def _merge(segs: list[tuple[Phase, str, int]]) -> list[tuple[Phase, str, int]]:
    """Join adjacent segments of one phase so a chunk yields at most one event per phase change."""
    merged: list[tuple[Phase, str, int]] = []
    for phase, text, chars in segs:
        if merged and merged[-1][0] == phase:
            p, t, c = merged[-1]
            merged[-1] = (p, t + text, c + chars)
        else:
            merged.append((phase, text, chars))
    return merged


# --- line framing --------------------------------------------------------------------------------------


class SseDecoder:
    """Bytes -> SSE `data` payloads; tolerant of comments/pings, other fields, CRLF and any split."""

    def __init__(self) -> None:
        self._buf = bytearray()  # the unfinished line; bytearray so appends are amortised O(1)
        self._data: list[str] = []

    def feed(self, data: bytes, t: float) -> list[tuple[float, str]]:
        """Feed one network read received at `t`; return the events it completed."""
        out: list[tuple[float, str]] = []
        if b"\n" not in data:  # a long line arriving in pieces: no rescan of what is already buffered
            self._buf += data
            return out
        buf = self._buf + data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            self._line(buf[start:nl], t, out)
            start = nl + 1
        self._buf = buf[start:]
        return out

    def close(self, t: float) -> list[tuple[float, str]]:
        """End of body: a final event without its blank line still counts."""
        out: list[tuple[float, str]] = []
        if self._buf:
            self._line(self._buf, t, out)
            self._buf = bytearray()
        if self._data:
            out.append((t, "\n".join(self._data)))
            self._data = []
        return out

    def _line(self, raw: bytes | bytearray, t: float, out: list[tuple[float, str]]) -> None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            if self._data:
                out.append((t, "\n".join(self._data)))
                self._data = []
            return
        if raw.startswith(b":"):
            return  # comment / keep-alive ping
        name, _, value = raw.partition(b":")
        if name != b"data":
            return
        if value.startswith(b" "):
            value = value[1:]
        self._data.append(decode_utf8(value))


class NdjsonDecoder:
    """Bytes -> complete lines (one JSON document each), blank lines skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes, t: float) -> list[tuple[float, str]]:
        """Feed one network read received at `t`; return the lines it completed."""
        if b"\n" not in data:
            self._buf += data
            return []
        *lines, self._buf = (self._buf + data).split(b"\n")
        return [(t, s) for s in (decode_utf8(ln).strip() for ln in lines) if s]

    def close(self, t: float) -> list[tuple[float, str]]:
        """End of body: an unterminated last line still counts."""
        rest, self._buf = decode_utf8(self._buf).strip(), bytearray()
        return [(t, rest)] if rest else []


# --- payload helpers -----------------------------------------------------------------------------------


def decode_utf8(raw: bytes | bytearray) -> str:
    """Strict UTF-8: an answer with invalid bytes is garbage, not text with replacement characters.

    Lines are split at newlines before decoding, so a multi-byte character is never cut in two here.
    """
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StreamProtocolError(
            "bad_encoding", f"invalid UTF-8 at byte {exc.start} of a {len(raw)}-byte line"
        ) from None


def loads_json(text: str) -> Any:
    """json.loads raising StreamProtocolError('malformed_json') with a short excerpt."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StreamProtocolError("malformed_json", f"invalid JSON ({exc.msg}): {text[:120]!r}") from None


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or json.dumps(err)[:_MAX_ERROR_TEXT]
        code = err.get("code") or err.get("type")
        return f"{msg} ({code})" if code else str(msg)
    return str(err)[:_MAX_ERROR_TEXT]


def _int(obj: dict[str, Any], key: str) -> int | None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return int(v)


def _float(obj: dict[str, Any], key: str) -> float | None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _str_field(obj: dict[str, Any], key: str, where: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise StreamProtocolError("bad_shape", f"{where}.{key} is {type(v).__name__}, expected a string")
    return v


def _reasoning(obj: dict[str, Any], where: str) -> str:
    """Reasoning text under either name servers use (`reasoning_content`: vLLM/DeepSeek, `reasoning`)."""
    return _str_field(obj, "reasoning_content", where) or _str_field(obj, "reasoning", where)


def _usage(u: Any, t: float) -> Usage:
    if not isinstance(u, dict):
        raise StreamProtocolError("bad_shape", f"usage is {type(u).__name__}, expected an object")
    details = u.get("completion_tokens_details")
    reasoning = _int(details, "reasoning_tokens") if isinstance(details, dict) else None
    prompt_details = u.get("prompt_tokens_details")
    cached = _int(prompt_details, "cached_tokens") if isinstance(prompt_details, dict) else None
    return Usage(t, _int(u, "prompt_tokens"), _int(u, "completion_tokens"), reasoning, cached)


def _timings(d: Any, t: float) -> LlamaTimings | None:
    if not isinstance(d, dict):
        return None
    return LlamaTimings(
        t,
        _int(d, "predicted_n"),
        _float(d, "predicted_ms"),
        _int(d, "prompt_n"),
        _float(d, "prompt_ms"),
        _float(d, "predicted_per_second"),
        _int(d, "cache_n"),
    )


def _deltas(
    t: float, reasoning: str, content: str, think: ThinkTagSplitter, chunk_tokens: int | None, chunk: int
) -> list[TextDelta]:
    segs: list[tuple[Phase, str, int]] = [("think", reasoning, len(reasoning))] if reasoning else []
    if content:
        segs.extend(think.feed(content))
    segs = _merge([s for s in segs if s[2] > 0])
    if chunk_tokens is None or not segs:
        return [TextDelta(t, text, phase, chars, None, chunk) for phase, text, chars in segs]
    shares = apportion(chunk_tokens, [c for _, _, c in segs], at_least_one=False)
    return [TextDelta(t, text, ph, c, n, chunk) for (ph, text, c), n in zip(segs, shares, strict=True)]


def _flushed(think: ThinkTagSplitter, t: float, chunk: int) -> list[TextDelta]:
    return [TextDelta(t, text, ph, c, None, chunk) for ph, text, c in think.flush()]


# --- OpenAI-style ----------------------------------------------------------------------------------------


class OpenAIStreamParser:
    """SSE chat-completion chunks -> events (content, reasoning, usage, llama.cpp timings, finish, done)."""

    def __init__(self) -> None:
        self._sse = SseDecoder()
        self._think = ThinkTagSplitter()
        self._last_completion = 0  # cumulative completion_tokens at the last token event
        self._chunk = 0
        self._model_seen = False
        self.done = False

    def feed(self, data: bytes, t: float) -> list[StreamEvent]:
        """Parse one network read received at `t`."""
        out: list[StreamEvent] = []
        for et, payload in self._sse.feed(data, t):
            self._event(et, payload, out)
        return out

    def close(self, t: float) -> list[StreamEvent]:
        """End of body: flush a pending event and held-back text."""
        out: list[StreamEvent] = []
        for et, payload in self._sse.close(t):
            self._event(et, payload, out)
        out.extend(_flushed(self._think, t, self._chunk + 1))
        return out

    def _event(self, t: float, payload: str, out: list[StreamEvent]) -> None:
        if payload.strip() == "[DONE]":
            self.done = True
            out.append(Done(t))
            return
        obj = loads_json(payload)
        self._chunk += 1
        if not isinstance(obj, dict):
            raise StreamProtocolError("bad_shape", f"chunk is {type(obj).__name__}, expected an object")
        if not self._model_seen and isinstance(obj.get("model"), str):
            self._model_seen = True
            out.append(AnswerModel(t, obj["model"]))
        if "error" in obj and not obj.get("choices"):
            raise StreamProtocolError("stream_error", f"error in stream: {_error_text(obj['error'])}")
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise StreamProtocolError("bad_shape", "stream chunk has no 'choices' list")
        usage = _usage(obj["usage"], t) if obj.get("usage") is not None else None
        finish: str | None = None
        for choice in choices[:1]:  # tokwatch always asks for n=1
            if not isinstance(choice, dict):
                raise StreamProtocolError("bad_shape", "choices[0] is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise StreamProtocolError("bad_shape", "choices[0].delta is not an object")
            reasoning = _reasoning(delta, "delta")
            content = _str_field(delta, "content", "delta")
            chunk_tokens = None
            if usage is not None and usage.completion_tokens is not None and (reasoning or content):
                chunk_tokens = max(0, usage.completion_tokens - self._last_completion)
                self._last_completion = usage.completion_tokens
            out.extend(_deltas(t, reasoning, content, self._think, chunk_tokens, self._chunk))
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
        if usage is not None:
            out.append(usage)
        if finish is not None:
            out.append(Finish(t, finish))
        timings = _timings(obj.get("timings"), t)
        if timings is not None:
            out.append(timings)


def parse_chat_completion(obj: Any, t: float) -> list[StreamEvent]:
    """Events from a non-streamed /v1/chat/completions answer received at `t`."""
    if not isinstance(obj, dict):
        raise StreamProtocolError("bad_shape", f"response is {type(obj).__name__}, expected an object")
    if "error" in obj and not obj.get("choices"):
        raise StreamProtocolError("stream_error", f"error in response: {_error_text(obj['error'])}")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise StreamProtocolError("bad_shape", "response has no choices[0] object")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise StreamProtocolError("bad_shape", "choices[0].message is not an object")
    reasoning = _reasoning(message, "message")
    content = _str_field(message, "content", "message")
    think = ThinkTagSplitter()
    out: list[StreamEvent] = [AnswerModel(t, obj["model"])] if isinstance(obj.get("model"), str) else []
    out.extend(_deltas(t, reasoning, content, think, None, 0))
    out.extend(_flushed(think, t, 0))
    if obj.get("usage") is not None:
        out.append(_usage(obj["usage"], t))
    if isinstance(choices[0].get("finish_reason"), str):
        out.append(Finish(t, choices[0]["finish_reason"]))
    timings = _timings(obj.get("timings"), t)
    if timings is not None:
        out.append(timings)
    return out


# --- Ollama ----------------------------------------------------------------------------------------------


class OllamaStreamParser:
    """Ollama NDJSON (/api/chat or /api/generate) -> events; the final `done` line gives server timings."""

    def __init__(self) -> None:
        self._lines = NdjsonDecoder()
        self._think = ThinkTagSplitter()
        self._chunk = 0
        self._model_seen = False
        self.done = False

    def feed(self, data: bytes, t: float) -> list[StreamEvent]:
        """Parse one network read received at `t`."""
        out: list[StreamEvent] = []
        for lt, line in self._lines.feed(data, t):
            out.extend(self.parse_object(loads_json(line), lt))
        return out

    def close(self, t: float) -> list[StreamEvent]:
        """End of body: parse an unterminated last line, flush held-back text."""
        out: list[StreamEvent] = []
        for lt, line in self._lines.close(t):
            out.extend(self.parse_object(loads_json(line), lt))
        out.extend(_flushed(self._think, t, self._chunk + 1))
        return out

    def parse_object(self, obj: Any, t: float) -> list[StreamEvent]:
        """Events from one Ollama JSON object (a stream line or a whole non-streamed answer)."""
        self._chunk += 1
        if not isinstance(obj, dict):
            raise StreamProtocolError("bad_shape", f"Ollama line is {type(obj).__name__}, expected an object")
        if "error" in obj:
            raise StreamProtocolError("stream_error", f"error from Ollama: {_error_text(obj['error'])}")
        message = obj.get("message")
        if message is not None:
            if not isinstance(message, dict):
                raise StreamProtocolError("bad_shape", "message is not an object")
            content = _str_field(message, "content", "message")
            thinking = _str_field(message, "thinking", "message")
        elif "response" in obj or "thinking" in obj:
            content = _str_field(obj, "response", "(line)")
            thinking = _str_field(obj, "thinking", "(line)")
        elif obj.get("done") is True:
            content = thinking = ""
        else:
            raise StreamProtocolError("bad_shape", "Ollama line has neither message, response nor done")
        out: list[StreamEvent] = []
        if not self._model_seen and isinstance(obj.get("model"), str):
            self._model_seen = True
            out.append(AnswerModel(t, obj["model"]))
        out.extend(_deltas(t, thinking, content, self._think, None, self._chunk))
        if obj.get("done") is True:
            self.done = True
            out.extend(_flushed(self._think, t, self._chunk))
            reason = obj.get("done_reason")
            out.append(
                OllamaFinal(
                    t,
                    eval_count=_int(obj, "eval_count"),
                    eval_duration_ns=_int(obj, "eval_duration"),
                    total_duration_ns=_int(obj, "total_duration"),
                    load_duration_ns=_int(obj, "load_duration"),
                    prompt_eval_count=_int(obj, "prompt_eval_count"),
                    prompt_eval_duration_ns=_int(obj, "prompt_eval_duration"),
                    done_reason=reason if isinstance(reason, str) else None,
                )
            )
            if isinstance(reason, str):
                out.append(Finish(t, reason))
        return out


# --- collecting ------------------------------------------------------------------------------------------


@dataclass
class StreamCollector:
    """Accumulates the events of one answer for the timing math (probe- and benchmark-agnostic)."""

    deltas: list[TextDelta] = field(default_factory=list)
    usage: Usage | None = None
    timings: LlamaTimings | None = None
    ollama: OllamaFinal | None = None
    finish_reason: str | None = None
    done: bool = False
    chunk_usage: bool = False  # usage arrived on content chunks (vLLM continuous_usage_stats)
    model: str | None = None  # what the answer says produced it
    events: int = 0  # every event parsed: an answer with none was not the protocol spoken
    merged_reads: int = 0  # reads (add() calls) that carried two or more content chunks

    def add(self, events: Iterable[StreamEvent]) -> None:
        """Record the events of one read in arrival order (call once per read: merged reads are counted)."""
        chunks = set()
        for ev in events:
            self.events += 1
            if isinstance(ev, TextDelta):
                self.deltas.append(ev)
                chunks.add(ev.chunk)
                if ev.chunk_tokens is not None:
                    self.chunk_usage = True
            elif isinstance(ev, Usage):
                self.usage = ev
            elif isinstance(ev, LlamaTimings):
                self.timings = ev
            elif isinstance(ev, OllamaFinal):
                self.ollama = ev
                self.done = True
            elif isinstance(ev, Finish):
                self.finish_reason = ev.reason
            elif isinstance(ev, Done):
                self.done = True
            elif isinstance(ev, AnswerModel):
                self.model = ev.name
        if len(chunks) > 1:
            self.merged_reads += 1

    @property
    def text(self) -> str:
        """The visible output text."""
        return "".join(d.text for d in self.deltas if d.phase == "output")
