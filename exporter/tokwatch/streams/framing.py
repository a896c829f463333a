"""Byte framing: network reads -> complete SSE `data` payloads or NDJSON lines, decoded as strict UTF-8.

The decoders never buffer more than one unfinished line; what a payload means is the dialect parsers' job.
"""

from __future__ import annotations

from tokwatch.streams.events import StreamProtocolError

_CR = ord("\r")
# One SSE or NDJSON line carries one event of a token stream (a few hundred bytes). A longer unfinished line
# is refused as `too_large` instead of being held up to the body's size cap: a hostile neighbour's 10 MB line
# would otherwise hold 8 MiB per stream and its copies (issue 37).
MAX_LINE_BYTES = 1024 * 1024


def _line_too_long(size: int) -> StreamProtocolError:
    return StreamProtocolError("too_large", f"a line of the stream exceeds {MAX_LINE_BYTES} bytes ({size}+)")


class SseDecoder:
    """Bytes -> SSE `data` payloads; tolerant of comments/pings, other fields, CRLF and any split."""

    def __init__(self) -> None:
        self._buf = bytearray()  # the unfinished line; bytearray so appends are amortised O(1)
        self._data: list[str] = []

    def feed(self, data: bytes, t: float) -> list[tuple[float, str]]:
        """Feed one network read received at `t`; return the events it completed."""
        if (
            not self._buf
            and not self._data
            and data.startswith(b"data: ")
            and data.endswith(b"\n\n")
            and len(data) <= MAX_LINE_BYTES
        ):
            # The common reads, whole `data: ...` events and nothing pending, without the line machinery;
            # exactly what the general path gives (each event a single-line `data` field, no CR before its
            # newline; anything else takes the general path).
            if data.count(b"\n") == 2 and data[-3] != _CR:
                return [(t, decode_utf8(data[6:-2]))]
            events = data[:-2].split(b"\n\n")
            if all(e.startswith(b"data: ") and b"\n" not in e and not e.endswith(b"\r") for e in events):
                return [(t, decode_utf8(e[6:])) for e in events]
        return self.feed_lines(data, t)

    def idle(self) -> bool:
        """Nothing pending: the next read starts a new line and a new event."""
        return not self._buf and not self._data

    def feed_lines(self, data: bytes, t: float) -> list[tuple[float, str]]:
        """`feed` without its fast path: every read line by line (the reference the fast path must equal)."""
        out: list[tuple[float, str]] = []
        if b"\n" not in data:  # a long line arriving in pieces: no rescan of what is already buffered
            if len(self._buf) + len(data) > MAX_LINE_BYTES:
                raise _line_too_long(len(self._buf) + len(data))
            self._buf += data
            return out
        buf = self._buf + data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            if nl - start > MAX_LINE_BYTES:
                raise _line_too_long(nl - start)
            self._line(buf[start:nl], t, out)
            start = nl + 1
        if len(buf) - start > MAX_LINE_BYTES:
            raise _line_too_long(len(buf) - start)
        self._buf = buf[start:]
        return out

    def close(self, t: float) -> list[tuple[float, str]]:
        """End of body: a final event without its blank line still counts."""
        out: list[tuple[float, str]] = []
        if self._buf:
            self._line(self._buf, t, out)
            self._buf = bytearray()
        if self._data:
            out.append((t, "\n".join(self._data)))
            self._data = []
        return out

    def _line(self, raw: bytes | bytearray, t: float, out: list[tuple[float, str]]) -> None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            if self._data:
                out.append((t, "\n".join(self._data)))
                self._data = []
            return
        if raw.startswith(b":"):
            return  # comment / keep-alive ping
        name, _, value = raw.partition(b":")
        if name != b"data":
            return
        if value.startswith(b" "):
            value = value[1:]
        self._data.append(decode_utf8(value))


class NdjsonDecoder:
    """Bytes -> complete lines (one JSON document each), blank lines skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes, t: float) -> list[tuple[float, str]]:
        """Feed one network read received at `t`; return the lines it completed."""
        if b"\n" not in data:
            if len(self._buf) + len(data) > MAX_LINE_BYTES:
                raise _line_too_long(len(self._buf) + len(data))
            self._buf += data
            return []
        *lines, self._buf = (self._buf + data).split(b"\n")
        longest = max(len(self._buf), *(len(ln) for ln in lines))
        if longest > MAX_LINE_BYTES:
            raise _line_too_long(longest)
        return [(t, s) for s in (decode_utf8(ln).strip() for ln in lines) if s]

    def close(self, t: float) -> list[tuple[float, str]]:
        """End of body: an unterminated last line still counts."""
        rest, self._buf = decode_utf8(self._buf).strip(), bytearray()
        return [(t, rest)] if rest else []


def decode_utf8(raw: bytes | bytearray) -> str:
    """Strict UTF-8: an answer with invalid bytes is garbage, not text with replacement characters.

    Lines are split at newlines before decoding, so a multi-byte character is never cut in two here.
    """
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StreamProtocolError(
            "bad_encoding", f"invalid UTF-8 at byte {exc.start} of a {len(raw)}-byte line"
        ) from None
