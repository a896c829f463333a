"""A stream's repeated chunk shape: events that differ from an already parsed chunk only in its content text.

Servers write every token's chunk with the same bytes around the text (id, model, `finish_reason: null`...).
Once a plain-content chunk has been parsed, an event that is `data: ` + the same bytes before the text + plain
text + the same bytes after it parses to the same object with only `choices[0].delta.content` changed, so its
content can be taken without decoding the JSON again. "Plain" is what keeps that exact: no quote, backslash
or control byte, so the text cannot end the string literal or be an escape, and strict UTF-8.
"""

from __future__ import annotations

import re
from typing import Any

from tokwatch.streams.events import StreamProtocolError
from tokwatch.streams.payload import loads_json

# A run of bytes that cannot end or escape a JSON string literal (UTF-8's multi-byte sequences use only
# bytes >= 0x80); the shape's tail starts with the literal's closing quote, so the run must end right there.
_PLAIN_RUN = re.compile(rb'[^"\\\x00-\x1f]*').match
_PLAIN_TEXT = re.compile(r'[^"\\\x00-\x1f]+').fullmatch
_KEY = '"content"'
_PROBE = "tokwatch shape probe"


class ChunkShape:
    """The bytes of one SSE event around its content text; `contents` reads a read made of such events."""

    __slots__ = ("_head", "_head_len", "_tail", "_tail_len", "head_text", "tail_text")

    def __init__(self, head_text: str, tail_text: str) -> None:
        self.head_text = head_text  # the payload before the text, up to the literal's opening quote
        self.tail_text = tail_text  # the payload from the literal's closing quote
        self._head = b"data: " + head_text.encode()
        self._tail = tail_text.encode() + b"\n\n"
        self._head_len = len(self._head)
        self._tail_len = len(self._tail)

    def contents(self, data: bytes) -> list[str] | None:
        """The content texts when `data` is whole events of this shape and nothing else; None otherwise."""
        out: list[str] = []
        pos, size = 0, len(data)
        while pos < size:
            if not data.startswith(self._head, pos):
                return None
            start = pos + self._head_len
            end = _PLAIN_RUN(data, start).end()  # type: ignore[union-attr]  # `*` always matches
            if not data.startswith(self._tail, end):
                return None  # an escape, a control byte or other bytes: the parser's general path decides
            try:
                out.append(data[start:end].decode("utf-8"))
            except UnicodeDecodeError:
                return None  # the general path raises the stream's bad_encoding error
            pos = end + self._tail_len
        return out or None


class ShapeMemory:
    """A stream's current chunk shape, learnt from parsed plain-content chunks while learning pays for itself.

    Learning costs a second parse of the chunk, so it goes on only while the shapes learnt are used: a server
    that changes the bytes around the text in every chunk costs at most two extra parses a stream.
    """

    __slots__ = ("hits", "learns", "shape")

    def __init__(self) -> None:
        self.shape: ChunkShape | None = None
        self.hits = 0  # events taken by a shape
        self.learns = 0  # second parses spent learning

    def contents(self, data: bytes) -> list[str] | None:
        """The content texts of a read of the current shape; None when there is none or it does not fit."""
        if self.shape is None:
            return None
        contents = self.shape.contents(data)
        if contents is not None:
            self.hits += len(contents)
        return contents

    def learn(self, payload: str, obj: dict[str, Any], content: str) -> None:
        """Learn from a parsed chunk that yields only `content` (no usage, finish, timings or reasoning)."""
        shape = self.shape
        if shape is not None and payload.startswith(shape.head_text) and payload.endswith(shape.tail_text):
            return  # the shape already read it (it came in a read with other bytes)
        if self.learns >= self.hits + 2 or not _learnable(payload, content):
            return
        self.learns += 1
        learnt = learn_shape(payload, obj, content)
        if learnt is not None:
            self.shape = learnt


def learn_shape(payload: str, obj: dict[str, Any], content: str) -> ChunkShape | None:
    """The shape of a parsed chunk whose choices[0].delta.content is `content`; None when its place is unsure.

    The content's literal is looked for as `"content": "<content>"` (the last one, if there are several), and
    the payload with another text in its place must parse to `obj` with only that text changed.
    """
    if not _learnable(payload, content):
        return None
    literal = f'"{content}"'
    at = payload.rfind(literal)
    while at >= 0:
        before = payload[:at].rstrip()
        if before.endswith(":") and before[:-1].rstrip().endswith(_KEY):
            break
        at = payload.rfind(literal, 0, at)
    if at < 0:
        return None
    head, tail = payload[: at + 1], payload[at + 1 + len(content) :]
    probe = _PROBE if content != _PROBE else _PROBE + "!"  # another text, or the check proves nothing
    if not _same_but_content(head + probe + tail, probe, obj, content):
        return None
    return ChunkShape(head, tail)


def _learnable(payload: str, content: str) -> bool:
    """What a shape needs before any search: a plain text (its literal is the text itself) and a one-line
    payload (a multi-line event's payload is not its bytes on the wire)."""
    return _PLAIN_TEXT(content) is not None and "\n" not in payload and "\r" not in payload


def _same_but_content(probe_payload: str, probe: str, obj: dict[str, Any], content: str) -> bool:
    """Whether `probe_payload` parses to `obj` with only choices[0].delta.content changed (to `probe`)."""
    try:
        parsed = loads_json(probe_payload)
        delta = parsed["choices"][0]["delta"]
        if delta["content"] != probe:
            return False
        delta["content"] = content
    except (StreamProtocolError, LookupError, TypeError):
        return False
    return bool(parsed == obj)
