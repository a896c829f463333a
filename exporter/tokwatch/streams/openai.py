"""The OpenAI chat-completions dialect: streamed SSE chunks, and the non-streamed answer.

Spoken by OpenAI, vLLM, SGLang and llama.cpp; llama.cpp adds `timings`, vLLM per-chunk `usage`.
"""

from __future__ import annotations

from typing import Any

from tokwatch.streams.events import (
    AnswerModel,
    Done,
    Finish,
    LlamaTimings,
    StreamEvent,
    StreamProtocolError,
    Usage,
)
from tokwatch.streams.framing import SseDecoder
from tokwatch.streams.payload import error_text, float_field, int_field, loads_json, str_field
from tokwatch.streams.shape import ShapeMemory
from tokwatch.streams.think import ThinkTagSplitter, flushed_deltas, text_deltas


def _reasoning(obj: dict[str, Any], where: str) -> str:
    """Reasoning text under either name servers use (`reasoning_content`: vLLM/DeepSeek, `reasoning`)."""
    return str_field(obj, "reasoning_content", where) or str_field(obj, "reasoning", where)


def _usage(u: Any, t: float) -> Usage:
    if not isinstance(u, dict):
        raise StreamProtocolError("bad_shape", f"usage is {type(u).__name__}, expected an object")
    details = u.get("completion_tokens_details")
    reasoning = int_field(details, "reasoning_tokens") if isinstance(details, dict) else None
    prompt_details = u.get("prompt_tokens_details")
    cached = int_field(prompt_details, "cached_tokens") if isinstance(prompt_details, dict) else None
    return Usage(t, int_field(u, "prompt_tokens"), int_field(u, "completion_tokens"), reasoning, cached)


def _timings(d: Any, t: float) -> LlamaTimings | None:
    if not isinstance(d, dict):
        return None
    return LlamaTimings(
        t,
        int_field(d, "predicted_n"),
        float_field(d, "predicted_ms"),
        int_field(d, "prompt_n"),
        float_field(d, "prompt_ms"),
        float_field(d, "predicted_per_second"),
        int_field(d, "cache_n"),
        float_field(d, "prompt_per_second"),
    )


class OpenAIStreamParser:
    """SSE chat-completion chunks -> events (content, reasoning, usage, llama.cpp timings, finish, done)."""

    def __init__(self) -> None:
        self._sse = SseDecoder()
        self._think = ThinkTagSplitter()
        self._last_completion = 0  # cumulative completion_tokens at the last token event
        self._chunk = 0
        self._model_seen = False
        self.done = False
        self._shapes = ShapeMemory()  # the bytes around a plain chunk's text, to read the next ones unparsed

    def feed(self, data: bytes, t: float) -> list[StreamEvent]:
        """Parse one network read received at `t`."""
        out: list[StreamEvent] = []
        if self._sse.idle():
            contents = self._shapes.contents(data)
            if contents is not None:  # chunks of the learnt shape: what `_event` gives for each, unparsed
                for content in contents:
                    self._chunk += 1
                    out.extend(text_deltas(t, "", content, self._think, None, self._chunk))
                return out
        for et, payload in self._sse.feed(data, t):
            self._event(et, payload, out)
        return out

    def close(self, t: float) -> list[StreamEvent]:
        """End of body: flush a pending event and held-back text."""
        out: list[StreamEvent] = []
        for et, payload in self._sse.close(t):
            self._event(et, payload, out)
        out.extend(flushed_deltas(self._think, t, self._chunk + 1))
        return out

    def _event(self, t: float, payload: str, out: list[StreamEvent]) -> None:
        # Written for the per-chunk cost (one `get` per field, helpers only off the common shape); what each
        # payload yields is pinned by tests/streams/test_streams.py.
        if payload[:1] != "{" and payload.strip() == "[DONE]":
            self.done = True
            out.append(Done(t))
            return
        obj = loads_json(payload)
        self._chunk += 1
        if not isinstance(obj, dict):
            raise StreamProtocolError("bad_shape", f"chunk is {type(obj).__name__}, expected an object")
        if not self._model_seen:
            model = obj.get("model")
            if isinstance(model, str):
                self._model_seen = True
                out.append(AnswerModel(t, model))
        choices = obj.get("choices")
        if not choices and "error" in obj:
            raise StreamProtocolError("stream_error", f"error in stream: {error_text(obj['error'])}")
        if not isinstance(choices, list):
            raise StreamProtocolError("bad_shape", "stream chunk has no 'choices' list")
        raw_usage = obj.get("usage")
        usage = _usage(raw_usage, t) if raw_usage is not None else None
        finish: str | None = None
        if choices:  # tokwatch always asks for n=1
            choice = choices[0]
            if not isinstance(choice, dict):
                raise StreamProtocolError("bad_shape", "choices[0] is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise StreamProtocolError("bad_shape", "choices[0].delta is not an object")
            reasoning = (
                _reasoning(delta, "delta") if "reasoning_content" in delta or "reasoning" in delta else ""
            )
            content = delta.get("content")
            if type(content) is not str:
                content = str_field(delta, "content", "delta")  # "" when null; a clear error otherwise
            if reasoning or content:
                chunk_tokens = None
                if usage is not None and usage.completion_tokens is not None:
                    chunk_tokens = max(0, usage.completion_tokens - self._last_completion)
                    self._last_completion = usage.completion_tokens
                out.extend(text_deltas(t, reasoning, content, self._think, chunk_tokens, self._chunk))
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                finish = reason
            elif content and not reasoning and usage is None and "timings" not in obj and "role" not in delta:
                # a chunk that yields only its text (a role comes once: its chunk's shape does not repeat)
                self._shapes.learn(payload, obj, content)
        if usage is not None:
            out.append(usage)
        if finish is not None:
            out.append(Finish(t, finish))
        raw_timings = obj.get("timings")
        if raw_timings is not None:
            timings = _timings(raw_timings, t)
            if timings is not None:
                out.append(timings)


def parse_chat_completion(obj: Any, t: float) -> list[StreamEvent]:
    """Events from a non-streamed /v1/chat/completions answer received at `t`."""
    if not isinstance(obj, dict):
        raise StreamProtocolError("bad_shape", f"response is {type(obj).__name__}, expected an object")
    if "error" in obj and not obj.get("choices"):
        raise StreamProtocolError("stream_error", f"error in response: {error_text(obj['error'])}")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise StreamProtocolError("bad_shape", "response has no choices[0] object")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise StreamProtocolError("bad_shape", "choices[0].message is not an object")
    reasoning = _reasoning(message, "message")
    content = str_field(message, "content", "message")
    think = ThinkTagSplitter()
    out: list[StreamEvent] = [AnswerModel(t, obj["model"])] if isinstance(obj.get("model"), str) else []
    out.extend(text_deltas(t, reasoning, content, think, None, 0))
    out.extend(flushed_deltas(think, t, 0))
    if obj.get("usage") is not None:
        out.append(_usage(obj["usage"], t))
    if isinstance(choices[0].get("finish_reason"), str):
        out.append(Finish(t, choices[0]["finish_reason"]))
    timings = _timings(obj.get("timings"), t)
    if timings is not None:
        out.append(timings)
    return out
