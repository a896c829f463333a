"""The one HTTP client shared by probes, the benchmark and the counters scraper: HTTP/1.1 on asyncio's own
protocol layer, so a socket read costs one callback, one framing step and one stamp.

Streaming requests record `time.perf_counter()` when the request's last byte was handed to the socket (the
latency clock starts there; bytes the socket could not take at once count when the transport's buffer drained)
and for every read of the body: the kernel's receive time of its newest segment over plain HTTP where the
platform gives it (`tokwatch.transport.kernel_stamps`), else when the event loop delivered it; with a receive
watcher,
split at the times the kernel signalled each arrival (`tokwatch.transport.rxwatch`). The time from calling
the client to
the send stamp (pool wait, connection set-up, serialisation, a full socket) is reported as the send delay.
Every new connection records how long its DNS lookup, TCP connect, proxy tunnel and TLS handshake took
(`ConnectionSetup`), and every response when the read that brought its headers ran. A request may name its
endpoint's reach settings (`tokwatch.transport.http_route.RouteSource`): its proxy and TLS settings;
connections are
pooled per origin and route. Every request has a total deadline and a cap on
the body size. Transport failures are raised as `TransportError` with a bounded `kind`;
`tokwatch.probes.status`
turns them into run statuses. Bodies are asked for uncoded (`Accept-Encoding: identity`: a compressing server
or proxy holds tokens back to fill its blocks); gzip and deflate are undone when a server codes anyway.
Redirects are not followed: a 3xx is the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Literal, cast

from tokwatch import __version__
from tokwatch.transport import rxwatch
from tokwatch.transport.http_connect import ConnectionSetup, ProxyError, TimedProtocol, open_connection
from tokwatch.transport.http_route import DIRECT, Route, RouteSource
from tokwatch.transport.http_wire import (
    MAX_HEAD_BYTES,
    Body,
    Headers,
    Inflater,
    LengthBody,
    ProtocolError,
    ResponseHead,
    Target,
    body_framing,
    content_decoder,
    encode_request,
    parse_head,
    parse_url,
)
from tokwatch.transport.kernel_stamps import KernelStampedTransport, StampsKeptOn
from tokwatch.transport.kernel_stamps import available as kernel_stamps_available
from tokwatch.transport.rxwatch import ReceiveWatcher

__all__ = ["ConnectionSetup", "HttpClient", "HttpStatusError", "StreamResponse", "TransportError"]

TransportKind = Literal["connect", "dns", "tls", "proxy", "timeout", "reset", "too_large", "protocol"]
Phase = Literal["connect", "response", "body"]

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
# When the coroutine reading a body is woken (StreamResponse.arrived): after this many reads or bytes it has
# not seen, and at the latest this long after the first of them. Stamps are taken per read regardless.
BATCH_READS = 16
BATCH_BYTES = 32 * 1024
FLUSH_S = 0.05
# Body bytes a connection holds for a reader that has not taken them before it stops reading the socket.
HIGH_WATER_BYTES = 256 * 1024
IDLE_TIMEOUT_S = 15.0  # a kept-alive connection unused this long is closed instead of reused
_CLOSE_WAIT_S = 0.25  # close(): how long to let closing connections finish (a TLS close_notify)
PoolKey = tuple[tuple[str, str, int], Route]  # origin and route: which requests a connection may carry
# While a request waits for its answer, the socket's pending error is checked this often: uvloop (libuv's
# uv_poll) drops an EPOLLERR on a descriptor read with add_reader (the kernel-stamped transport) instead of
# calling the reader, so a reset would otherwise be seen only at the deadline (issue 37: 10 of 20 probes).
ALIVE_CHECK_S = 0.25
# Output inflated from a gzip/deflate body per loop turn (about 0.1-0.3 ms of zlib): a bomb's inflation is
# spread over loop turns with the socket's reading paused, instead of one callback of up to the size cap.
INFLATE_BUDGET_BYTES = 128 * 1024


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


class _Stale(Exception):
    """A kept-alive connection was dead before any byte of the answer: the request may be sent again."""


def _connect_error(exc: BaseException) -> TransportError:
    """A failure to open a connection, as a TransportError with a bounded kind."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, socket.gaierror):
        return TransportError("dns", "connect", f"DNS lookup failed: {text}")
    if isinstance(exc, ProxyError):
        return TransportError("proxy", "connect", text)
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return TransportError("tls", "connect", f"TLS handshake failed: {text}")
    return TransportError("connect", "connect", f"cannot connect: {text}")


class _Exchange:
    """One request's answer as the connection receives it: head, then body pieces with their read's stamp."""

    __slots__ = (
        "_head_buf",
        "any_byte",
        "body",
        "buffered",
        "eof",
        "error",
        "head",
        "head_request",
        "inflater",
        "max_bytes",
        "pieces",
        "reader",
        "response_at",
        "total",
        "waiter",
    )

    def __init__(self, waiter: asyncio.Future[None], *, head_request: bool, max_bytes: int) -> None:
        self.waiter = waiter  # resolved when the head arrived, failed when the exchange failed before it
        self.head_request = head_request
        self.max_bytes = max_bytes
        self.head: ResponseHead | None = None
        self.response_at: float | None = None  # the stamp of the read that completed the head
        self.body: Body | None = None
        self.inflater: Inflater | None = None  # a gzip or deflate body, undone in bounded slices
        self.pieces: list[tuple[float, bytes]] = []  # received, not yet taken by the reader
        self.buffered = 0  # bytes in `pieces`
        self.total = 0  # body bytes received
        self.eof = False
        self.error: TransportError | None = None
        self.reader: StreamResponse | None = None
        self.any_byte = False
        self._head_buf = b""

    def fail(self, error: TransportError) -> None:
        """End the exchange with `error` (the first failure stands; a finished body cannot fail)."""
        if self.eof or self.error is not None:
            return
        self.error = error
        if not self.waiter.done():
            self.waiter.set_exception(error)

    def take_head(self, data: bytes, stamp: float) -> bytes | None:
        """Gather head bytes; once the head is complete, set it up and return the bytes after it (None while
        it is incomplete). Interim 1xx answers are skipped."""
        buf = self._head_buf + data if self._head_buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                self._head_buf = buf
                return None
            head = parse_head(buf[:end])
            buf = buf[end + 4 :]
            if 100 <= head.status < 200 and head.status != 101:
                continue  # 100 Continue, 103 Early Hints: the answer follows
            self._head_buf = b""
            self.head, self.response_at = head, stamp
            self.body = body_framing(head, head_request=self.head_request)
            decoder = content_decoder(head)
            self.inflater = None if decoder is None else Inflater(decoder, self.max_bytes)
            if not self.waiter.done():
                self.waiter.set_result(None)
            return buf


class _Connection(TimedProtocol):
    """One HTTP/1.1 connection: stamps every read, frames it, and hands the body pieces to the exchange."""

    def __init__(self, pool: _Pool, key: PoolKey, watcher: ReceiveWatcher | None) -> None:
        self.pool = pool
        self.key = key  # origin and route: which requests this connection may carry
        origin = key[0]
        self.watcher = watcher if origin[0] == "http" else None  # TLS: the socket's bytes are not the body's
        self.made_at: float | None = None
        self.transport: asyncio.Transport | None = None
        self.setup: ConnectionSetup | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reusable = True
        self.idle_since = 0.0
        self.drained_at: float | None = None
        self._fd: int | None = None
        self.write_paused = False  # bytes wait in the transport's buffer
        self._read_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._lost: asyncio.Future[None] | None = None
        self._alive_timer: asyncio.TimerHandle | None = None
        self._inflating = False  # a coded body's inflation continues on the next loop turn

    def begin(self, ex: _Exchange) -> None:
        """Carry `ex` next; its socket's error state is checked every ALIVE_CHECK_S until it ends."""
        self.exchange = ex
        if self._alive_timer is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._alive_timer = loop.call_at(loop.time() + ALIVE_CHECK_S, self._check_alive)

    def _check_alive(self) -> None:
        self._alive_timer = None
        ex = self.exchange
        if ex is None or self.closed or ex.eof or ex.error is not None or self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        try:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if sock is not None else 0
        except (OSError, AttributeError):
            err = 0
        if err:
            # Reading SO_ERROR clears it: the reset is this check's to report, before anything else.
            reason = f"connection lost: [Errno {err}] {os.strerror(err)}"
            ex.fail(TransportError("reset", "body" if ex.head is not None else "response", reason))
            self.reusable = False
            self.transport.abort()
            if ex.reader is not None:
                ex.reader.wake()
            return
        loop = asyncio.get_running_loop()
        self._alive_timer = loop.call_at(loop.time() + ALIVE_CHECK_S, self._check_alive)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Note when the connection was ready (after any TLS handshake); make the transport report a full
        flush; register the socket with the receive watcher, if any."""
        self.made_at = time.perf_counter()
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        tls = transport.get_extra_info("ssl_object") is not None
        # Pause on any byte the socket did not take and resume only once all of them went out, so
        # resume_writing is when the request's last byte reached the socket. A socket transport pauses above
        # `high` bytes, a TLS transport at `high` or more: with 0 a TLS transport paused on an empty buffer
        # after a write and resumed only at the connection's next read. Over TLS the buffer watched is the
        # TLS layer's: the last byte handed, encrypted, to the socket transport (docs/methodology.md).
        with contextlib.suppress(NotImplementedError, ValueError, AttributeError):
            transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
        sock = transport.get_extra_info("socket")
        if self.watcher is not None and sock is not None:
            self._fd = sock.fileno()
            self.watcher.watch(self._fd)

    def pause_writing(self) -> None:
        """Bytes stayed in the transport's buffer."""
        self.write_paused = True

    def resume_writing(self) -> None:
        """The buffer is empty: the request's last byte was handed to the socket now."""
        self.write_paused = False
        self.drained_at = time.perf_counter()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drained(self) -> None:
        """Wait until the transport handed every byte written to the socket (or the connection is lost)."""
        while self.write_paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def data_received(self, data: bytes) -> None:
        """A read from the loop's transport: stamped now."""
        self.data_received_at(data, time.perf_counter())

    def data_received_at(self, data: bytes, stamp: float) -> None:
        """Frame a read stamped `stamp` (piece by piece when the receive watcher split it)."""
        if self._fd is None or self.watcher is None:
            self._feed(data, stamp)
            return
        pos = 0
        for n, t in self.watcher.read_at(self._fd, len(data), stamp):
            self._feed(data[pos : pos + n] if n != len(data) else data, t)
            pos += n

    def _feed(self, data: bytes, stamp: float) -> None:
        ex = self.exchange
        if ex is None or ex.eof or ex.error is not None:
            self.reusable = False  # bytes nobody asked for: this connection's framing cannot be trusted
            return
        ex.any_byte = True
        try:
            if ex.head is None:
                rest = ex.take_head(data, stamp)
                if rest is None:
                    return
                data = rest
            body = ex.body
            assert body is not None
            if data:
                piece = body.feed(data)
                if piece and ex.inflater is not None:
                    ex.inflater.add(stamp, piece)
                    self._inflate(ex)
                elif piece:
                    self._deliver(ex, stamp, piece)
            if body.done and not (ex.inflater is not None and ex.inflater.pending):
                self._finish(ex)
        except (ProtocolError, zlib.error) as exc:
            self.reusable = False
            ex.fail(TransportError("protocol", "body" if ex.head else "response", f"bad response: {exc}"))
        if ex.reader is not None:
            ex.reader.arrived()

    def _deliver(self, ex: _Exchange, stamp: float, piece: bytes) -> None:
        ex.pieces.append((stamp, piece))
        ex.total += len(piece)
        ex.buffered += len(piece)
        if ex.total > ex.max_bytes:
            size = f"response body exceeds {ex.max_bytes} bytes"
            ex.fail(TransportError("too_large", "body", size))
            self._pause_reading()
        elif ex.buffered > HIGH_WATER_BYTES:
            self._pause_reading()

    def _inflate(self, ex: _Exchange) -> None:
        """Inflate one loop turn's share of a coded body; the rest on the next turns, reading paused
        meanwhile, so a bomb never holds the loop (and the stamps of other streams) for long."""
        assert ex.inflater is not None
        for stamp, piece in ex.inflater.step(INFLATE_BUDGET_BYTES):
            self._deliver(ex, stamp, piece)
        if ex.inflater.pending and ex.error is None and not self._inflating:
            self._inflating = True
            self._pause_reading()
            asyncio.get_running_loop().call_soon(self._inflate_later, ex)

    def _inflate_later(self, ex: _Exchange) -> None:
        self._inflating = False
        if ex is not self.exchange or ex.eof or ex.error is not None or ex.inflater is None:
            return
        try:
            self._inflate(ex)
            if not ex.inflater.pending:
                assert ex.body is not None
                if ex.body.done:
                    self._finish(ex)
                elif ex.error is None and ex.buffered <= HIGH_WATER_BYTES:
                    self._resume_reading()
        except zlib.error as exc:
            self.reusable = False
            ex.fail(TransportError("protocol", "body", f"bad response: {exc}"))
        if ex.reader is not None:
            ex.reader.arrived()

    def _finish(self, ex: _Exchange) -> None:
        assert ex.body is not None and ex.head is not None
        if ex.inflater is not None:
            while ex.inflater.pending and ex.error is None:  # a close ended the body: the rest, now
                for stamp, piece in ex.inflater.step(INFLATE_BUDGET_BYTES):
                    self._deliver(ex, stamp, piece)
            tail = ex.inflater.finish()
            if tail:
                self._deliver(ex, ex.pieces[-1][0] if ex.pieces else time.perf_counter(), tail)
            if ex.error is not None:
                return
        if ex.body.extra or not ex.head.keep_alive:
            self.reusable = False
        ex.eof = True

    def take(self, ex: _Exchange) -> list[tuple[float, bytes]]:
        """The pieces received for `ex` since the last call (the socket is read again if it was paused)."""
        pieces, ex.pieces, ex.buffered = ex.pieces, [], 0
        if ex.error is None and not self._inflating:
            self._resume_reading()
        return pieces

    def _resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = False
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """The server closed its side: close ours too (connection_lost follows)."""
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        """Unregister before the fd number can be reused; end the open exchange: a body read until close
        ends here, anything else unfinished was cut short."""
        self.closed = True
        if self.watcher is not None and self._fd is not None:
            self.watcher.forget(self._fd)
            self._fd = None
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._alive_timer is not None:
            self._alive_timer.cancel()
            self._alive_timer = None
        self.pool.lost(self)
        ex = self.exchange
        if ex is None or ex.eof or ex.error is not None:
            return
        reason = f"connection lost: {exc}" if exc is not None else "connection lost: the server closed it"
        if ex.head is None:
            ex.fail(TransportError("reset", "response", reason))
        elif ex.body is not None and (ex.body.done or (exc is None and ex.body.closed())):
            # Framed complete (its inflation still under way), or a clean close (FIN) ending a body read
            # until close; a reset (exc) never ends one.
            try:
                self._finish(ex)
            except zlib.error as err:
                ex.fail(TransportError("protocol", "body", f"bad response: {err}"))
        else:
            ex.fail(TransportError("reset", "body", reason))
        if ex.reader is not None:
            ex.reader.wake()

    def close(self) -> asyncio.Future[None] | None:
        """Close the connection; returns a future done when it is lost (None if it already is)."""
        if self.closed or self.transport is None:
            return None
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
        self.transport.close()
        return self._lost


class _Pool:
    """Kept-alive connections per origin, at most `limit` open at once (0: no limit)."""

    def __init__(
        self,
        limit: int,
        watcher: ReceiveWatcher | None,
        ssl_context: ssl.SSLContext | None,
        *,
        kernel_stamps: bool,
    ) -> None:
        self._limit = limit
        self._kernel_stamps = kernel_stamps
        # Keeps the kernel stamping between connections (see StampsKeptOn), while the pool lives.
        self._stamps_on = StampsKeptOn() if kernel_stamps else None
        self._watcher = watcher
        self._ssl: ssl.SSLContext | None = ssl_context
        self._idle: dict[PoolKey, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _tls_context(self) -> ssl.SSLContext:
        # HTTPS endpoints are verified against the given context's trust store, else the system's.
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _room(self) -> bool:
        return not self._limit or len(self._open) + self._opening < self._limit

    async def acquire(self, target: Target, route: Route, *, fresh: bool) -> tuple[_Connection, bool]:
        """A connection to the target's origin by `route` and whether it was kept alive from an earlier
        request; `fresh` opens a new one. Waits for room under the limit; raises TransportError when it
        cannot connect."""
        while True:
            if not fresh:
                idle = self._idle.get((target.origin, route))
                now = time.perf_counter()
                while idle:
                    conn = idle.pop()
                    if conn.closed or conn.transport is None or conn.transport.is_closing():
                        continue
                    if now - conn.idle_since > IDLE_TIMEOUT_S:
                        conn.close()
                        continue
                    return conn, True
            if self._room():
                return await self._connect(target, route), False
            if fresh and self._close_one_idle():
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _close_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                idle.pop(0).close()
                return True
        return False

    async def _connect(self, target: Target, route: Route) -> _Connection:
        self._opening += 1
        try:
            tls = (route.ssl_context or self._tls_context()) if target.scheme == "https" else None
            conn, setup = await open_connection(
                lambda: _Connection(self, (target.origin, route), self._watcher),
                target.host,
                target.port,
                ssl_context=tls,
                kernel_stamps=self._kernel_stamps,
                proxy=route.proxy,
                server_name=route.server_name,
            )
        except (OSError, ssl.CertificateError) as exc:
            error = _connect_error(exc)
            if route.proxy is not None and error.kind in ("connect", "dns"):  # the proxy's name or port
                error = TransportError(error.kind, "connect", f"proxy {route.proxy.shown}: {error}")
            raise error from exc
        finally:
            self._opening -= 1
            self._wake_one()
        conn.setup = setup
        self._open.add(conn)
        return conn

    def release(self, conn: _Connection, *, reusable: bool) -> None:
        """A request is done with `conn`: keep it for the next one, or close it."""
        conn.exchange = None
        if reusable and conn.reusable and not conn.closed and conn in self._open:
            conn.idle_since = time.perf_counter()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()
            self._open.discard(conn)
        self._wake_one()

    def lost(self, conn: _Connection) -> None:
        """`conn` closed (either side): forget it."""
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every connection and give them a moment to finish closing."""
        closing = [f for f in (conn.close() for conn in list(self._open)) if f is not None]
        self._idle.clear()
        self._open.clear()
        if self._stamps_on is not None:
            self._stamps_on.close()
        if closing:
            await asyncio.wait(closing, timeout=_CLOSE_WAIT_S)


class StreamResponse:
    """An open response whose body is read piece by piece with receive timestamps.

    `sent_at` is the request's last byte handed to the socket (see `HttpClient.stream`). Each body piece
    carries the `perf_counter()` taken in the connection's `data_received`, i.e. when the event loop that
    owns the socket ran that read, not when the reading coroutine resumed: parsing queued between the two
    does not shift it, and every read keeps its own stamp. A busy or stalled loop does delay
    `data_received` itself, so bytes that arrived meanwhile are stamped late by up to the stall, unless the
    read carries the kernel's receive time (plain HTTP on Linux: `tokwatch.transport.kernel_stamps`) or a
    receive
    watcher thread (`tokwatch.transport.rxwatch`) stamped them at the kernel's notice. Runs that overlapped a
    stall are flagged (docs/methodology.md, "Measurement isolation" and "Disturbance").

    Since every piece keeps its own stamp, the reading coroutine need not wake for every read: it is woken
    for a batch (see `arrived`), at the end of the body, on a failure, or `FLUSH_S` after the first piece it
    has not seen, so a stream costs a few wake-ups instead of one per token. Pieces come out in arrival
    order either way, one by one (`chunks`) or as the batch each wake-up found (`batches`); what arrived
    before a failure (a reset, the deadline) comes out before it.

    Network phases (docs/methodology.md, "Network phases"): `connection` is how the connection that carried
    the request was opened, `reused` says whether it was already open (its set-up then happened for an
    earlier request), and `response_at` is when the read that completed the response headers ran.
    """

    def __init__(
        self,
        conn: _Connection,
        exchange: _Exchange,
        sent_at: float,
        deadline: float,
        *,
        send_delay_s: float = 0.0,
        reused: bool = False,
    ) -> None:
        head = exchange.head
        assert head is not None
        self._conn = conn
        self._ex = exchange
        self.status: int = head.status
        self.headers: Headers = head.headers
        self.sent_at = sent_at  # the request's last byte handed to the socket: t = 0 of TTFT and E2E
        self.send_delay_s = send_delay_s  # from calling the client to `sent_at`
        self.headers_at = time.perf_counter()
        self.first_byte_at: float | None = None
        self.last_byte_at: float | None = None
        self.bytes_received = 0
        self.reused = reused
        self.connection: ConnectionSetup | None = conn.setup
        # Whether the receive watcher stamped the reads (plain HTTP with a watcher; never over TLS).
        self.watched = conn.watcher is not None
        # Whether each read carries the kernel's receive time of its newest segment (plain HTTP on Linux).
        self.kernel_stamped = isinstance(conn.transport, KernelStampedTransport)
        self.response_at: float | None = exchange.response_at
        self.wakeups = 0  # times the reader was woken for more of the body (diagnostics and tests)
        self._loop = asyncio.get_running_loop()
        # One timer per response instead of one per read: it fails the body stream at the deadline.
        self._timer = self._loop.call_at(deadline, self._expire)
        self._waiter: asyncio.Future[None] | None = None  # the reading coroutine, while it waits
        self._unseen_reads = 0  # reads since it started waiting
        self._flush: asyncio.TimerHandle | None = None
        exchange.reader = self

    @property
    def processing_s(self) -> float | None:
        """From the request's last byte on the socket (`sent_at`) to the first response byte's read."""
        return None if self.response_at is None else max(0.0, self.response_at - self.sent_at)

    @property
    def complete(self) -> bool:
        """The whole body arrived (the connection may carry another request)."""
        return self._ex.eof and self._ex.error is None

    def _expire(self) -> None:
        self._ex.fail(TransportError("timeout", "body", "timed out reading the response"))
        self.wake()

    def detach(self) -> None:
        """Stop the timers and let go of the exchange (before the connection is reused or closed)."""
        self._timer.cancel()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._ex.reader = None

    def arrived(self) -> None:
        """A read fed this body (the connection calls this after it): wake the reading coroutine when it is
        waiting and a batch is due (end of body, a failure, BATCH_READS reads or BATCH_BYTES bytes it has
        not seen); else make sure it wakes FLUSH_S after the first of them at the latest."""
        if self._waiter is None:
            return  # the coroutine is busy with earlier pieces and takes these when it is done
        self._unseen_reads += 1
        ex = self._ex
        if ex.eof or ex.error is not None or self._unseen_reads >= BATCH_READS or ex.buffered >= BATCH_BYTES:
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

    async def chunks(self) -> AsyncIterator[tuple[float, bytes]]:
        """Yield `(perf_counter when received, bytes)` as data arrives; enforces the deadline and size cap."""
        async for batch in self.batches():
            for piece in batch:
                yield piece

    async def batches(self) -> AsyncIterator[list[tuple[float, bytes]]]:
        """`chunks` a batch at a time: the pieces that arrived since the last batch (never none), in arrival
        order. The consumer resumes once per batch instead of once per read, which a bench pays per token."""
        ex = self._ex
        if isinstance(ex.body, LengthBody) and ex.body.length > ex.max_bytes:
            cap = ex.max_bytes
            raise TransportError("too_large", "body", f"Content-Length {ex.body.length} exceeds {cap} bytes")
        while True:
            error = ex.error
            if error is not None and error.kind == "too_large":
                raise error
            pieces = self._conn.take(ex)
            if pieces:
                if self.first_byte_at is None:
                    self.first_byte_at = pieces[0][0]
                self.last_byte_at = pieces[-1][0]
                self.bytes_received += sum(len(piece) for _, piece in pieces)
                yield pieces
                continue
            if error is not None:
                raise error
            if ex.eof:
                return
            self._unseen_reads = 0
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            self.wakeups += 1

    async def read(self) -> bytes:
        """The whole body (bounded by the size cap)."""
        parts = [data async for _, data in self.chunks()]
        return b"".join(parts)

    async def text(self) -> str:
        """The whole body decoded as UTF-8, invalid bytes replaced."""
        return (await self.read()).decode("utf-8", errors="replace")


USER_AGENT = f"tokwatch/{__version__}"  # what a provider's logs name the prober by, with its version


class HttpClient:
    """A pool of HTTP/1.1 connections; create and close it inside a running event loop (`async with`)."""

    def __init__(
        self,
        *,
        limit: int = 100,
        user_agent: str = USER_AGENT,
        watch_receives: bool = False,
        kernel_stamps: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._limit = limit
        self._ssl_context = ssl_context
        # Sent with every request unless the caller gives the same field (lower-cased name -> (name, value)).
        self._defaults = {
            "user-agent": ("User-Agent", user_agent),
            "accept": ("Accept", "*/*"),
            "accept-encoding": ("Accept-Encoding", "identity"),
        }
        # A thread stamping arrivals independently of this loop's backlog (the bench's many streams).
        self.watcher: ReceiveWatcher | None = None
        if watch_receives and rxwatch.available():
            self.watcher = ReceiveWatcher()
            self.watcher.start()
        # Plain-HTTP reads stamped with the kernel's receive time where the platform gives it.
        self.kernel_stamps = kernel_stamps and kernel_stamps_available()
        self._pool: _Pool | None = None
        self._targets: dict[str, Target] = {}
        self.stale_resends = 0  # dead kept-alive connections replaced before a request was sent

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections (and stop the receive watcher)."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            try:
                target = parse_url(url)
            except ValueError as exc:
                raise TransportError("connect", "connect", f"cannot connect: {exc}") from exc
            if len(self._targets) < 256:  # a handful of endpoint URLs in practice; never unbounded
                self._targets[url] = target
        return target

    def _request(
        self,
        method: str,
        target: Target,
        headers: Mapping[str, str] | None,
        body: bytes | None,
        route: Route = DIRECT,
    ) -> bytes:
        fields = dict(self._defaults)
        for name, value in (headers or {}).items():
            fields[name.lower()] = (name, value)
        if body is not None and "content-type" not in fields:
            fields["content-type"] = ("Content-Type", "application/json")
        fields.pop("content-length", None)
        fields.pop("host", None)
        fields.pop("proxy-authorization", None)
        if route.proxy is not None and target.scheme == "http":
            # Plain HTTP through a proxy: the absolute form names the origin (RFC 9112 3.2.2); an HTTPS
            # origin's requests go inside the tunnel unchanged.
            target = replace(target, path=f"http://{target.host_header}{target.path}")
            if route.proxy.authorization is not None:
                fields["proxy-authorization"] = ("Proxy-Authorization", route.proxy.authorization)
        return encode_request(method, target, dict(fields.values()), body)

    async def _send(
        self, conn: _Connection, data: bytes, *, head_request: bool, max_bytes: int, reused: bool
    ) -> tuple[_Exchange, float]:
        """Write the request on `conn` and wait for the answer's head; returns it and the send stamp."""
        loop = asyncio.get_running_loop()
        ex = _Exchange(loop.create_future(), head_request=head_request, max_bytes=max_bytes)
        conn.begin(ex)
        transport = conn.transport
        if transport is None or conn.closed or transport.is_closing():
            raise (
                _Stale() if reused else TransportError("reset", "response", "connection lost before sending")
            )
        try:
            # Stamped before the write, not after it: on loopback the kernel delivers the bytes to the server
            # inside the send call, so a stamp after it can follow the server's arrival (TTFT err -0.14 ms
            # p50 at c=1 against refserver's kernel stamps); a write the socket cannot take at once is
            # stamped when it drained (below).
            sent_at = time.perf_counter()
            transport.write(data)
            if conn.write_paused:
                await conn.drained()
                if conn.drained_at is not None and conn.drained_at > sent_at:
                    sent_at = conn.drained_at
            await ex.waiter
        except TransportError as exc:
            if reused and not ex.any_byte and exc.kind == "reset":
                raise _Stale() from exc
            raise
        except (OSError, RuntimeError) as exc:
            if reused and not ex.any_byte:
                raise _Stale() from exc
            raise TransportError("reset", "response", f"connection lost: {exc}") from exc
        finally:
            if ex.waiter.done() and not ex.waiter.cancelled():
                ex.waiter.exception()  # retrieved here, whatever path raised
        return ex, sent_at

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
        reach: RouteSource | None = None,
    ) -> AsyncIterator[StreamResponse]:
        """Send a request and yield the open response; `timeout` bounds everything up to the last byte;
        `reach`: the endpoint's proxy and TLS settings (None: straight, the system's trust store).

        A kept-alive connection that turns out dead before any response byte (the server closed it while we
        kept it) is replaced once by a fresh connection; every other failure is raised.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        target = self._target(url)
        route = DIRECT if reach is None else reach.route(target.scheme, target.host, target.port)
        body = None if json_body is None else json.dumps(json_body).encode()
        data = self._request(method, target, headers, body, route)
        if self._pool is None:
            self._pool = _Pool(self._limit, self.watcher, self._ssl_context, kernel_stamps=self.kernel_stamps)
        pool = self._pool
        head_request = method.upper() == "HEAD"
        called_at = time.perf_counter()
        conn: _Connection | None = None
        try:
            async with asyncio.timeout_at(deadline):
                conn, reused = await pool.acquire(target, route, fresh=False)
                try:
                    ex, sent_at = await self._send(
                        conn, data, head_request=head_request, max_bytes=max_bytes, reused=reused
                    )
                except _Stale:
                    self.stale_resends += 1
                    pool.release(conn, reusable=False)
                    conn = None
                    conn, reused = await pool.acquire(target, route, fresh=True)
                    ex, sent_at = await self._send(
                        conn, data, head_request=head_request, max_bytes=max_bytes, reused=False
                    )
        except BaseException as exc:
            if conn is not None:
                pool.release(conn, reusable=False)
            if isinstance(exc, TimeoutError):
                phase: Phase = "connect" if conn is None else "response"
                raise TransportError("timeout", phase, "timed out") from exc
            raise
        proxy = route.proxy
        if proxy is not None and target.scheme == "http" and ex.head is not None and ex.head.status == 407:
            # The proxy's refusal, not the endpoint's answer: unreachable as a refused tunnel is.
            pool.release(conn, reusable=False)
            refusal = f"proxy {proxy.shown} refused the request: HTTP 407 {ex.head.reason}"
            raise TransportError("proxy", "connect", refusal)
        # t = 0 is when the request's last byte went to the socket; the time before it is send delay.
        stream = StreamResponse(
            conn, ex, sent_at, deadline, send_delay_s=max(0.0, sent_at - called_at), reused=reused
        )
        try:
            yield stream
        except BaseException:
            stream.detach()
            pool.release(conn, reusable=False)  # an unfinished body must not go back to the pool
            raise
        else:
            stream.detach()
            pool.release(conn, reusable=stream.complete)

    async def get_text(
        self,
        url: str,
        *,
        timeout: float,  # noqa: ASYNC109 - passed through to stream()
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: Mapping[str, str] | None = None,
        reach: RouteSource | None = None,
    ) -> str:
        """GET a text document (e.g. /metrics); raises TransportError or HttpStatusError."""
        async with self.stream(
            "GET", url, headers=headers, timeout=timeout, max_bytes=max_bytes, reach=reach
        ) as resp:
            text = await resp.text()
            if not 200 <= resp.status < 300:
                raise HttpStatusError(resp.status, text)
            return text
