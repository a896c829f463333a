"""Reads stamped by the kernel: a plain-TCP asyncio transport whose every read carries the receive time the
kernel gave its newest segment (`SO_TIMESTAMPNS`, read as `recvmsg` ancillary data).

asyncio's and uvloop's socket transports read with `recv`, which drops that time, so a stamp taken in
`data_received` is when the event loop got to the socket: behind every callback queued before it. This
transport reads the socket itself (non-blocking, on the loop's reader callback) and hands the protocol each
read with the kernel's time of the last segment it took. Every byte of a read had arrived by then, so the
stamp is never earlier than an arrival and never later than the loop's own stamp; a read that took several
segments (the loop came late) gets the newest one's time. Writes go straight to the socket; bytes it cannot
take wait in a buffer flushed on the writer callback, with asyncio's flow-control calls
(`pause_writing`/`resume_writing` around the write buffer limits).

Linux only (`available()`); elsewhere, and over TLS, connections keep the loop's transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from typing import Any, Protocol

# Not exported by Python's socket module; the asm-generic Linux value (x86-64, arm64). SCM_ equals SO_.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # one struct timespec
# What one read may take. Not asyncio's 256 KiB: allocating that per read costs ~12 us more than 64 KiB
# (benchmarks/read_size.py: 15.2 against 3.1 us per 300-byte send + read).
_READ_SIZE = 64 * 1024
_TIMESPEC = struct.Struct("qq")


def available() -> bool:
    """Whether this platform gives TCP reads the kernel's receive time."""
    return sys.platform.startswith("linux") and hasattr(socket.socket, "recvmsg") and _ANC_SIZE > 0


class StampsKeptOn:
    """One idle socket that asks for receive stamps, so the kernel keeps stamping while it is open.

    Linux turns receive stamping on for the whole system when the first socket asks for it, through deferred
    work, and off again when the last such socket closes. A segment that arrives in between carries no stamp
    and its read falls back to the loop's time: the first read of a connection opened when no other socket
    wanted stamps. Here that was 1 in 20 fresh processes' first connection, and 6 to 15 in 30 connections
    each opened 10 ms after the last closed (`tests/transport/test_kernel_stamps.py`): an exporter whose idle
    connections close between probes is in that case at every probe. Held from the first request to `close()`.
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        if not available():
            return
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:
            return  # no descriptor to spare: reads keep what stamps they get
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            sock.close()  # a kernel that refuses: as above
        else:
            self._sock = sock

    @property
    def holding(self) -> bool:
        """Whether the socket is open and asking."""
        return self._sock is not None

    def close(self) -> None:
        """Let the kernel turn stamping off again when no other socket wants it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class StampedReceiver(Protocol):
    """What the transport hands its reads to (`asyncio.Protocol` plus the stamped read)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received_at(self, data: bytes, stamp: float) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


class KernelStampedTransport(asyncio.Transport):
    """A connected plain-TCP socket on the running loop; `start()` makes the connection (see the module)."""

    def __init__(self, sock: socket.socket, protocol: StampedReceiver) -> None:
        extra: dict[str, Any] = {"socket": sock}
        with contextlib.suppress(OSError):
            extra["peername"], extra["sockname"] = sock.getpeername(), sock.getsockname()
        super().__init__(extra=extra)
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._buffer = bytearray()  # written, not yet taken by the socket
        self._high = self._low = 0
        self.set_write_buffer_limits()
        self._writing_paused = False  # the protocol was told to pause writing
        self._reading = False
        self._closing = False
        self._lost = False
        self._floor = 0.0  # no stamp before this (a wall-clock step cannot move one before its request)
        self.kernel_reads = 0  # reads that carried the kernel's time (for tests and diagnostics)

    def start(self) -> None:
        """Configure the socket, tell the protocol the connection is made and start reading."""
        self._sock.setblocking(False)
        self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        with contextlib.suppress(OSError):  # as asyncio's transports: requests go out at once
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._floor = time.perf_counter()
        self._protocol.connection_made(self)
        if not self._closing:
            self.resume_reading()

    # reading

    def is_reading(self) -> bool:
        """Whether the socket is being read."""
        return self._reading

    def pause_reading(self) -> None:
        """Stop reading until `resume_reading` (the kernel's buffer, then the server, hold the bytes)."""
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        """Read again."""
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self._sock.recvmsg(_READ_SIZE, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        if not data:
            self.pause_reading()
            if not self._protocol.eof_received():
                self.close()
            return
        # The wall clock first: the age below then errs short, so the stamp errs late, never early. In
        # integer nanoseconds: a float time.time() has a grain of ~0.24 us at today's epoch.
        real_ns = time.time_ns()
        now = stamp = time.perf_counter()
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                # CLOCK_REALTIME to perf_counter's clock: how long ago it arrived, by the wall clock now.
                ago_ns = real_ns - (sec * 1_000_000_000 + nsec)
                if ago_ns > 0:
                    stamp = now - ago_ns * 1e-9
                self.kernel_reads += 1
        if stamp < self._floor:
            stamp = self._floor
        self._floor = stamp
        self._protocol.data_received_at(data, stamp)

    # writing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hand `data` to the socket; what it cannot take now is buffered and flushed when it can."""
        if self._closing or self._lost or not data:
            return
        if not self._buffer:
            self._floor = max(self._floor, time.perf_counter())
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if n == len(data):
                return
            self._loop.add_writer(self._fd, self._on_writable)
            data = memoryview(data)[n:]
        self._buffer += data
        if not self._writing_paused and len(self._buffer) > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def _on_writable(self) -> None:
        try:
            n = self._sock.send(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del self._buffer[:n]
        if self._buffer:
            return
        self._loop.remove_writer(self._fd)
        if self._writing_paused:
            self._writing_paused = False
            self._protocol.resume_writing()
        if self._closing:
            self._lost = True
            self._loop.call_soon(self._connection_lost, None)

    def can_write_eof(self) -> bool:
        """A plain socket can half-close, but an HTTP/1.1 client never does."""
        return False

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet taken by the socket."""
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """The (low, high) flow-control marks."""
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Pause the protocol's writing above `high` buffered bytes, resume at `low` (asyncio's semantics,
        here resumed once the buffer is empty)."""
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low
        if not 0 <= self._low <= self._high:
            raise ValueError(f"high ({self._high}) must be >= low ({self._low}) must be >= 0")

    # closing

    def is_closing(self) -> bool:
        """Whether `close()` or a failure began closing the connection."""
        return self._closing

    def close(self) -> None:
        """Close once the buffered bytes went out; the protocol's `connection_lost(None)` follows."""
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        if not self._buffer:
            self._lost = True
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """Close now, dropping buffered bytes."""
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._closing = self._lost = True
        self.pause_reading()
        if self._buffer:
            self._buffer.clear()
            self._loop.remove_writer(self._fd)
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_protocol(self) -> Any:
        """The protocol this transport reads for."""
        return self._protocol
