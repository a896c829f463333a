"""The Ollama dialect: NDJSON lines from /api/chat or /api/generate; the final `done` line has timings."""

from __future__ import annotations

from typing import Any

from tokwatch.streams.events import AnswerModel, Finish, OllamaFinal, StreamEvent, StreamProtocolError
from tokwatch.streams.framing import NdjsonDecoder
from tokwatch.streams.payload import error_text, int_field, loads_json, str_field
from tokwatch.streams.think import ThinkTagSplitter, flushed_deltas, text_deltas


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
        out.extend(flushed_deltas(self._think, t, self._chunk + 1))
        return out

    def parse_object(self, obj: Any, t: float) -> list[StreamEvent]:
        """Events from one Ollama JSON object (a stream line or a whole non-streamed answer)."""
        self._chunk += 1
        if not isinstance(obj, dict):
            raise StreamProtocolError("bad_shape", f"Ollama line is {type(obj).__name__}, expected an object")
        if "error" in obj:
            raise StreamProtocolError("stream_error", f"error from Ollama: {error_text(obj['error'])}")
        message = obj.get("message")
        if message is not None:
            if not isinstance(message, dict):
                raise StreamProtocolError("bad_shape", "message is not an object")
            content = str_field(message, "content", "message")
            thinking = str_field(message, "thinking", "message")
        elif "response" in obj or "thinking" in obj:
            content = str_field(obj, "response", "(line)")
            thinking = str_field(obj, "thinking", "(line)")
        elif obj.get("done") is True:
            content = thinking = ""
        else:
            raise StreamProtocolError("bad_shape", "Ollama line has neither message, response nor done")
        out: list[StreamEvent] = []
        if not self._model_seen and isinstance(obj.get("model"), str):
            self._model_seen = True
            out.append(AnswerModel(t, obj["model"]))
        out.extend(text_deltas(t, thinking, content, self._think, None, self._chunk))
        if obj.get("done") is True:
            self.done = True
            out.extend(flushed_deltas(self._think, t, self._chunk))
            reason = obj.get("done_reason")
            out.append(
                OllamaFinal(
                    t,
                    eval_count=int_field(obj, "eval_count"),
                    eval_duration_ns=int_field(obj, "eval_duration"),
                    total_duration_ns=int_field(obj, "total_duration"),
                    load_duration_ns=int_field(obj, "load_duration"),
                    prompt_eval_count=int_field(obj, "prompt_eval_count"),
                    prompt_eval_duration_ns=int_field(obj, "prompt_eval_duration"),
                    done_reason=reason if isinstance(reason, str) else None,
                    prompt_eval_cached_count=int_field(obj, "prompt_eval_cached_count"),
                )
            )
            if isinstance(reason, str):
                out.append(Finish(t, reason))
        return out
