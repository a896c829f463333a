"""What a stream parser emits: typed events, the protocol error, and the interface every parser offers.

Parsers are fed `(receive time, bytes)` pieces as they arrive (from `HttpClient` or any other source) and
return these events immediately. Payload problems raise `StreamProtocolError` with an `error_class` from the
status vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tokwatch.figures.result import Phase

# `overloaded`, `rate_limit` and `auth_error`: an error the server reported in the stream (or in a 200 body)
# whose type says why (Anthropic's overloaded_error, rate_limit_error, authentication/permission_error).
ProtocolErrorClass = Literal[
    "malformed_json",
    "bad_shape",
    "stream_error",
    "bad_encoding",
    "not_json",
    "overloaded",
    "rate_limit",
    "auth_error",
    "too_large",
]


class StreamProtocolError(Exception):
    """The server answered, but the payload is malformed, mis-shaped or carries an error object."""

    def __init__(self, error_class: ProtocolErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class: ProtocolErrorClass = error_class


# Not frozen (as the others are): one is made per chunk, and a frozen dataclass's __init__ costs three times
# as much (0.7 against 0.2 µs for six fields: `object.__setattr__` per field). Nothing changes them.
@dataclass(slots=True)
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


@dataclass(slots=True)  # not frozen: one a chunk with continuous usage stats (see TextDelta)
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
    prompt_n: int | None  # prompt tokens computed for this request: the cached ones left out
    prompt_ms: float | None
    predicted_per_second: float | None = None
    cache_n: int | None = None  # prompt tokens reused from the slot's cache
    prompt_per_second: float | None = None  # llama.cpp's own prefill rate: prompt_n / prompt_ms


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
    prompt_eval_cached_count: int | None = None  # prompt tokens Ollama reused from its cache, if it says


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


class StreamParser(Protocol):
    """An incremental dialect parser: network reads in, events out; `close` at the end of the body."""

    def feed(self, data: bytes, t: float) -> list[StreamEvent]:
        """Parse one network read received at `t`."""
        ...

    def close(self, t: float) -> list[StreamEvent]:
        """End of body: flush whatever is still pending."""
        ...
