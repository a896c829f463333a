"""Setting values that every tokwatch settings file shares: durations ('500ms', '30s', '15m', '1h', '7d') and
HOST:PORT listen addresses. Parsers raise ValueError naming the value; the models put file, line and field."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import field_validator

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as '500ms', '30s', '15m', '1h', '7d'."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ValueError(
                f"invalid duration {value!r}: use a number of seconds or e.g. 500ms, 30s, 15m, 1h"
            )
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError("expected a duration such as 30s, 15m or 1h")
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, not {value!r}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_positive_duration(value: Any) -> float:
    """`parse_duration`, and more than zero (an interval, a timeout or a window of 0 means nothing)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be a duration above zero, not {value!r}")
    return seconds


def parse_listen(value: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT); raises ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"listen address {value!r} must be HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def duration_fields(*names: str) -> Any:
    """A model validator reading these fields as durations (zero allowed: an offset, a deadline)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_duration(v))


def positive_duration_fields(*names: str) -> Any:
    """A model validator reading these fields as durations above zero (an interval, a timeout, a window)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_positive_duration(v))
