"""A ground-truth reference server for TTFT: kernel arrival stamps, a fixed token schedule, a truth log.

OpenAI-compatible streaming chat completions (`POST /v1/chat/completions`: SSE `data:` chunks, a `usage`
chunk with `completion_tokens`, `data: [DONE]`), keep-alive, on one of two engines: `threads` (blocking
sockets, a thread per connection: every due write waits for the interpreter lock, so on 2 cores it
saturates at ~500-700 req/s of 32 tokens) or `loop` (`--engine loop`, `LoopRefServer`: every connection
non-blocking on one thread in epoll, the due writes in a heap; it holds 1,600 req/s on the same 2 cores).
Each request's **arrival** is the kernel's receive time of the segment carrying its last byte
(`SO_TIMESTAMPNS`, read from `recvmsg` ancillary data), not when this process got to read it. Tokens follow a
fixed schedule from that arrival: the first at `ttft_s`, then one every `gap_s`, `max_tokens` of them (default
`tokens`); due times are absolute (a late write does not delay the next one), and each write is stamped with
`time.perf_counter()` right after its `send` returned (on loopback the bytes are then in the client's
socket buffer; on the loop engine, a write the socket could not take whole is stamped when its last byte
was). The loop engine waits for a due write in epoll to the millisecond below it, then sleeps the rest.
Every answer carries `x-request-id`, which `tokwatch bench` records as `server_request_id`.

Clocks: the kernel stamps with CLOCK_REALTIME; they are converted to `time.perf_counter()` seconds by an
offset measured at start (the tightest of many `perf_counter_ns()`, `time_ns()`, `perf_counter_ns()`
brackets). On Linux `perf_counter` is CLOCK_MONOTONIC, one clock for every process on the machine, so the
truth log compares directly with a client's perf_counter stamps; `GET /clock` re-measures the offset, so a
step of the wall clock during a run (NTP) is visible. Linux only (`SO_TIMESTAMPNS` = 35 on x86-64, arm64).

    python benchmarks/refserver.py --port 8123 [--engine loop --ttft 0.1 --gap 0.02 --tokens 128 \
        --truth-log truth.jsonl]

prints the port it listens on (useful with `--port 0`), serves until SIGTERM/SIGINT, then writes the truth
log. `GET /truth` returns it as JSON lines at any time: request_id, arrival_perf_s, first_write_perf_s,
last_write_perf_s, writes, write_perf_s (every token's write), tail_write_perf_s (and the fields of `Truth`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import heapq
import itertools
import json
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Not exported by Python's socket module; the asm-generic Linux values (SCM_* equals SO_* for these).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_ANC_SIZE = socket.CMSG_SPACE(16)  # one struct timespec (two 64-bit fields)
_RECV_SIZE = 256 * 1024
_MAX_HEAD = 64 * 1024
_MAX_TOKENS_CAP = 100_000


def clock_offset_ns(samples: int = 2000) -> tuple[int, int]:
    """(CLOCK_REALTIME - perf_counter, bracket width) in ns: the tightest of `samples` bracketed reads."""
    best_offset, best_width = 0, None
    for _ in range(samples):
        a = time.perf_counter_ns()
        r = time.time_ns()
        b = time.perf_counter_ns()
        if best_width is None or b - a < best_width:
            best_offset, best_width = r - (a + b) // 2, b - a
    assert best_width is not None
    return best_offset, best_width


@dataclass(slots=True)
class Truth:
    """What really happened to one request (perf_counter seconds, comparable across processes)."""

    request_id: str
    connection: int
    arrival_perf_s: float  # the kernel's receive time of the segment carrying the request's last byte
    arrival_source: str  # "kernel", or "user" when no timestamp came with the read (perf_counter after it)
    head_arrival_perf_s: float  # the same for the request's first bytes
    read_perf_s: float  # when this server's recvmsg returned that last byte (its own lag after arrival)
    tokens: int
    first_write_perf_s: float | None = None  # right after the first token's send returned
    first_write_start_perf_s: float | None = None  # right before it: the write happened in between
    last_write_perf_s: float | None = None
    writes: int = 0  # token chunks written
    max_write_late_s: float = 0.0  # largest lateness of a write against its due time (server's own jitter)
    max_write_late_at_perf_s: float | None = None  # when that write happened (one stall hits every stream)
    completed: bool = False
    # Every token's write, as `last_write_perf_s` (right after its last byte was handed to the kernel), in
    # token order: the true per-token gaps a client's inter-token latency is compared with.
    write_perf_s: list[float] = field(default_factory=list)
    # ... and right before each send: a server preempted around its send wrote in between (the truth's own
    # uncertainty, as first_write_start_perf_s).
    write_start_perf_s: list[float] = field(default_factory=list)
    tail_write_perf_s: float | None = None  # the same for the answer's end (usage, [DONE], the last chunk)
    tail_write_start_perf_s: float | None = None

    def wrote(self, before: float, written: float, due: float) -> None:
        """A token's write: started at `before`, its last byte handed to the kernel at `written`."""
        if self.first_write_perf_s is None:
            self.first_write_perf_s, self.first_write_start_perf_s = written, before
        self.last_write_perf_s = written
        self.write_perf_s.append(written)
        self.write_start_perf_s.append(before)
        self.writes += 1
        if self.max_write_late_at_perf_s is None or written - due > self.max_write_late_s:
            self.max_write_late_s, self.max_write_late_at_perf_s = written - due, written


class Answer:
    """The bytes of one streamed answer: head, token chunks (JSON encoded once per kind), usage and end."""

    def __init__(self, rid: str, model: str, n: int, prompt_tokens: int) -> None:
        self.n = n
        created = int(time.time())
        self.head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nx-request-id: " + rid.encode() + b"\r\n\r\n"
        )

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            return b"data: " + json.dumps({**obj, "choices": choices, **extra}).encode() + b"\n\n"

        def chunk(delta: dict[str, str], finish: str | None) -> bytes:
            return _http_chunk(event([{"index": 0, "delta": delta, "finish_reason": finish}]))

        first = {"content": "tok ", "role": "assistant"}
        self._first = chunk(first, "length" if n == 1 else None)
        self._middle = chunk({"content": "tok "}, None)
        self._last = chunk({"content": "tok "}, "length")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        self.tail = _http_chunk(event([], usage=usage) + b"data: [DONE]\n\n") + b"0\r\n\r\n"

    def token(self, k: int) -> bytes:
        """Token k's HTTP chunk (k from 0)."""
        return self._first if k == 0 else self._last if k == self.n - 1 else self._middle


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrival_ns: int | None
    head_arrival_ns: int | None
    read_perf_s: float


@dataclass(slots=True)
class _Reply:
    """What a request gets: bytes to send now, whether the connection stays open, and for a stream its
    token schedule (the tokens follow `data`, the answer's head)."""

    data: bytes
    keep: bool
    stream: tuple[Truth, Answer] | None = None


def _split_head(buf: bytes) -> tuple[str, str, dict[str, str], int, bytes] | None:
    """(method, path, headers, Content-Length, bytes after the head) once `buf` holds a whole head."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = [*lines[0].split(" "), "", ""][:3]
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return method, path, headers, int(headers.get("content-length", "0") or 0), rest


def _recv(sock: socket.socket) -> tuple[bytes, int | None]:
    """One read, and the kernel's receive time (CLOCK_REALTIME ns) of the last segment it read from."""
    data, anc, _flags, _addr = sock.recvmsg(_RECV_SIZE, _ANC_SIZE)
    stamp = None
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(cdata) >= 16:
            sec, nsec = struct.unpack("qq", cdata[:16])
            stamp = sec * 1_000_000_000 + nsec
    return data, stamp


class RefServer:
    """The reference server, one thread per connection; `start()` serves on a background thread, `stop()`
    closes everything. `LoopRefServer` is the same server on one thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ttft_s: float = 0.1,
        gap_s: float = 0.02,
        tokens: int = 128,
        model: str = "ref",
        max_connections: int | None = None,
    ) -> None:
        self.ttft_s, self.gap_s, self.tokens, self.model = ttft_s, gap_s, tokens, model
        # A thread per connection: a client that falls behind opens ever more of them, and thousands of
        # threads would take the machine down with the run. At the cap, new connections wait in the backlog.
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections) if max_connections else None
        self.offset_ns, self.offset_width_ns = clock_offset_ns()
        self._listener = socket.create_server((host, port), backlog=1024)
        # Inherited by accepted sockets; also switches on the kernel's receive timestamping.
        self._listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._listener.settimeout(0.2)  # so the accept loop notices stop()
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._truth: list[Truth] = []
        self._conns: dict[int, socket.socket] = {}
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self.serve_forever, name="refserver", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> RefServer:
        """Serve on a background thread."""
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Accept connections until stop(), a thread each."""
        for index in itertools.count():
            if self._stop.is_set():
                return
            if self._slots is not None and not self._slots.acquire(timeout=0.2):
                continue
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                self._release()
                continue
            except OSError:
                self._release()
                return  # listener closed
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            with self._lock:
                self._conns[index] = sock
            threading.Thread(target=self._serve_conn, args=(sock, index), daemon=True).start()

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stop.set()
        self._listener.close()
        with self._lock:
            conns = list(self._conns.values())
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(5)

    # -- truth -------------------------------------------------------------------------------------------

    def truth(self) -> list[Truth]:
        """Every request seen so far."""
        with self._lock:
            return list(self._truth)

    def truth_jsonl(self) -> str:
        """The truth log as JSON lines."""
        return "".join(json.dumps(asdict(t)) + "\n" for t in self.truth())

    def clock(self) -> dict[str, Any]:
        """The clock offset measured at start and now (they differ only if the wall clock was stepped)."""
        now, width = clock_offset_ns(500)
        return {
            "realtime_minus_perf_ns_start": self.offset_ns,
            "start_bracket_ns": self.offset_width_ns,
            "realtime_minus_perf_ns_now": now,
            "now_bracket_ns": width,
            "drift_ns": now - self.offset_ns,
        }

    def _perf_s(self, realtime_ns: int) -> float:
        return (realtime_ns - self.offset_ns) / 1e9

    # -- what a request gets (both engines) --------------------------------------------------------------

    def _request(
        self, buf: bytes, arrival_ns: int | None, head_ns: int | None
    ) -> tuple[_Request, bytes] | None:
        """The request at the start of `buf` once its body is there too, and the bytes after it."""
        split = _split_head(buf)
        if split is None:
            return None
        method, path, headers, length, rest = split
        if len(rest) < length:
            return None
        req = _Request(method, path, headers, rest[:length], arrival_ns, head_ns, time.perf_counter())
        return req, rest[length:]

    def _reply(self, index: int, req: _Request) -> _Reply:
        """The answer to one request; a stream's truth record is kept from here on."""
        keep = req.headers.get("connection", "").lower() != "close"
        path = req.path.split("?", 1)[0]
        if req.method == "GET" and path == "/truth":
            return _Reply(_plain(200, self.truth_jsonl(), "application/x-ndjson", keep), keep)
        if req.method == "GET" and path == "/clock":
            return _Reply(_plain(200, json.dumps(self.clock()), "application/json", keep), keep)
        if req.method == "GET" and path in ("/health", "/v1/models"):
            models = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            return _Reply(_plain(200, json.dumps(models), "application/json", keep), keep)
        if req.method != "POST" or path not in ("/v1/chat/completions", "/chat/completions"):
            return _Reply(_plain(404, "not found", "text/plain", keep), keep)
        if "chunked" in req.headers.get("transfer-encoding", "").lower():
            return _Reply(_plain(411, "Content-Length required", "text/plain", False), False)
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("stream") is not True:
            return _Reply(_plain(400, "send a JSON body with stream: true", "text/plain", True), True)
        n = body.get("max_completion_tokens") or body.get("max_tokens") or self.tokens
        n = max(1, min(int(n), _MAX_TOKENS_CAP))
        kernel = req.arrival_ns is not None
        arrival = self._perf_s(req.arrival_ns) if req.arrival_ns is not None else req.read_perf_s
        head = self._perf_s(req.head_arrival_ns) if req.head_arrival_ns is not None else arrival
        rid = f"ref-{next(self._ids)}"
        truth = Truth(rid, index, arrival, "kernel" if kernel else "user", head, req.read_perf_s, n)
        with self._lock:
            self._truth.append(truth)
        answer = Answer(rid, self.model, n, _prompt_tokens(body))
        return _Reply(answer.head, keep, (truth, answer))

    def _due(self, truth: Truth, k: int) -> float:
        """When token k is due: absolute, from the request's arrival (a late write delays no later one)."""
        return truth.arrival_perf_s + self.ttft_s + k * self.gap_s

    # -- one connection, one thread ----------------------------------------------------------------------

    def _serve_conn(self, sock: socket.socket, index: int) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                got = self._read_request(sock, buf)
                if got is None:
                    return
                req, buf = got
                if not self._answer(sock, index, req):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.pop(index, None)
            with contextlib.suppress(OSError):
                sock.close()
            self._release()

    def _release(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _read_request(self, sock: socket.socket, buf: bytes) -> tuple[_Request, bytes] | None:
        """The next request on the connection (None when the client closed it) and any bytes after it."""
        head_stamp: int | None = None
        stamp: int | None = None
        while (got := self._request(buf, stamp, head_stamp)) is None:
            data, stamp = _recv(sock)
            if not data:
                return None
            if not buf:
                head_stamp = stamp
            buf += data
            if len(buf) > _MAX_HEAD and b"\r\n\r\n" not in buf:
                return None
        return got

    def _answer(self, sock: socket.socket, index: int, req: _Request) -> bool:
        """Answer one request, streaming on this thread; False when the connection must close."""
        reply = self._reply(index, req)
        sock.sendall(reply.data)
        if reply.stream is not None:
            truth, answer = reply.stream
            for k in range(answer.n):
                due = self._due(truth, k)
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                data = answer.token(k)
                before = time.perf_counter()
                sock.sendall(data)
                truth.wrote(before, time.perf_counter(), due)  # the bytes are in the peer's socket buffer
            before = time.perf_counter()
            sock.sendall(answer.tail)
            truth.tail_write_start_perf_s, truth.tail_write_perf_s = before, time.perf_counter()
            truth.completed = True
        return reply.keep


@dataclass(slots=True, eq=False)
class _Conn:
    """One connection of the loop engine: bytes read but not yet a request, bytes not yet sent."""

    sock: socket.socket
    index: int
    buf: bytes = b""
    stamp: int | None = None  # kernel receive time of the last read
    head_stamp: int | None = None  # ... of the read that brought the first byte of `buf`
    streaming: bool = False  # one request at a time, as a client that does not pipeline expects
    # unsent writes in order: (bytes, truth, due, started, tail): a token's truth (or with `tail` the
    # answer's end) is stamped when its last byte is handed to the kernel
    out: collections.deque[tuple[memoryview, Truth | None, float, float, bool]] = field(
        default_factory=collections.deque
    )
    keep: bool = True


class LoopRefServer(RefServer):
    """The same server on one thread: non-blocking sockets in epoll, a heap of due token writes.

    No thread per connection and no GIL hand-over per token, so it answers several times the threaded
    engine's request rate on two cores; the truth it logs means the same (kernel arrival stamps from
    `recvmsg`, a token stamped when its last byte was handed to the kernel, lateness against its due time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._heap: list[tuple[float, int, _Conn, Truth, Answer, int]] = []
        self._seq = itertools.count()
        self._open: dict[int, _Conn] = {}

    def serve_forever(self) -> None:
        """Serve every connection on this thread until stop()."""
        self._sel.register(self._listener, selectors.EVENT_READ)
        index = itertools.count()
        try:
            while not self._stop.is_set():
                wait = 0.2 if not self._heap else min(0.2, self._heap[0][0] - time.perf_counter())
                # epoll waits in whole milliseconds, rounded up: wait one less, then the rest in a sleep
                for key, mask in self._sel.select(wait - 0.001 if wait >= 0.001 else 0):
                    if key.fileobj is self._listener:
                        self._accept(index)
                    else:
                        self._ready(key.data, mask)
                if self._heap and 0 < (rest := self._heap[0][0] - time.perf_counter()) < 0.001:
                    time.sleep(rest)
                now = time.perf_counter()
                while self._heap and self._heap[0][0] <= now:
                    _, _, conn, truth, answer, k = heapq.heappop(self._heap)
                    self._token(conn, truth, answer, k)
        finally:
            for conn in list(self._open.values()):
                self._close(conn)
            self._sel.close()

    def stop(self) -> None:
        """Stop serving and close every connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._listener.close()

    def _accept(self, index: Iterator[int]) -> None:
        for _ in range(64):  # a burst of connects, not without bound before the due writes
            if self.max_connections and len(self._open) >= self.max_connections:
                return  # the rest wait in the backlog
            try:
                sock, _ = self._listener.accept()
            except OSError:  # no more waiting (BlockingIOError), or the listener closed
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            conn = _Conn(sock, next(index))
            self._open[conn.index] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _ready(self, conn: _Conn, mask: int) -> None:
        if conn.index not in self._open:
            return  # closed earlier in this batch of events
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn.index in self._open:
            try:
                data, stamp = _recv(conn.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, stamp = b"", None
            if not data:
                self._close(conn)
                return
            if not conn.buf:
                conn.head_stamp = stamp
            conn.buf += data
            conn.stamp = stamp
            if len(conn.buf) > _MAX_HEAD and b"\r\n\r\n" not in conn.buf:
                self._close(conn)
                return
            self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        if conn.streaming or conn.index not in self._open:
            return
        got = self._request(conn.buf, conn.stamp, conn.head_stamp)
        if got is None:
            return
        req, conn.buf = got
        conn.head_stamp = None
        reply = self._reply(conn.index, req)
        conn.keep = reply.keep
        self._send(conn, reply.data, None, 0.0)
        if reply.stream is None:
            self._end(conn)
            return
        conn.streaming = True
        truth, answer = reply.stream
        heapq.heappush(self._heap, (self._due(truth, 0), next(self._seq), conn, truth, answer, 0))

    def _token(self, conn: _Conn, truth: Truth, answer: Answer, k: int) -> None:
        if conn.index not in self._open:
            return  # the client went away; its truth record stays, not completed
        self._send(conn, answer.token(k), truth, self._due(truth, k))
        if k + 1 < answer.n:
            heapq.heappush(self._heap, (self._due(truth, k + 1), next(self._seq), conn, truth, answer, k + 1))
            return
        self._send(conn, answer.tail, truth, 0.0, tail=True)
        truth.completed = True
        conn.streaming = False
        self._end(conn)

    def _end(self, conn: _Conn) -> None:
        """An answer is complete: close if asked, else take the next request already read."""
        if not conn.keep:
            if not conn.out:
                self._close(conn)
            return  # closed once the rest is sent
        self._next_request(conn)

    def _send(self, conn: _Conn, data: bytes, truth: Truth | None, due: float, *, tail: bool = False) -> None:
        if conn.index not in self._open:
            return
        started = time.perf_counter()
        if not conn.out:
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(conn)
                return
            if sent == len(data):
                if truth is not None:
                    _written(truth, started, due, tail)
                return
            data = data[sent:]
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        conn.out.append((memoryview(data), truth, due, started, tail))

    def _flush(self, conn: _Conn) -> None:
        while conn.out:
            view, truth, due, started, tail = conn.out[0]
            try:
                sent = conn.sock.send(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            if sent < len(view):
                conn.out[0] = (view[sent:], truth, due, started, tail)
                return
            conn.out.popleft()
            if truth is not None:
                _written(truth, started, due, tail)
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if not conn.keep and not conn.streaming:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._open.pop(conn.index, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        conn.out.clear()


def _written(truth: Truth, started: float, due: float, tail: bool) -> None:
    """A write's last byte was handed to the kernel now: a token's (`Truth.wrote`) or the answer's end."""
    if tail:
        truth.tail_write_start_perf_s, truth.tail_write_perf_s = started, time.perf_counter()
    else:
        truth.wrote(started, time.perf_counter(), due)


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _plain(status: int, text: str, ctype: str, keep: bool) -> bytes:
    body = text.encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    return head.encode() + body


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A rough prompt size (words), only so that `usage` looks like a real server's."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def main(argv: list[str] | None = None) -> int:
    """CLI: serve until SIGTERM/SIGINT, then write the truth log (if asked)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: pick a free port (printed on stdout)")
    ap.add_argument("--ttft", type=float, default=0.1, help="first token this many seconds after arrival")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between tokens")
    ap.add_argument("--tokens", type=int, default=128, help="tokens when the request has no max_tokens")
    ap.add_argument("--model", default="ref")
    ap.add_argument("--truth-log", type=Path, help="JSONL file written on exit")
    ap.add_argument("--max-connections", type=int, help="open connections at most (more wait in the backlog)")
    ap.add_argument(
        "--engine",
        choices=("threads", "loop"),
        default="threads",
        help="threads: a thread per connection; loop: every connection on one thread (epoll; higher rates)",
    )
    ap.add_argument(
        "--switch-interval", type=float, default=0.0002, help="sys.setswitchinterval: a due write waits less"
    )
    args = ap.parse_args(argv)
    sys.setswitchinterval(args.switch_interval)
    engine = LoopRefServer if args.engine == "loop" else RefServer
    server = engine(
        args.host,
        args.port,
        ttft_s=args.ttft,
        gap_s=args.gap,
        tokens=args.tokens,
        model=args.model,
        max_connections=args.max_connections,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server.start()
    print(server.port, flush=True)
    while not done.wait(0.5):
        pass
    server.stop()
    if args.truth_log is not None:
        args.truth_log.write_text(server.truth_jsonl())
    return 0


if __name__ == "__main__":
    sys.exit(main())
