"""The one HTTP client shared by probes, the benchmark and the counters scraper.

Streaming requests record `time.perf_counter()` when the request's last byte is handed to the socket (the
latency clock starts there; bytes the socket could not take at once count when the transport's buffer
drained) and for every piece of the body as it arrives; the time from calling the client to that moment
(pool wait, connection set-up, serialisation, the body-writing task's turn, a full socket) is reported as
the send delay. Every new connection records how long its DNS lookup, TCP connect and TLS handshake took
(`ConnectionSetup`), and every response when the read that brought its headers ran: connection set-up and
first-byte events only, nothing per body read. Every request has a total deadline and a cap on the body
size. Transport failures are raised as `TransportError` with a bounded `kind`; `tokwatch.status` turns
them into run statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any, Literal

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.client_proto import ResponseHandler

from tokwatch import rxwatch
from tokwatch.rxwatch import ReceiveWatcher

TransportKind = Literal["connect", "dns", "tls", "timeout", "reset", "too_large", "protocol"]
Phase = Literal["connect", "response", "body"]

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
# When the coroutine reading a body is woken (StreamResponse.arrived): after this many reads or bytes it has
# not seen, and at the latest this long after the first of them. Stamps are taken per read regardless.
BATCH_READS = 16
BATCH_BYTES = 32 * 1024
FLUSH_S = 0.05
_DISCONNECT_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


class TransportError(Exception):
    """A request that failed below HTTP semantics: connect, timeout, reset, oversize body, bad framing.

    `phase` says how far the request got: "connect" (no connection), "response" (connected, no response
    headers yet) or "body" (headers received, failed while reading the body).
    """

    def __init__(self, kind: TransportKind, phase: Phase, message: str) -> None:
        super().__init__(message)
        self.kind: TransportKind = kind
        self.phase: Phase = phase


class HttpStatusError(Exception):
    """A non-2xx answer from `get_text` (streaming callers inspect `StreamResponse.status` themselves)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body


@dataclass(slots=True)
class _Attempt:
    """Per-attempt connection facts, filled in by the aiohttp trace hooks."""

    connected: bool = False
    reused: bool = False
    headers_sent_at: float | None = None
    body_sent_at: float | None = None  # the last body chunk, right before it is written to the transport
    drained_at: float | None = None  # the transport's buffer emptied: bytes the socket did not take at once
    # Opening a new connection (see ConnectionSetup): when aiohttp began, whether it needed a name lookup
    # (its own, or one in flight or cached), and when each TCP socket of the attempt was created, by fd.
    create_started_at: float | None = None
    looked_up: bool = False
    first_socket_at: float | None = None
    sockets: dict[int, float] | None = None


@dataclass(frozen=True, slots=True)
class ConnectionSetup:
    """How one connection was opened, in seconds per phase (docs/methodology.md, "Network phases").

    `resolve_s`: the DNS lookup (or the wait for one already in flight; 0.0 for an IP address); `connect_s`:
    TCP connect, every address tried; `tls_s`: the TLS handshake (0.0 over plain HTTP); `rtt_s`: the TCP
    connect of the address that answered alone, i.e. one network round trip. `ready_at` is the
    `perf_counter()` when the connection could carry its first request.
    """

    ready_at: float
    resolve_s: float
    connect_s: float
    tls_s: float
    rtt_s: float
    tls: bool


def _setup_of(
    opener: _Attempt, tcp_at: float, ready_at: float, fd: int | None, *, tls: bool
) -> ConnectionSetup | None:
    """The phases of a connection `opener` opened: TCP up at `tcp_at`, ready at `ready_at`."""
    first, begun = opener.first_socket_at, opener.create_started_at
    if first is None or begun is None:
        return None  # not opened through this client's connector hooks: nothing measured
    winner = opener.sockets.get(fd, first) if opener.sockets is not None and fd is not None else first
    return ConnectionSetup(
        ready_at=ready_at,
        resolve_s=max(0.0, first - begun) if opener.looked_up else 0.0,
        connect_s=max(0.0, tcp_at - first),
        tls_s=max(0.0, ready_at - tcp_at) if tls else 0.0,
        rtt_s=max(0.0, tcp_at - winner),
        tls=tls,
    )


# The attempt being sent in this context. The connector's socket and protocol factories run in it (so a
# new connection knows which attempt opened it), and so does the write_bytes task, so the connection
# protocol knows whose bytes were left in the transport's buffer (see pause_writing).
_SENDING: ContextVar[_Attempt | None] = ContextVar("tokwatch_http_sending", default=None)


async def _on_reuse(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.connected = True
        attempt.reused = True


async def _on_create(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.connected = True
        attempt.reused = False


async def _on_create_start(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.create_started_at = time.perf_counter()


async def _on_lookup(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    # aiohttp resolves the name itself (resolvehost_start), or takes it from its cache or from a lookup
    # another request already started (cache_hit); an IP address fires neither.
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.looked_up = True


async def _on_headers_sent(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.headers_sent_at = time.perf_counter()


async def _on_chunk_sent(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
    # aiohttp awaits this right before the synchronous transport write of the chunk (no suspension in
    # between), so the last call is when the request's last byte goes to the socket. On Python 3.11 the
    # body is written by a separate task that may run well after the headers hook fired: that wait is
    # send delay, not time to first token.
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.body_sent_at = time.perf_counter()


def _trace_config() -> aiohttp.TraceConfig:
    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(_on_headers_sent)
    tc.on_request_chunk_sent.append(_on_chunk_sent)
    tc.on_connection_reuseconn.append(_on_reuse)
    tc.on_connection_create_end.append(_on_create)
    tc.on_connection_create_start.append(_on_create_start)
    tc.on_dns_resolvehost_start.append(_on_lookup)
    tc.on_dns_cache_hit.append(_on_lookup)
    return tc


def _stamped_socket(addr_info: AddrInfoType) -> socket.socket:
    """The connector's socket factory: a TCP socket, its creation (the start of its connect) stamped on the
    attempt being sent (happy-eyeballs races run in tasks that inherit the attempt's context)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    attempt = _SENDING.get()
    if attempt is not None:
        now = time.perf_counter()
        if attempt.first_socket_at is None:
            attempt.first_socket_at = now
        if attempt.sockets is None:
            attempt.sockets = {}
        attempt.sockets[sock.fileno()] = now
    return sock


def _is_disconnect(exc: BaseException) -> bool:
    """A peer that closed or reset the connection (as opposed to refusing it or timing out).

    aiohttp wraps a write onto a closed socket as `ClientOSError(None, "Can not write request body")`, so the
    cause chain is inspected too.
    """
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 5:
        if isinstance(cur, aiohttp.ClientConnectorError):
            return False
        if isinstance(cur, aiohttp.ServerDisconnectedError | ConnectionResetError | BrokenPipeError):
            return True
        if isinstance(cur, ConnectionAbortedError):
            return True
        if isinstance(cur, OSError) and cur.errno in _DISCONNECT_ERRNOS:
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def _wrap(exc: BaseException, attempt: _Attempt, phase: Phase) -> TransportError:
    """Normalise an aiohttp/OS exception into a TransportError with a bounded kind."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return TransportError("timeout", phase if attempt.connected else "connect", f"timed out: {text}")
    dns_error = getattr(aiohttp, "ClientConnectorDNSError", None)
    if dns_error is not None and isinstance(exc, dns_error):
        return TransportError("dns", "connect", f"DNS lookup failed: {text}")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientConnectorSSLError):
        return TransportError("tls", "connect", f"TLS handshake failed: {text}")
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return TransportError("tls", "connect", f"TLS failed: {text}")
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return TransportError("connect", "connect", f"cannot connect: {text}")
    if _is_disconnect(exc) or isinstance(exc, aiohttp.ClientPayloadError):
        return TransportError("reset", phase, f"connection lost: {text}")
    return TransportError("protocol", phase, f"{type(exc).__name__}: {text}")


class _StampingHandler(ResponseHandler):
    """aiohttp's connection protocol, stamping every socket read as it happens.

    A subclass rather than a patched instance attribute: uvloop binds `data_received` when the connection
    is made, so patching it afterwards would silently stamp nothing (every chunk would carry the
    headers' time). This works on asyncio's loop and on uvloop alike.
    """

    last_rx: float | None = None
    watcher: ReceiveWatcher | None = None  # stamps arrivals off the loop (tokwatch.rxwatch), when given
    setup: ConnectionSetup | None = None  # how this connection was opened
    # The newest response's body reader, and the stamp of the read that completed its headers.
    response_started: tuple[aiohttp.StreamReader, float] | None = None
    _opener: _Attempt | None = None  # the attempt that opened this connection, until it is ready
    _tcp_at: float | None = None  # the TCP connection was up (the protocol was created)
    _unsent_of: _Attempt | None = None  # the attempt whose bytes wait in the transport's buffer
    _fd: int | None = None
    _tracked: aiohttp.StreamReader | None = None
    _marks: deque[tuple[int, float]] | None = None
    _reader: StreamResponse | None = None  # the open response reading the tracked body, told of each read
    _resume_held = False  # resume_reading() calls are being gathered into one (see taking)
    _resume_due = False

    def track(self, content: aiohttp.StreamReader, reader: StreamResponse) -> deque[tuple[int, float]]:
        """Record, for every read from now on, (body bytes fed so far, stamp) of the response `content`, and
        tell `reader` after each one.

        Body bytes fed before this call came with the headers' read(s): they get the latest read's stamp."""
        self._reader = reader
        if content is self._tracked and self._marks is not None:
            return self._marks  # recording since the response's first read
        self._tracked = content
        self._marks = deque()
        if content.total_bytes and self.last_rx is not None:
            self._marks.append((content.total_bytes, self.last_rx))
        return self._marks

    def untrack(self, content: aiohttp.StreamReader) -> None:
        """Stop recording marks of `content` (its response is done with this connection, which may already
        carry the next response: that one's marks stay)."""
        if content is self._tracked:
            self._tracked = None
            self._marks = None
            self._reader = None

    def opened(self, opener: _Attempt | None) -> None:
        """Called by the connector's protocol factory: the TCP connect is done, a TLS handshake not begun."""
        self._opener, self._tcp_at = opener, time.perf_counter()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Note the connection's set-up phases; make the transport report a full flush; register the socket
        with the receive watcher, if any."""
        # Over TLS this is called when the handshake completed (asyncio's and uvloop's SSL protocols alike).
        ready_at = time.perf_counter()
        super().connection_made(transport)
        tls = transport.get_extra_info("ssl_object") is not None
        if isinstance(transport, asyncio.WriteTransport):
            # Pause on any byte the socket did not take and resume only once all of them went out, so
            # resume_writing is when the request's last byte reached the socket (a body larger than the
            # socket buffers leaves as fast as the server reads it). asyncio's loop and uvloop alike.
            # A socket transport pauses above `high` bytes, a TLS transport at `high` or more: with 0 a TLS
            # transport paused on an empty buffer after a write and resumed only at the connection's next
            # read, often the response, which then became t = 0. Over TLS the buffer watched is the TLS
            # layer's: the last byte handed, encrypted, to the socket transport (docs/methodology.md).
            try:
                transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
            except (NotImplementedError, ValueError, AttributeError):
                pass
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else None
        if self._opener is not None and self._tcp_at is not None:
            self.setup = _setup_of(self._opener, self._tcp_at, ready_at, fd, tls=tls)
        self._opener = None  # the connection outlives its first request: it need not keep that attempt
        if self.watcher is not None and fd is not None:
            self._fd = fd
            self.watcher.watch(fd)

    def pause_writing(self) -> None:
        """Bytes stayed in the transport's buffer: note whose (called inside the write, in its context)."""
        super().pause_writing()
        self._unsent_of = _SENDING.get()

    def resume_writing(self) -> None:
        """The buffer is empty: the waiting request's last byte was handed to the socket now."""
        attempt, self._unsent_of = self._unsent_of, None
        if attempt is not None:
            attempt.drained_at = time.perf_counter()
        super().resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Unregister before the fd number can be reused; the open response takes the bytes that arrived
        before aiohttp fails an unfinished body, then learns that it ended."""
        if self.watcher is not None and self._fd is not None:
            self.watcher.forget(self._fd)
            self._fd = None
        reader = self._reader
        if reader is not None:
            reader.settle()
        super().connection_lost(exc)
        if reader is not None:
            reader.wake()

    def resume_reading(self, resume_parser: bool = True) -> None:
        """aiohttp's reader asks this after every chunk it hands out; while a response takes all it holds at
        once (`taking`), the calls are gathered into one at the end, which leaves the same state."""
        if self._resume_held:
            self._resume_due = True
            return
        super().resume_reading(resume_parser)

    @contextlib.contextmanager
    def taking(self) -> Iterator[None]:
        """Gather the reader's resume_reading() calls made inside the block into one after it."""
        self._resume_held, self._resume_due = True, False
        try:
            yield
        finally:
            self._resume_held = False
            if self._resume_due:
                self._resume_due = False
                super().resume_reading()

    def data_received(self, data: bytes) -> None:
        """Stamp, then hand the bytes to aiohttp (piece by piece when the receive watcher split the read)."""
        now = time.perf_counter()
        if not data:  # aiohttp's resume_reading() replays held-back bytes: they keep their read's stamp
            self._feed(data, self.last_rx if self.last_rx is not None else now)
            return
        if self.watcher is None or self._fd is None:
            self._feed(data, now)
            return
        pos = 0
        for n, t in self.watcher.read_at(self._fd, len(data), now):
            self._feed(data[pos : pos + n] if n != len(data) else data, t)
            pos += n

    def _feed(self, data: bytes, stamp: float) -> None:
        self.last_rx = stamp
        super().data_received(data)
        # aiohttp's reader of the response now arriving: record marks from its first read on, before the
        # coroutine waiting for the headers runs (under load that is several reads later).
        payload = getattr(self, "_payload", None)
        if isinstance(payload, aiohttp.StreamReader) and payload is not self._tracked:
            self._tracked, self._marks, self._reader = payload, deque(), None
            self.response_started = (payload, stamp)  # once per response, not per read
        if self._tracked is not None and self._marks is not None:
            fed = self._tracked.total_bytes
            if not self._marks or fed > self._marks[-1][0]:
                self._marks.append((fed, stamp))
            if self._reader is not None:
                self._reader.arrived()


class _StampingConnector(aiohttp.TCPConnector):
    """A TCPConnector whose connections use `_StampingHandler` (with the client's receive watcher)."""

    def __init__(self, *, watcher: ReceiveWatcher | None = None, **kwargs: Any) -> None:
        super().__init__(socket_factory=_stamped_socket, **kwargs)
        loop = self._loop

        def factory() -> _StampingHandler:
            # The loop calls this once the TCP connection is up, before any TLS handshake, in the context of
            # the request that opens the connection.
            handler = _StampingHandler(loop=loop)
            handler.watcher = watcher
            handler.opened(_SENDING.get())
            return handler

        self._factory = factory  # type: ignore[assignment]


class StreamResponse:
    """An open response whose body is read piece by piece with receive timestamps.

    `sent_at` is the request's last byte handed to the socket (see `HttpClient.stream`). Each body piece
    carries the `perf_counter()` taken in the connection protocol's `data_received` (`_StampingHandler`),
    i.e. when the event loop that owns the socket ran that read, not when the reading coroutine resumed:
    parsing queued between the two does not shift it, and bytes merged into one read of the body keep their
    own reads' stamps. A busy or stalled loop does delay `data_received` itself, so bytes that arrived
    meanwhile are stamped late by up to the stall, unless a receive watcher thread (`tokwatch.rxwatch`, the
    bench's closed loops) stamped them at the kernel's notice. Probes avoid that by owning their loop, and
    runs that overlapped a stall are flagged (docs/methodology.md, "Measurement isolation" and
    "Disturbance").

    Since every piece keeps its own stamp, the reading coroutine need not wake for every read: it is woken
    for a batch (see `arrived`), at the end of the body, on a failure, or `FLUSH_S` after the first piece it
    has not seen, so a stream costs a few wake-ups instead of one per token. Pieces come out one by one in
    arrival order either way; what arrived before a failure (a reset, the deadline) comes out before it.

    Network phases (docs/methodology.md, "Network phases"): `connection` is how the connection that carried
    the request was opened, `reused` says whether it was already open (its set-up then happened for an
    earlier request), and `response_at` is when the read that completed the response headers ran.
    """

    def __init__(
        self,
        resp: aiohttp.ClientResponse,
        sent_at: float,
        deadline: float,
        max_bytes: int,
        *,
        send_delay_s: float = 0.0,
        reused: bool = False,
    ) -> None:
        self._resp = resp
        self._content = resp.content
        self._max_bytes = max_bytes
        self.status: int = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self.sent_at = sent_at  # the request's last byte handed to the socket: t = 0 of TTFT and E2E
        self.send_delay_s = send_delay_s  # from calling the client to `sent_at`
        self.headers_at = time.perf_counter()
        self.first_byte_at: float | None = None
        self.last_byte_at: float | None = None
        self.bytes_received = 0
        self._loop = asyncio.get_running_loop()
        # One timer per response instead of one per read: it fails the body stream at the deadline.
        self._timer = self._loop.call_at(deadline, self._expire)
        self._pending: deque[tuple[float, bytes]] = deque()  # pieces taken from the body, not yet yielded
        self._taken = 0  # body bytes moved into `_pending` so far
        self._waiter: asyncio.Future[None] | None = None  # the reading coroutine, while it waits
        self._unseen_reads = 0  # reads since it started waiting
        self.wakeups = 0  # times it was woken for more of the body (diagnostics and tests)
        self._flush: asyncio.TimerHandle | None = None
        proto = resp.connection.protocol if resp.connection is not None else None
        self._proto = proto if isinstance(proto, _StampingHandler) else None
        # A body that arrived whole with the headers has already handed its connection back to the pool (where
        # another request may take it): aiohttp still holds its protocol, read here for this response's
        # set-up and first byte only, never tracked.
        carrier = proto if proto is not None else getattr(resp, "_protocol", None)
        opened = carrier if isinstance(carrier, _StampingHandler) else None
        self.reused = reused
        self.connection: ConnectionSetup | None = opened.setup if opened is not None else None
        started = opened.response_started if opened is not None else None
        reader, stamp = started if started is not None else (None, None)
        self.response_at: float | None = stamp if reader is resp.content else None
        # Per-read marks, so bytes merged into one read of the body keep the times of the reads that brought
        # them; from now on the protocol also tells this response of every read (`arrived`).
        self._marks = self._proto.track(self._content, self) if self._proto is not None else None

    @property
    def processing_s(self) -> float | None:
        """From the request's last byte on the socket (`sent_at`) to the first response byte's read."""
        return None if self.response_at is None else max(0.0, self.response_at - self.sent_at)

    def _expire(self) -> None:
        self.settle()
        self._content.set_exception(TransportError("timeout", "body", "timed out reading the response"))
        self.wake()

    def detach(self) -> None:
        """Stop the timers and let go of the connection (before it returns to the pool)."""
        self._timer.cancel()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._proto is not None:
            self._proto.untrack(self._content)
        self._proto = None
        self._marks = None

    def arrived(self) -> None:
        """A read fed this body (the protocol calls this after it): wake the reading coroutine when it is
        waiting and a batch is due (end of body, a failure, BATCH_READS reads or BATCH_BYTES bytes it has
        not seen); else make sure it wakes FLUSH_S after the first of them at the latest."""
        if self._waiter is None:
            return  # the coroutine is busy with earlier pieces and takes these when it is done
        self._unseen_reads += 1
        content = self._content
        if (
            content.is_eof()
            or content.exception() is not None
            or self._unseen_reads >= BATCH_READS
            or content.total_bytes - self._taken >= BATCH_BYTES
        ):
            self.wake()
        elif self._flush is None:
            self._flush = self._loop.call_at(self._loop.time() + FLUSH_S, self.wake)

    def wake(self) -> None:
        """Wake the reading coroutine, if it waits."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def settle(self) -> None:
        """Move the bytes aiohttp's body reader holds into the pending pieces, each with its read's stamp
        (before a failure is set on the reader, so they come out first)."""
        content = self._content
        if content.total_bytes > self._taken and content.exception() is None:
            if self._proto is not None:
                with self._proto.taking():
                    data = content.read_nowait(-1)
            else:
                data = content.read_nowait(-1)
            if data:
                self._pending.extend(self._pieces(data, self._taken))
                self._taken += len(data)

    async def _next_batch(self) -> None:
        """Fill `_pending` (waiting for a batch if nothing is there); leaves it empty at the end of the body,
        raises the body's failure once every byte that arrived before it was taken."""
        content = self._content
        while True:
            self.settle()
            if self._taken > self._max_bytes:
                raise TransportError("too_large", "body", f"response body exceeds {self._max_bytes} bytes")
            if self._pending:
                return
            exc = content.exception()
            if exc is not None:
                raise exc
            if content.is_eof():
                return
            self._unseen_reads = 0
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            self.wakeups += 1

    async def chunks(self) -> AsyncIterator[tuple[float, bytes]]:
        """Yield `(perf_counter when received, bytes)` as data arrives; enforces the deadline and size cap."""
        length = self._resp.content_length
        if length is not None and length > self._max_bytes:
            raise TransportError(
                "too_large", "body", f"Content-Length {length} exceeds {self._max_bytes} bytes"
            )
        pending = self._pending
        while True:
            if not pending:
                try:
                    await self._next_batch()
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    raise _wrap(exc, _Attempt(connected=True), "body") from exc
                if not pending:
                    return
            t, piece = pending.popleft()
            if self.first_byte_at is None:
                self.first_byte_at = t
            self.last_byte_at = t
            self.bytes_received += len(piece)
            yield t, piece

    def _pieces(self, data: bytes, start: int) -> list[tuple[float, bytes]]:
        """Split `data` (body bytes from offset `start` on) at the reads that delivered them, each piece with
        its read's stamp; without marks, all of it gets the latest read's stamp (or the headers')."""
        end = start + len(data)
        latest = self._proto.last_rx if self._proto is not None else None
        fallback = latest if latest is not None else self.headers_at
        marks = self._marks
        if not marks:
            return [(fallback, data)]
        out: list[tuple[float, bytes]] = []
        pos = start
        while marks and pos < end:
            fed, t = marks[0]
            if fed <= pos:
                marks.popleft()  # bytes already taken
                continue
            cut = min(fed, end)
            out.append((t, data[pos - start : cut - start] if pos > start or cut < end else data))
            pos = cut
            if fed <= end:
                marks.popleft()
        if pos < end:
            out.append((fallback, data[pos - start :]))
        return out

    async def read(self) -> bytes:
        """The whole body (bounded by the size cap)."""
        parts = [data async for _, data in self.chunks()]
        return b"".join(parts)

    async def text(self) -> str:
        """The whole body decoded as UTF-8, invalid bytes replaced."""
        return (await self.read()).decode("utf-8", errors="replace")


class HttpClient:
    """Owns one aiohttp session; create and close it inside a running event loop (`async with`)."""

    def __init__(
        self,
        *,
        limit: int = 100,
        user_agent: str = "tokwatch",
        watch_receives: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._limit = limit
        self._user_agent = user_agent
        # HTTPS endpoints are verified against `ssl_context`'s trust store, else the system's (True).
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        # A thread stamping arrivals independently of this loop's backlog (the bench's many streams).
        self.watcher: ReceiveWatcher | None = None
        if watch_receives and rxwatch.available():
            self.watcher = ReceiveWatcher()
            self.watcher.start()
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        self.stale_resends = 0  # dead pooled connections replaced before a request was sent

    async def __aenter__(self) -> HttpClient:
        self._ensure_session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pooled connections (and stop the receive watcher)."""
        for session in (self._session, self._fresh_session):
            if session is not None:
                await session.close()
        self._session = self._fresh_session = None
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def _new_session(self, *, force_close: bool) -> aiohttp.ClientSession:
        connector = _StampingConnector(
            limit=self._limit, force_close=force_close, watcher=self.watcher, ssl=self._ssl
        )
        return aiohttp.ClientSession(
            connector=connector,
            trace_configs=[_trace_config()],
            timeout=aiohttp.ClientTimeout(total=None),  # deadlines are enforced per request below
            headers={"User-Agent": self._user_agent},
            auto_decompress=True,
        )

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(force_close=False)
        return self._session

    def _ensure_fresh_session(self) -> aiohttp.ClientSession:
        # A connector that never pools: the re-send is guaranteed a brand-new connection.
        if self._fresh_session is None or self._fresh_session.closed:
            self._fresh_session = self._new_session(force_close=True)
        return self._fresh_session

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - the deadline must also cover the stale-connection re-send
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> AsyncIterator[StreamResponse]:
        """Send a request and yield the open response; `timeout` bounds everything up to the last byte.

        A pooled keep-alive connection that turns out dead before any response byte (the server closed it
        while we kept it) is replaced once by a fresh connection; every other failure is raised.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        body = None if json_body is None else json.dumps(json_body).encode()
        send_headers = dict(headers or {})
        if body is not None:
            send_headers.setdefault("Content-Type", "application/json")
        attempt = _Attempt()
        called_at = sent_at = time.perf_counter()
        sending = _SENDING.set(attempt)
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    resp = await self._ensure_session().request(
                        method, url, data=body, headers=send_headers, trace_request_ctx=attempt
                    )
                except (aiohttp.ClientError, OSError) as exc:
                    if not (attempt.reused and _is_disconnect(exc)):
                        raise
                    self.stale_resends += 1
                    attempt = _Attempt()
                    _SENDING.set(attempt)
                    sent_at = time.perf_counter()
                    resp = await self._ensure_fresh_session().request(
                        method, url, data=body, headers=send_headers, trace_request_ctx=attempt
                    )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _wrap(exc, attempt, "response") from exc
        finally:
            _SENDING.reset(sending)
        # t = 0 is when the request's last byte went to the socket: the body's last chunk, or the headers
        # of a request without a body, or, when the socket could not take it all at once, the moment the
        # transport's buffer drained (a server that answers before reading the whole body leaves that
        # unknown here: the chunk's stamp stands). The time before it is send delay.
        sent_at = attempt.body_sent_at or attempt.headers_sent_at or sent_at
        if attempt.drained_at is not None and attempt.drained_at > sent_at:
            sent_at = attempt.drained_at
        delay = max(0.0, sent_at - called_at)
        stream = StreamResponse(resp, sent_at, deadline, max_bytes, send_delay_s=delay, reused=attempt.reused)
        try:
            yield stream
        except BaseException:
            stream.detach()
            resp.close()  # an unfinished body must not go back to the pool
            raise
        else:
            stream.detach()
            resp.release()

    async def get_text(
        self,
        url: str,
        *,
        timeout: float,  # noqa: ASYNC109 - passed through to stream()
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """GET a text document (e.g. /metrics); raises TransportError or HttpStatusError."""
        async with self.stream("GET", url, headers=headers, timeout=timeout, max_bytes=max_bytes) as resp:
            text = await resp.text()
            if not 200 <= resp.status < 300:
                raise HttpStatusError(resp.status, text)
            return text
