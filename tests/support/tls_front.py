"""A TLS front on 127.0.0.1 for a plain server (what a load balancer terminating TLS does): for a test that
needs an HTTPS endpoint in front of a simulator started as a separate process, which serves plain HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
        dst.close()


@contextlib.asynccontextmanager
async def tls_front(ssl_context: ssl.SSLContext, upstream_port: int) -> AsyncIterator[int]:
    """Serve TLS with `ssl_context` on an ephemeral port of 127.0.0.1, relaying each connection to
    127.0.0.1:`upstream_port` in plain TCP; yields the port; every connection is closed on exit."""
    tasks: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            writer.close()
        finally:
            tasks.discard(task)

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=ssl_context)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
