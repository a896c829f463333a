"""What every wire format provides to the shared responder: framing, chunks, final records, bodies."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from tokwatch.sim.context import SimRequest
from tokwatch.sim.faults import error_payload
from tokwatch.sim.generation import Chunk, Generation


def dumps(obj: Any) -> str:
    """Compact JSON, as vLLM, llama.cpp and Ollama write it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class Formatter(ABC):
    """One route's wire format (e.g. OpenAI chat, Ollama generate)."""

    stream_content_type = "text/event-stream; charset=utf-8"
    supports_pings = True

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.dialect = req.server.settings.dialect

    def frame(self, obj: Any) -> bytes:
        """One stream record: an SSE `data:` event."""
        return f"data: {dumps(obj)}\n\n".encode()

    def done(self) -> bytes | None:
        """The stream terminator, if the format has one."""
        return b"data: [DONE]\n\n"

    def ping(self) -> bytes:
        """An SSE comment line clients must skip."""
        return b": ping\n\n"

    def start(self) -> list[Any]:
        """Records sent before the first token."""
        return []

    @abstractmethod
    def chunk(self, chunk: Chunk) -> Any:
        """The record carrying `chunk`'s tokens."""

    @abstractmethod
    def finish(self, gen: Generation) -> list[Any]:
        """Records after the last token (finish, usage, timings)."""

    @abstractmethod
    def body(self, gen: Generation) -> Any:
        """The non-streamed response."""

    def wrong_shape(self) -> Any:
        """Valid JSON with a shape no client of this format expects."""
        return {"id": self.req.body_id, "object": "unexpected", "result": {"text": None}, "choices": "none"}

    def error_event(self, *, overloaded: bool = False) -> bytes:
        """The error record sent after HTTP 200 when generation fails (or the server is overloaded)
        mid-stream."""
        if overloaded:
            return self.frame(error_payload(self.dialect, 529, "Overloaded (simulated)."))
        return self.frame(error_payload(self.dialect, 500, "Generation failed mid-stream (simulated)."))

    def malformed(self) -> bytes:
        """A truncated record: the JSON never closes."""
        return b'data: {"id":"' + self.req.body_id.encode() + b'","choices":[{"delta":{"content":"\n\n'
