"""HTTP/1.1 on the wire, without I/O: request bytes, the response head, and the body framings (RFC 9112).

`tokwatch.transport.http` feeds every socket read through these, so they are written for the per-read path:
one
`bytes.find` per chunk-size line, no copies beyond the slices handed out, no per-byte Python loops.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # a response head larger than this is a protocol error, not a memory sink
_MAX_SIZE_LINE = 1024  # a chunk-size line (hex size plus extensions) longer than this is malformed


class ProtocolError(ValueError):
    """The server's bytes are not HTTP/1.1 as RFC 9112 frames it."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL sends a request: the connection's origin and the request line's target."""

    scheme: str
    host: str  # a name or an address, IPv6 without brackets
    port: int
    path: str  # path and query, as sent on the request line
    host_header: str

    @property
    def origin(self) -> tuple[str, str, int]:
        """The key of the connections that can carry this request."""
        return (self.scheme, self.host, self.port)


def parse_url(url: str) -> Target:
    """The target of an absolute http(s) URL; raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}: use http:// or https://")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in URL {url!r}")
    default = 443 if scheme == "https" else 80
    port = parts.port or default  # .port raises ValueError for a port out of range
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    shown = f"[{host}]" if ":" in host else host
    return Target(scheme, host, port, path, shown if port == default else f"{shown}:{port}")


def encode_request(method: str, target: Target, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """The request's bytes: request line, Host, `headers`, Content-Length when there is a body, the body."""
    lines = [f"{method} {target.path} HTTP/1.1", f"Host: {target.host_header}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


class Headers(Mapping[str, str]):
    """Response headers, looked up case-insensitively; a repeated field's values joined with ", "."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields  # lower-cased names

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:  # Mapping's own goes through a KeyError
        """The field's value, or `default`."""
        return self._fields.get(name.lower(), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A response's status line and header fields."""

    version: str
    status: int
    reason: str
    headers: Headers

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request after this response (HTTP/1.1 unless closed)."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


def parse_head(raw: bytes) -> ResponseHead:
    """The head of a response, `raw` up to (without) the blank line; raises ProtocolError."""
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(status_line[1])
    if not 100 <= status <= 999:
        raise ProtocolError(f"status {status} out of range")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line: {line[:80]!r}")
        key, value = name.lower(), value.strip()
        if key in fields:
            fields[key] = f"{fields[key]}, {value}"
        else:
            fields[key] = value
    reason = status_line[2] if len(status_line) > 2 else ""
    return ResponseHead(status_line[0], status, reason, Headers(fields))


class Body:
    """The framing of one response body: `feed` takes the bytes of a read and returns the body's bytes in
    it; `done` once the body ended; `extra` holds bytes that arrived after its end (none are expected)."""

    __slots__ = ("done", "extra")

    def __init__(self) -> None:
        self.done = False
        self.extra = b""

    def feed(self, data: bytes) -> bytes:
        """The body bytes in `data` (raises ProtocolError on bad framing)."""
        raise NotImplementedError

    def closed(self) -> bool:
        """The connection closed: True if that ends the body, False if the body was cut short."""
        return self.done


class EmptyBody(Body):
    """No body: a HEAD request's answer, 1xx, 204 and 304."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.done = True

    def feed(self, data: bytes) -> bytes:
        self.extra += data
        return b""


class LengthBody(Body):
    """A body of Content-Length bytes."""

    __slots__ = ("_left", "length")

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length  # as declared
        self._left = length
        self.done = length == 0

    def feed(self, data: bytes) -> bytes:
        left = self._left
        if len(data) < left:
            self._left = left - len(data)
            return data
        self._left = 0
        self.done = True
        if len(data) > left:
            self.extra += data[left:]
            return data[:left]
        return data


class UntilCloseBody(Body):
    """A body without length or chunking: it ends when the server closes the connection."""

    __slots__ = ()

    def feed(self, data: bytes) -> bytes:
        return data

    def closed(self) -> bool:
        self.done = True
        return True


# ChunkedBody's states: module constants, not class attributes, so the module also compiles with mypyc
# (benchmarks/compiled_path.py), which takes only plain assignments in a class body.
_SIZE, _DATA, _CRLF, _TRAILER = 0, 1, 2, 3


class ChunkedBody(Body):
    """Transfer-Encoding: chunked. Chunk extensions and trailer fields are read and dropped."""

    __slots__ = ("_buf", "_left", "_state")

    def __init__(self) -> None:
        super().__init__()
        self._buf = b""  # an incomplete size line, CRLF or trailer line carried to the next read
        self._left = 0  # bytes of the current chunk still to come
        self._state = _SIZE

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.extra += data
            return b""
        buf = self._buf + data if self._buf else data
        self._buf = b""
        state, left = self._state, self._left
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end:
            if state == _SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_SIZE_LINE:
                        raise ProtocolError("chunk-size line too long")
                    self._buf = buf[pos:]
                    break
                size = _chunk_size(buf[pos:eol])
                pos = eol + 2
                if not size:
                    state = _TRAILER
                    continue
                stop = pos + size
                if stop + 2 <= end:  # the whole chunk and its CRLF in this read: the common case
                    if buf[stop : stop + 2] != b"\r\n":
                        raise ProtocolError("chunk data not followed by CRLF")
                    out.append(buf[pos:stop])
                    pos = stop + 2
                    continue
                state, left = _DATA, size
            elif state == _DATA:
                take = min(left, end - pos)
                out.append(buf[pos : pos + take] if take != end or pos else buf)
                pos += take
                left -= take
                if not left:
                    state = _CRLF
            elif state == _CRLF:
                if end - pos < 2:
                    if buf[pos:] != b"\r":
                        raise ProtocolError("chunk data not followed by CRLF")
                    self._buf = buf[pos:]
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                state = _SIZE
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_SIZE_LINE:
                        raise ProtocolError("trailer line too long")
                    self._buf = buf[pos:]
                    break
                if eol == pos:  # the blank line: the body ended
                    self.done = True
                    self.extra = buf[eol + 2 :]
                    break
                pos = eol + 2  # a trailer field, dropped
        self._state, self._left = state, left
        if len(out) == 1:
            return out[0]
        return b"".join(out)


def _chunk_size(line: bytes) -> int:
    """The size of a chunk-size line (extensions after ';' dropped)."""
    if line.isalnum():  # hex digits only, the common line: int() takes bytes
        try:
            return int(line, 16)
        except ValueError:
            pass
    text = line.split(b";", 1)[0].strip()
    if text and all(c in b"0123456789abcdefABCDEF" for c in text):
        return int(text, 16)
    raise ProtocolError(f"bad chunk size {text[:20]!r}")


def body_framing(head: ResponseHead, *, head_request: bool) -> Body:
    """How the body of a response with `head` ends (RFC 9112 section 6.3)."""
    if head_request or head.status < 200 or head.status in (204, 304):
        return EmptyBody()
    codings = head.headers.get("transfer-encoding")
    if codings is not None:
        if codings.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return ChunkedBody()
        return UntilCloseBody()
    length = head.headers.get("content-length")
    if length is not None:
        values = {v.strip() for v in length.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise ProtocolError(f"bad Content-Length {length[:40]!r}")
        return LengthBody(int(next(iter(values))))
    return UntilCloseBody()


def content_decoder(head: ResponseHead) -> zlib._Decompress | None:
    """A decompressor for a gzip- or deflate-coded body (tokwatch asks for identity; some servers code
    anyway), None for an identity body or a coding it cannot undo (passed through as sent)."""
    coding = head.headers.get("content-encoding", "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.decompressobj()
    return None


# Output of one decompress call: a gzip bomb inflates ~1000:1, so one 64 KiB read could otherwise become
# 64 MB in one call (issue 37: 922 MB of RSS). The cap is checked after each call, as the bytes are produced.
INFLATE_SLICE_BYTES = 64 * 1024


class Inflater:
    """A gzip- or deflate-coded body undone in bounded slices: `add` queues coded bytes with their read's
    stamp, `step` inflates at most about `budget` bytes of output and says whether more is queued, and no
    call ever produces more than `max_bytes` + one slice in all (beyond that the body is too large)."""

    __slots__ = ("_decoder", "_queue", "max_bytes", "produced")

    def __init__(self, decoder: zlib._Decompress, max_bytes: int) -> None:
        self._decoder = decoder
        self._queue: deque[tuple[float, bytes]] = deque()
        self.max_bytes = max_bytes
        self.produced = 0

    @property
    def pending(self) -> bool:
        """Coded bytes wait to be inflated."""
        return bool(self._queue)

    @property
    def exceeded(self) -> bool:
        """More than `max_bytes` came out: the body is too large, and inflating stops."""
        return self.produced > self.max_bytes

    def add(self, stamp: float, data: bytes) -> None:
        """Queue coded bytes received at `stamp`."""
        if data:
            self._queue.append((stamp, data))

    def step(self, budget: int) -> list[tuple[float, bytes]]:
        """Inflate queued bytes until about `budget` bytes came out, the queue is empty or the cap is passed;
        the output pieces keep the stamp of the read that brought their input. Raises zlib.error."""
        out: list[tuple[float, bytes]] = []
        made = 0
        while self._queue and made < budget and not self.exceeded:
            stamp, data = self._queue[0]
            limit = min(INFLATE_SLICE_BYTES, self.max_bytes - self.produced + 1)
            piece = self._decoder.decompress(data, limit)
            tail = self._decoder.unconsumed_tail
            if tail:
                self._queue[0] = (stamp, tail)
            elif len(piece) < limit:
                self._queue.popleft()  # input used up and no output held back
            else:
                self._queue[0] = (stamp, b"")  # the output filled the slice: zlib may hold more of it
            if piece:
                out.append((stamp, piece))
                made += len(piece)
                self.produced += len(piece)
            elif not tail and not data:
                self._queue.popleft()
        return out

    def finish(self) -> bytes:
        """What the decoder still holds once every coded byte was inflated (bounded by the cap)."""
        if self.exceeded:
            return b""
        tail = self._decoder.flush()[: self.max_bytes - self.produced + 1]
        self.produced += len(tail)
        return tail
