"""Gathering one answer: the events of every read, in arrival order, for the timing math."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tokwatch.streams.events import (
    AnswerModel,
    Done,
    Finish,
    LlamaTimings,
    OllamaFinal,
    StreamEvent,
    TextDelta,
    Usage,
)


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
    client_tokens: int = 0  # tokens so far as the client counts them: each delta's chunk_tokens, else 1

    def add(self, events: Iterable[StreamEvent]) -> None:
        """Record the events of one read in arrival order (call once per read: merged reads are counted)."""
        first_chunk: int | None = None
        merged = False
        for ev in events:
            self.events += 1
            if isinstance(ev, TextDelta):
                self.deltas.append(ev)
                if ev.chunk_tokens is None:
                    self.client_tokens += 1
                else:
                    self.client_tokens += ev.chunk_tokens or 1
                    self.chunk_usage = True
                if first_chunk is None:
                    first_chunk = ev.chunk
                elif ev.chunk != first_chunk:
                    merged = True
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
        if merged:  # one read, two or more content chunks
            self.merged_reads += 1

    @property
    def text(self) -> str:
        """The visible output text."""
        return "".join(d.text for d in self.deltas if d.phase == "output")
