"""A stream's repeated chunk shape: reads that differ from an already parsed chunk only in its content text.

Servers write every token's chunk with the same bytes around the text (id, model, `finish_reason: null`...).
Once a plain-content chunk has been parsed, a read that is `data: ` + the same bytes before the text + plain
text + the same bytes after it parses to the same object with only `choices[0].delta.content` changed, so its
content can be taken without decoding the JSON again. "Plain" is what keeps that exact: no quote, backslash
or control byte, so the text cannot end the string literal or be an escape, and strict UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Bytes that cannot end or escape a JSON string literal; UTF-8's multi-byte sequences use only bytes >= 0x80.
_PLAIN_BYTES = re.compile(rb'[^"\\\x00-\x1f]*').fullmatch
_PLAIN_TEXT = re.compile(r'[^"\\\x00-\x1f]+').fullmatch
_KEY = '"content"'
_PROBE = "tokwatch shape probe"


class ChunkShape:
    """The bytes of one SSE event around its content text; `content` reads a whole read of that shape."""

    __slots__ = ("_head", "_head_len", "_tail", "_tail_len")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self._head = head
        self._tail = tail
        self._head_len = len(head)
        self._tail_len = len(tail)

    def content(self, data: bytes) -> str | None:
        """The content text when `data` is exactly one event of this shape; None for anything else."""
        end = len(data) - self._tail_len
        if end < self._head_len or not data.startswith(self._head) or not data.endswith(self._tail):
            return None
        middle = data[self._head_len : end]
        if _PLAIN_BYTES(middle) is None:
            return None  # a second event, an escape or a control byte: the parser's general path decides
        try:
            return middle.decode("utf-8")
        except UnicodeDecodeError:
            return None  # the general path raises the stream's bad_encoding error


class ShapeMemory:
    """A stream's current chunk shape, learnt from parsed plain-content chunks while learning pays for itself.

    Learning costs a second parse of the chunk, so it goes on only while the shapes learnt are used: a server
    that changes the bytes around the text in every chunk costs at most two extra parses a stream.
    """

    __slots__ = ("hits", "learns", "shape")

    def __init__(self) -> None:
        self.shape: ChunkShape | None = None
        self.hits = 0  # reads taken by a shape
        self.learns = 0  # second parses spent learning

    def content(self, data: bytes) -> str | None:
        """The content text of a read of the current shape; None when there is none or it does not fit."""
        if self.shape is None:
            return None
        content = self.shape.content(data)
        if content is not None:
            self.hits += 1
        return content

    def learn(self, payload: str, obj: dict[str, Any], content: str) -> None:
        """Learn from a parsed chunk that yields only `content` (no usage, finish, timings or reasoning)."""
        if self.learns >= self.hits + 2 or not _PLAIN_TEXT(content) or "\n" in payload or "\r" in payload:
            return  # the text has escapes, or a multi-line event's payload is not its bytes on the wire
        self.learns += 1
        shape = learn_shape(payload, obj, content)
        if shape is not None:
            self.shape = shape


def learn_shape(payload: str, obj: dict[str, Any], content: str) -> ChunkShape | None:
    """The shape of a parsed chunk whose choices[0].delta.content is `content`; None when its place is unsure.

    The content's literal is looked for as `"content": "<content>"`; it must be there exactly once, and the
    payload with another text in its place must parse to `obj` with only that text changed.
    """
    if not _PLAIN_TEXT(content):
        return None
    literal = f'"{content}"'
    found = -1
    at = payload.find(literal)
    while at >= 0:
        if payload[:at].rstrip().endswith(":") and payload[:at].rstrip()[:-1].rstrip().endswith(_KEY):
            if found >= 0:
                return None  # twice: which one is the delta's is not certain
            found = at
        at = payload.find(literal, at + 1)
    if found < 0:
        return None
    head, tail = payload[: found + 1], payload[found + 1 + len(content) :]
    probe = _PROBE if content != _PROBE else _PROBE + "!"  # another text, or the check proves nothing
    if not _same_but_content(head + probe + tail, probe, obj, content):
        return None
    return ChunkShape(b"data: " + head.encode(), tail.encode() + b"\n\n")


def _same_but_content(probe_payload: str, probe: str, obj: dict[str, Any], content: str) -> bool:
    """Whether `probe_payload` parses to `obj` with only choices[0].delta.content changed (to `probe`)."""
    try:
        parsed = json.loads(probe_payload)
        delta = parsed["choices"][0]["delta"]
        if delta["content"] != probe:
            return False
        delta["content"] = content
    except (ValueError, LookupError, TypeError):
        return False
    return bool(parsed == obj)
