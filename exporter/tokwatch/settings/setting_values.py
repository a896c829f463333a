"""Setting values that every tokwatch settings file shares: durations ('500ms', '30s', '15m', '1h', '7d'),
ratios ('1%', 0.01) and HOST:PORT listen addresses. Parsers raise ValueError naming the value; the models put
file, line and field."""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import field_validator

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# The longest interval, timeout or offset taken: `99999999999999999999h` as an interval silently stopped
# probing, as a timeout it waited forever (issue 37). Horizons (retention, windows, report spans) go further.
MAX_DURATION_S = 30 * 86400.0
MAX_HORIZON_S = 100 * 365 * 86400.0


def _limit_label(max_s: float) -> str:
    return f"{max_s / 86400:g} days"


def parse_duration(value: Any, max_s: float = MAX_DURATION_S) -> float:
    """Seconds from a number or a string such as '500ms', '30s', '15m', '1h', '7d'; at most `max_s`."""
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
    if seconds > max_s:
        raise ValueError(f"duration {value!r} is longer than the longest taken here ({_limit_label(max_s)})")
    return seconds


def parse_positive_duration(value: Any, max_s: float = MAX_DURATION_S) -> float:
    """`parse_duration`, and more than zero (an interval, a timeout or a window of 0 means nothing)."""
    seconds = parse_duration(value, max_s)
    if seconds <= 0:
        raise ValueError(f"must be a duration above zero, not {value!r}")
    return seconds


def parse_ratio(value: Any) -> float:
    """A ratio above 0 and below 1 from a number (0.01) or a percentage string ('1%', '0.5 %')."""
    if isinstance(value, bool):
        raise ValueError("expected a ratio such as 0.01 or 1%")
    if isinstance(value, str):
        text = value.strip()
        try:
            ratio = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"invalid ratio {value!r}: use e.g. 0.01 or 1%") from None
    elif isinstance(value, int | float):
        ratio = float(value)
    else:
        raise ValueError("expected a ratio such as 0.01 or 1%")
    if not (math.isfinite(ratio) and 0 < ratio < 1):
        raise ValueError(f"a ratio must be above 0 and below 1 (0 % to 100 %), not {value!r}")
    return ratio


def parse_listen(value: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT); raises ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not port:
        raise ValueError(
            f"listen address {value!r} must be HOST:PORT, e.g. 127.0.0.1:9477 (:9477 for every interface)"
        )
    if not port.isdigit():
        raise ValueError(f"listen address {value!r}: port {port!r} is not a number")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {value!r}: port {int(port)} is out of range (0-65535)")
    return host.strip("[]") or "0.0.0.0", int(port)


def check_http_url(value: str) -> str:
    """`value` if it is an http(s):// URL with a host and a valid port; ValueError naming the problem."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        hint = f"; did you mean http://{value}?" if "://" not in value else ""
        raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}{hint}")
    if not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise ValueError(f"{value!r}: the port is not a number in 0-65535") from None
    return value


def duration_fields(*names: str) -> Any:
    """A model validator reading these fields as durations (zero allowed: an offset, a deadline)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_duration(v))


def ratio_fields(*names: str) -> Any:
    """A model validator reading these fields as ratios above 0 and below 1 ('1%' or 0.01)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_ratio(v))


def positive_duration_fields(*names: str) -> Any:
    """A model validator reading these fields as durations above zero (an interval, a timeout, a window)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_positive_duration(v))


def window_label(seconds: float) -> str:
    """Prometheus-style label for a window length: 86400 -> '24h', 604800 -> '7d'."""
    s = int(seconds)
    if s >= 7 * 86400 and s % 86400 == 0:
        return f"{s // 86400}d"
    if s >= 3600 and s % 3600 == 0:
        return f"{s // 3600}h"
    if s >= 60 and s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def horizon_fields(*names: str) -> Any:
    """`positive_duration_fields` for spans that may be long (retention, a window): up to MAX_HORIZON_S."""
    return field_validator(*names, mode="before")(
        lambda v: v if v is None else parse_positive_duration(v, MAX_HORIZON_S)
    )
