"""A ground-truth reference server for TTFT: kernel arrival stamps, a fixed token schedule, a truth log.

OpenAI-compatible streaming chat completions (`POST /v1/chat/completions`: SSE `data:` chunks, a `usage`
chunk with `completion_tokens`, `data: [DONE]`) on blocking sockets, one thread per connection (keep-alive).
Each request's **arrival** is the kernel's receive time of the segment carrying its last byte
(`SO_TIMESTAMPNS`, read from `recvmsg` ancillary data), not when this process got to read it. Tokens follow a
fixed schedule from that arrival: the first at `ttft_s`, then one every `gap_s`, `max_tokens` of them (default
`tokens`); due times are absolute (a late write does not delay the next one), and each write is stamped with
`time.perf_counter()` right after its `send` returned (on loopback the bytes are then in the client's
socket buffer). Every answer carries `x-request-id`, which `tokwatch bench` records as `server_request_id`.

Clocks: the kernel stamps with CLOCK_REALTIME; they are converted to `time.perf_counter()` seconds by an
offset measured at start (the tightest of many `perf_counter_ns()`, `time_ns()`, `perf_counter_ns()`
brackets). On Linux `perf_counter` is CLOCK_MONOTONIC, one clock for every process on the machine, so the
truth log compares directly with a client's perf_counter stamps; `GET /clock` re-measures the offset, so a
step of the wall clock during a run (NTP) is visible. Linux only (`SO_TIMESTAMPNS` = 35 on x86-64, arm64).

    python benchmarks/refserver.py --port 8123 [--ttft 0.1 --gap 0.02 --tokens 128 --truth-log truth.jsonl]

prints the port it listens on (useful with `--port 0`), serves until SIGTERM/SIGINT, then writes the truth
log. `GET /truth` returns it as JSON lines at any time: request_id, arrival_perf_s, first_write_perf_s,
last_write_perf_s, writes (and the fields of `Truth`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass
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


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrival_ns: int | None
    head_arrival_ns: int | None
    read_perf_s: float


class RefServer:
    """The reference server; `start()` serves on a background thread, `stop()` closes everything."""

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
        self._thread = threading.Thread(target=self.serve_forever, name="refserver-accept", daemon=True)

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

    # -- one connection ----------------------------------------------------------------------------------

    def _serve_conn(self, sock: socket.socket, index: int) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                got = self._read_request(sock, buf)
                if got is None:
                    return
                req, buf = got
                keep = self._answer(sock, index, req)
                if not keep:
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

    def _recv(self, sock: socket.socket) -> tuple[bytes, int | None]:
        """One read, and the kernel's receive time (CLOCK_REALTIME ns) of the last segment it read from."""
        data, anc, _flags, _addr = sock.recvmsg(_RECV_SIZE, _ANC_SIZE)
        stamp = None
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(cdata) >= 16:
                sec, nsec = struct.unpack("qq", cdata[:16])
                stamp = sec * 1_000_000_000 + nsec
        return data, stamp

    def _read_request(self, sock: socket.socket, buf: bytes) -> tuple[_Request, bytes] | None:
        """The next request on the connection (None when the client closed it) and any bytes after it."""
        head_stamp: int | None = None
        stamp: int | None = None
        while b"\r\n\r\n" not in buf:
            data, stamp = self._recv(sock)
            if not data:
                return None
            if not buf:
                head_stamp = stamp
            buf += data
            if len(buf) > _MAX_HEAD and b"\r\n\r\n" not in buf:
                return None
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = [*lines[0].split(" "), "", ""][:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        length = int(headers.get("content-length", "0") or 0)
        while len(rest) < length:
            data, stamp = self._recv(sock)
            if not data:
                return None
            rest += data
        read_perf = time.perf_counter()
        req = _Request(method, path, headers, rest[:length], stamp, head_stamp, read_perf)
        return req, rest[length:]

    def _answer(self, sock: socket.socket, index: int, req: _Request) -> bool:
        """Answer one request; False when the connection must close."""
        keep = req.headers.get("connection", "").lower() != "close"
        path = req.path.split("?", 1)[0]
        if req.method == "GET" and path == "/truth":
            _send_plain(sock, 200, self.truth_jsonl(), "application/x-ndjson", keep)
        elif req.method == "GET" and path == "/clock":
            _send_plain(sock, 200, json.dumps(self.clock()), "application/json", keep)
        elif req.method == "GET" and path in ("/health", "/v1/models"):
            models = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            _send_plain(sock, 200, json.dumps(models), "application/json", keep)
        elif req.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            if "chunked" in req.headers.get("transfer-encoding", "").lower():
                _send_plain(sock, 411, "Content-Length required", "text/plain", False)
                return False
            return self._stream(sock, index, req) and keep
        else:
            _send_plain(sock, 404, "not found", "text/plain", keep)
        return keep

    def _stream(self, sock: socket.socket, index: int, req: _Request) -> bool:
        """Stream the scheduled tokens; the truth record is kept even when the client goes away."""
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("stream") is not True:
            _send_plain(sock, 400, "send a JSON body with stream: true", "text/plain", True)
            return True
        n = body.get("max_completion_tokens") or body.get("max_tokens") or self.tokens
        n = max(1, min(int(n), _MAX_TOKENS_CAP))
        kernel = req.arrival_ns is not None
        arrival = self._perf_s(req.arrival_ns) if req.arrival_ns is not None else req.read_perf_s
        head = self._perf_s(req.head_arrival_ns) if req.head_arrival_ns is not None else arrival
        rid = f"ref-{next(self._ids)}"
        truth = Truth(rid, index, arrival, "kernel" if kernel else "user", head, req.read_perf_s, n)
        with self._lock:
            self._truth.append(truth)
        created = int(time.time())
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nx-request-id: " + rid.encode() + b"\r\n\r\n"
        )
        for k in range(n):
            due = arrival + self.ttft_s + k * self.gap_s
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            delta: dict[str, str] = {"content": "tok "}
            if k == 0:
                delta["role"] = "assistant"
            chunk = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": "length" if k == n - 1 else None}],
            }
            data = _http_chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            before = time.perf_counter()
            sock.sendall(data)
            written = time.perf_counter()  # the bytes are in the peer's socket buffer (loopback)
            if truth.first_write_perf_s is None:
                truth.first_write_perf_s, truth.first_write_start_perf_s = written, before
            truth.last_write_perf_s = written
            truth.writes += 1
            if truth.max_write_late_at_perf_s is None or written - due > truth.max_write_late_s:
                truth.max_write_late_s, truth.max_write_late_at_perf_s = written - due, written
        prompt = _prompt_tokens(body)
        usage = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.model,
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
        }
        tail = b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"
        sock.sendall(_http_chunk(tail) + b"0\r\n\r\n")
        truth.completed = True
        return True


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _send_plain(sock: socket.socket, status: int, text: str, ctype: str, keep: bool) -> None:
    body = text.encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)


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
        "--switch-interval", type=float, default=0.0002, help="sys.setswitchinterval: a due write waits less"
    )
    args = ap.parse_args(argv)
    sys.setswitchinterval(args.switch_interval)
    server = RefServer(
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
