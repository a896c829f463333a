"""JSON payloads of a dialect: parse, read typed fields, render a server's error object in one line."""

from __future__ import annotations

import json
from typing import Any

from tokwatch.streams.events import StreamProtocolError

_MAX_ERROR_TEXT = 300


# json.loads' own C scanner, called without its Python layers (type checks, whitespace skips): a stream chunk
# is one JSON document, so a document that starts at 0 and ends at the end is exactly what json.loads gives.
_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, not in the stubs


def loads_json(text: str) -> Any:
    """json.loads raising StreamProtocolError('malformed_json') with a short excerpt."""
    try:
        obj, end = _scan_once(text, 0)
    except Exception:  # anything unusual (whitespace first, bad JSON, deep nesting) takes json.loads' path
        pass
    else:
        if end == len(text):
            return obj
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StreamProtocolError("malformed_json", f"invalid JSON ({exc.msg}): {text[:120]!r}") from None


def error_text(err: Any) -> str:
    """A server's error object (or string) as one bounded line: message and code."""
    if isinstance(err, dict):
        msg = err.get("message") or err.get("msg") or json.dumps(err)[:_MAX_ERROR_TEXT]
        code = err.get("code") or err.get("type")
        return f"{msg} ({code})" if code else str(msg)
    return str(err)[:_MAX_ERROR_TEXT]


def int_field(obj: dict[str, Any], key: str) -> int | None:
    """A numeric field as int; None when absent or not a number."""
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return int(v)


def float_field(obj: dict[str, Any], key: str) -> float | None:
    """A numeric field as float; None when absent or not a number."""
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def str_field(obj: dict[str, Any], key: str, where: str) -> str:
    """A text field ("" when absent or null); any other type is a `bad_shape` naming `where.key`."""
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise StreamProtocolError("bad_shape", f"{where}.{key} is {type(v).__name__}, expected a string")
    return v
