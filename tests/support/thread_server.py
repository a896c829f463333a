"""A TCP server on 127.0.0.1 on its own thread, for what the `serve` fixture (aiohttp on the test's loop)
cannot do: keep answering while the client's loop is blocked or the test blocks (a subprocess, a sleep),
and speak below HTTP (raw bytes, paced chunks, resets, garbage). Each connection gets its own thread."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable

Handle = Callable[[socket.socket], None]


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = False  # server_close() joins the connection threads: a test leaves none running
    block_on_close = True

    def __init__(self, handler: type[socketserver.BaseRequestHandler], timeout_s: float) -> None:
        self.connection_timeout_s = timeout_s
        super().__init__(("127.0.0.1", 0), handler)

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        conn, addr = super().get_request()
        conn.settimeout(self.connection_timeout_s)  # a stuck peer cannot hold a connection thread for ever
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio and aiohttp servers do
        return conn, addr


def _handler_class(handle: Handle) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            handle(self.request)

    return Handler


class ThreadServer:
    """`with ThreadServer(handler) as server:` serves `server.url` until the block ends. `handler` is a
    function given each connected socket (closed after it returns; it may close it itself, e.g. to reset
    it) or a request handler class such as an `http.server.BaseHTTPRequestHandler`."""

    def __init__(
        self, handler: Handle | type[socketserver.BaseRequestHandler], *, timeout_s: float = 10.0
    ) -> None:
        if not isinstance(handler, type):
            handler = _handler_class(handler)
        self._server = _Server(handler, timeout_s)
        self.port: int = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-server", daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
        assert not self._thread.is_alive()


def read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """Read up to the blank line after the headers: (request line and headers, body bytes already read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def content_length(head: bytes) -> int:
    """The Content-Length header's value, 0 without one."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def read_body(conn: socket.socket, head: bytes, body: bytes) -> bytes:
    """The whole body of the request whose head (and first body bytes) `read_head` returned."""
    length = content_length(head)
    received = bytearray(body)
    while len(received) < length:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        received += chunk
    return bytes(received)


def read_request(conn: socket.socket) -> bytes:
    """One whole request as sent: head, blank line, body."""
    head, body = read_head(conn)
    return head + b"\r\n\r\n" + read_body(conn, head, body)
