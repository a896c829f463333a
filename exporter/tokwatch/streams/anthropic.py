"""The Anthropic Messages dialect: streamed SSE events (`message_start`, `content_block_*`, `message_delta`,
`message_stop`, `ping`, `error`) and the non-streamed message.

Text deltas are the output phase and thinking deltas the reasoning phase; signatures, pings and block
boundaries carry no token. Usage: `input_tokens` leaves out the prompt tokens read from or written to the
prompt cache, so the prompt is the sum of the three counts and the cached prompt tokens are
`cache_read_input_tokens` (written ones were computed: they are prefill, not cache). `output_tokens`
counts thinking and text together and is final on `message_delta`.
"""

from __future__ import annotations

from typing import Any

from tokwatch.figures.result import Phase
from tokwatch.streams.events import (
    AnswerModel,
    Done,
    Finish,
    ProtocolErrorClass,
    StreamEvent,
    StreamProtocolError,
    TextDelta,
    Usage,
)
from tokwatch.streams.framing import SseDecoder
from tokwatch.streams.payload import error_text, int_field, loads_json, str_field

# Anthropic's error types, as what they mean for a run (tokwatch.probes.status maps the classes to statuses).
_ERROR_CLASSES: dict[str, ProtocolErrorClass] = {
    "overloaded_error": "overloaded",
    "rate_limit_error": "rate_limit",
    "authentication_error": "auth_error",
    "permission_error": "auth_error",
}


def stream_error(err: Any, where: str) -> StreamProtocolError:
    """An `error` event or error answer as the protocol error its type means (`api_error`: stream_error)."""
    kind = err.get("type") if isinstance(err, dict) else None
    error_class = _ERROR_CLASSES.get(kind, "stream_error") if isinstance(kind, str) else "stream_error"
    return StreamProtocolError(error_class, f"error in {where}: {error_text(err)}")


class _UsageCounts:
    """The usage counts as they arrive: `message_start` gives the prompt's, `message_delta` the output's
    (and, in newer API versions, the prompt's again)."""

    def __init__(self) -> None:
        self.input: int | None = None
        self.cache_read: int | None = None
        self.cache_creation: int | None = None
        self.output: int | None = None

    def update(self, usage: Any, *, final: bool) -> None:
        if not isinstance(usage, dict):
            raise StreamProtocolError("bad_shape", f"usage is {type(usage).__name__}, expected an object")
        for attr, key in (
            ("input", "input_tokens"),
            ("cache_read", "cache_read_input_tokens"),
            ("cache_creation", "cache_creation_input_tokens"),
        ):
            value = int_field(usage, key)
            if value is not None:
                setattr(self, attr, value)
        if final:
            self.output = int_field(usage, "output_tokens")

    def event(self, t: float) -> Usage:
        prompt = None
        if self.input is not None:
            prompt = self.input + (self.cache_read or 0) + (self.cache_creation or 0)
        return Usage(t, prompt, self.output, None, self.cache_read)


class AnthropicStreamParser:
    """SSE Messages events -> events (thinking and text deltas, usage, stop reason, done)."""

    def __init__(self) -> None:
        self._sse = SseDecoder()
        self._usage = _UsageCounts()
        self._chunk = 0
        self.done = False

    def feed(self, data: bytes, t: float) -> list[StreamEvent]:
        """Parse one network read received at `t`."""
        out: list[StreamEvent] = []
        for et, payload in self._sse.feed(data, t):
            self._event(et, payload, out)
        return out

    def close(self, t: float) -> list[StreamEvent]:
        """End of body: a final event without its blank line still counts."""
        out: list[StreamEvent] = []
        for et, payload in self._sse.close(t):
            self._event(et, payload, out)
        return out

    def _event(self, t: float, payload: str, out: list[StreamEvent]) -> None:
        obj = loads_json(payload)
        if not isinstance(obj, dict):
            raise StreamProtocolError("bad_shape", f"event is {type(obj).__name__}, expected an object")
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                raise StreamProtocolError("bad_shape", "content_block_delta has no delta object")
            dtype = delta.get("type")
            phase: Phase
            if dtype == "text_delta":
                text, phase = str_field(delta, "text", "delta"), "output"
            elif dtype == "thinking_delta":
                text, phase = str_field(delta, "thinking", "delta"), "think"
            else:  # signature_delta, input_json_delta, citations: no generated text
                return
            if text:
                self._chunk += 1
                out.append(TextDelta(t, text, phase, len(text), None, self._chunk))
        elif kind == "message_start":
            message = obj.get("message")
            if not isinstance(message, dict):
                raise StreamProtocolError("bad_shape", "message_start has no message object")
            if isinstance(message.get("model"), str):
                out.append(AnswerModel(t, message["model"]))
            if message.get("usage") is not None:
                self._usage.update(message["usage"], final=False)
                out.append(self._usage.event(t))
        elif kind == "message_delta":
            if obj.get("usage") is not None:
                self._usage.update(obj["usage"], final=True)
                out.append(self._usage.event(t))
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                out.append(Finish(t, delta["stop_reason"]))
        elif kind == "message_stop":
            self.done = True
            out.append(Done(t))
        elif kind == "error":
            raise stream_error(obj.get("error"), "stream")
        elif not isinstance(kind, str):
            raise StreamProtocolError("bad_shape", "event has no 'type'")
        # ping, content_block_start/stop and event types added after this parser was written carry no token
        # (Anthropic asks clients to ignore unknown events).


def parse_message(obj: Any, t: float) -> list[StreamEvent]:
    """Events from a non-streamed Messages answer received at `t`."""
    if not isinstance(obj, dict):
        raise StreamProtocolError("bad_shape", f"response is {type(obj).__name__}, expected an object")
    if obj.get("type") == "error" or ("error" in obj and "content" not in obj):
        raise stream_error(obj.get("error"), "response")
    content = obj.get("content")
    if not isinstance(content, list):
        raise StreamProtocolError("bad_shape", "response has no content list")
    out: list[StreamEvent] = [AnswerModel(t, obj["model"])] if isinstance(obj.get("model"), str) else []
    for block in content:
        if not isinstance(block, dict):
            raise StreamProtocolError("bad_shape", "a content block is not an object")
        phase: Phase
        if block.get("type") == "thinking":
            text, phase = str_field(block, "thinking", "content"), "think"
        elif block.get("type") == "text":
            text, phase = str_field(block, "text", "content"), "output"
        else:
            continue
        if text:
            out.append(TextDelta(t, text, phase, len(text), None, 0))
    if obj.get("usage") is not None:
        counts = _UsageCounts()
        counts.update(obj["usage"], final=True)
        out.append(counts.event(t))
    if isinstance(obj.get("stop_reason"), str):
        out.append(Finish(t, obj["stop_reason"]))
    return out
