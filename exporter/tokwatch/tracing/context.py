"""W3C Trace Context: the ids a traced request carries in its `traceparent` header."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
# version 00: trace id (32 hex), parent id (16 hex), flags (2 hex); all-zero ids are invalid.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True, slots=True)
class TraceIds:
    """A span's place in a trace: the trace it belongs to and its own id."""

    trace_id: int
    span_id: int

    @property
    def traceparent(self) -> str:
        """The `traceparent` header naming this span as the parent (sampled)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"


def new_ids(trace_id: int | None = None) -> TraceIds:
    """Fresh random ids (a new trace unless `trace_id` is given)."""
    return TraceIds(trace_id or _nonzero(128), _nonzero(64))


def _nonzero(bits: int) -> int:
    while True:
        value = secrets.randbits(bits)
        if value:
            return value


def parse_traceparent(value: str | None) -> TraceIds | None:
    """The caller's ids from a `traceparent` header; None when absent or malformed (the W3C rule: ignore)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return TraceIds(trace_id, span_id)


@dataclass(slots=True)
class RequestTrace:
    """One traced request: its span's ids, and when the client was called (perf_counter, set by `headers`)."""

    ids: TraceIds
    called_at: float = 0.0

    def headers(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` plus the `traceparent` header; stamps `called_at` (the request is built right before the
        client is called)."""
        self.called_at = time.perf_counter()
        return {**base, TRACEPARENT: self.ids.traceparent}


def traced_headers(base: Mapping[str, str], trace: RequestTrace | None) -> Mapping[str, str]:
    """The request's headers, with `traceparent` when the request is traced."""
    return base if trace is None else trace.headers(base)
