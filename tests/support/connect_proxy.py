"""A small HTTP proxy on 127.0.0.1, on its own thread and event loop (so it keeps relaying while the test's
loop waits on a subprocess): CONNECT tunnels for HTTPS origins, absolute-form forwarding for plain HTTP
ones, Basic proxy credentials checked when given (407 without them). It counts what it did, so a test can
tell that its requests really went through it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_HEAD_LIMIT = 64 * 1024


@dataclass
class ProxyCounts:
    """What the proxy saw: tunnels opened (by target), requests forwarded, requests refused (407)."""

    tunnels: list[str] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    refused: int = 0


class ConnectProxy:
    """`with ConnectProxy(credentials=("alice", "s3cret")) as proxy:` relays through `proxy.url` until the
    block ends; `proxy.counts` says what it relayed. `tunnel_delay_s`: how long it takes to answer a
    CONNECT once connected upstream (a slow proxy, whose set-up must not show in TTFT)."""

    def __init__(self, credentials: tuple[str, str] | None = None, *, tunnel_delay_s: float = 0.0) -> None:
        self._tunnel_delay_s = tunnel_delay_s
        self._expected = (
            "Basic " + base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
            if credentials is not None
            else None
        )
        self.counts = ProxyCounts()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT, without credentials."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ConnectProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if self._expected is not None and headers.get("proxy-authorization") != self._expected:
            self.counts.refused += 1
            writer.write(
                b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="test"\r\n'
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            self.counts.tunnels.append(target)
            await asyncio.sleep(self._tunnel_delay_s)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._relay(reader, writer, up_reader, up_writer)
            return
        parts = urlsplit(target)
        assert parts.hostname is not None, f"not an absolute-form request: {lines[0]!r}"
        up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        self.counts.forwarded.append(target)
        origin_form = parts.path + (f"?{parts.query}" if parts.query else "")
        kept = [line for line in lines[1:] if line and not line.lower().startswith("proxy-authorization:")]
        # One request per connection: the origin closes after answering, so the next one comes back here.
        kept = [line for line in kept if not line.lower().startswith("connection:")] + ["Connection: close"]
        up_writer.write(
            ("\r\n".join([f"{method} {origin_form} HTTP/1.1", *kept]) + "\r\n\r\n").encode("latin-1")
        )
        await self._relay(reader, writer, up_reader, up_writer)

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()
