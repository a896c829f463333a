"""HttpClient against real aiohttp servers on 127.0.0.1: stale keep-alive, caps, timeouts, timestamps."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from tests.support.thread_server import ThreadServer, read_body, read_head
from tokwatch import __version__
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.stamping import bench_http_client
from tokwatch.transport import kernel_stamps, rxwatch
from tokwatch.transport.http import HttpClient, HttpStatusError, StreamResponse, TransportError

SSE = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
SCHEDULING_SLACK_S = 0.005


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient() as c:
        yield c


async def test_stale_keepalive_connection_is_replaced_not_unreachable(serve, client: HttpClient) -> None:
    """llama-server closes after every streamed response while advertising keep-alive."""
    seen: list[object] = []  # strong references: a freed transport's id() could be reused

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        if any(t is transport for t in seen):
            transport.close()  # the server already considers this connection finished
            return web.Response(status=500)
        seen.append(transport)
        resp = web.StreamResponse(headers={"Keep-Alive": "timeout=5, max=100", "Connection": "keep-alive"})
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(SSE)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        transport.close()
        return resp

    url = await serve({"/v1/chat/completions": handler})
    bodies = []
    for _ in range(20):
        async with client.stream(
            "POST", url + "/v1/chat/completions", json_body={"a": 1}, timeout=10
        ) as resp:
            assert resp.status == 200
            bodies.append(await resp.read())
    assert bodies == [SSE + b"data: [DONE]\n\n"] * 20
    assert client.stale_resends >= 1  # the path was exercised, not avoided by luck
    assert client.stale_resends <= 20


async def test_disconnect_on_fresh_connection_is_not_resent(serve, client: HttpClient) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=500)

    url = await serve({"/x": handler})
    with pytest.raises(TransportError) as err:
        async with client.stream("POST", url + "/x", json_body={}, timeout=5):
            pass
    assert err.value.kind == "reset" and err.value.phase == "response"
    assert calls == 1 and client.stale_resends == 0


async def test_chunks_are_timestamped_as_they_arrive(serve, client: HttpClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"one")
        await asyncio.sleep(0.3)
        await resp.write(b"two")
        return resp

    url = await serve({"/s": handler})
    async with client.stream("GET", url + "/s", timeout=5) as resp:
        got = [(t, d) async for t, d in resp.chunks()]
    assert b"".join(d for _, d in got) == b"onetwo"
    assert len(got) >= 2
    assert resp.sent_at < got[0][0] <= got[-1][0]
    assert got[-1][0] - got[0][0] >= 0.2  # the second piece was not buffered with the first
    assert resp.last_byte_at == got[-1][0]


async def test_endless_stream_is_capped(serve, client: HttpClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(100_000):
            await resp.write(b"data: " + b"x" * 4000 + b"\n\n")
        return resp

    url = await serve({"/s": handler})
    with pytest.raises(TransportError) as err:
        async with client.stream("GET", url + "/s", timeout=20, max_bytes=64 * 1024) as resp:
            async for _ in resp.chunks():
                pass
    assert err.value.kind == "too_large"
    assert resp.bytes_received <= 64 * 1024 + 70_000  # stopped within about one read of the cap


async def test_declared_content_length_over_cap(serve, client: HttpClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"y" * 5000)

    url = await serve({"/big": handler})
    with pytest.raises(TransportError) as err:
        await client.get_text(url + "/big", timeout=5, max_bytes=1024)
    assert err.value.kind == "too_large"


async def test_stall_mid_stream_times_out(serve, client: HttpClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(SSE)
        await asyncio.sleep(30)
        return resp

    url = await serve({"/s": handler})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TransportError) as err:
        async with client.stream("GET", url + "/s", timeout=0.5) as resp:
            async for _ in resp.chunks():
                pass
    assert err.value.kind == "timeout" and err.value.phase == "body"
    assert loop.time() - t0 < 10


async def test_no_headers_times_out_in_response_phase(serve, client: HttpClient) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    url = await serve({"/s": handler})
    with pytest.raises(TransportError) as err:
        async with client.stream("GET", url + "/s", timeout=0.3):
            pass
    assert err.value.kind == "timeout" and err.value.phase == "response"


async def test_connection_refused_is_connect_error(client: HttpClient, free_port: Callable[[], int]) -> None:
    port = free_port()
    with pytest.raises(TransportError) as err:
        async with client.stream("GET", f"http://127.0.0.1:{port}/", timeout=5):
            pass
    assert err.value.kind == "connect" and err.value.phase == "connect"


async def test_get_text_and_status_error(serve, client: HttpClient) -> None:
    async def ok(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"metric 1\n\xff")

    async def boom(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="overloaded")

    url = await serve({"/metrics": ok, "/boom": boom})
    assert await client.get_text(url + "/metrics", timeout=5) == "metric 1\n\ufffd"
    with pytest.raises(HttpStatusError) as err:
        await client.get_text(url + "/boom", timeout=5)
    assert err.value.status == 503 and "overloaded" in err.value.body


async def test_authorization_header_is_sent(serve, client: HttpClient) -> None:
    async def echo(request: web.Request) -> web.StreamResponse:
        return web.Response(text=request.headers.get("Authorization", ""))

    url = await serve({"/e": echo})
    async with client.stream(
        "POST", url + "/e", json_body={}, headers={"Authorization": "Bearer k"}, timeout=5
    ) as r:
        assert await r.text() == "Bearer k"


async def test_the_user_agent_carries_the_version(serve, client: HttpClient) -> None:
    """Providers' logs name the prober with its version: `tokwatch/<version>` unless a caller names itself,
    as the bench does (`tokwatch-bench/<version>`)."""

    async def echo(request: web.Request) -> web.StreamResponse:
        return web.Response(text=request.headers.get("User-Agent", ""))

    url = await serve({"/e": echo})
    async with client.stream("GET", url + "/e", timeout=5) as r:
        assert await r.text() == f"tokwatch/{__version__}"
    async with (
        bench_http_client(BenchOptions(url=url, model="m")) as bench,
        bench.stream("GET", url + "/e", timeout=5) as r,
    ):
        assert await r.text() == f"tokwatch-bench/{__version__}"


class _BodyClock:
    """Records when the server had each request's headers and when its body was complete (optionally pausing
    between the two), then answers after `hold_s`."""

    def __init__(self, hold_s: float, *, read_delay_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.read_delay_s = read_delay_s  # pause between reading the headers and reading the body
        self.headers_at: list[float] = []
        self.body_complete_at: list[float] = []

    def __call__(self, conn: socket.socket) -> None:
        head, body = read_head(conn)
        self.headers_at.append(time.perf_counter())
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        read_body(conn, head, body)
        self.body_complete_at.append(time.perf_counter())
        time.sleep(self.hold_s)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")


async def test_the_clock_starts_at_the_last_byte_and_waiting_is_send_delay() -> None:
    clock = _BodyClock(hold_s=0.5)
    with ThreadServer(clock) as server:
        url = f"{server.url}/"
        body = {"prompt": "x" * 50_000}  # large enough to need more than one transport write
        async with HttpClient(limit=1) as client:  # one connection: the second request must wait for it

            async def one() -> tuple[float, float, float]:
                async with client.stream("POST", url, json_body=body, timeout=10) as resp:
                    await resp.read()
                    assert resp.first_byte_at is not None
                    return resp.sent_at, resp.send_delay_s, resp.first_byte_at - resp.sent_at

            first, second = await asyncio.gather(one(), one())
    # the stamp precedes the server's receipt of the last byte (one clock: same host, CLOCK_MONOTONIC)
    assert first[0] <= min(clock.body_complete_at)
    # the second request waited ~0.5 s for the only connection: that is its send delay, not its latency
    # (each latency is the server's 0.5 s hold; with the wait in it, it would be ~1 s)
    waited = max(first[1], second[1])
    assert waited >= 0.45
    assert max(first[2], second[2]) < 0.85


async def _big_body_send_stamps(pause_s: float) -> tuple[float, float, float]:
    """(client send stamp, server had the headers, server had the whole body) for a 16 MB body that the
    server starts reading `pause_s` after the headers."""
    clock = _BodyClock(hold_s=0.0, read_delay_s=pause_s)
    with ThreadServer(clock) as server:
        body = {"prompt": "x" * (16 * 1024 * 1024)}  # far beyond tcp_wmem max (4 MB) + the receiver's buffers
        async with (
            HttpClient(limit=1) as client,
            client.stream("POST", f"{server.url}/", json_body=body, timeout=30) as resp,
        ):
            await resp.read()
    (headers_at,), (body_complete_at,) = clock.headers_at, clock.body_complete_at
    return resp.sent_at, headers_at, body_complete_at


def _assert_stamped_at_the_last_byte(stamps: tuple[float, float, float], pause_s: float) -> None:
    sent_at, headers_at, body_complete_at = stamps
    # The body's tail can only leave once the server reads, after its pause: a stamp taken when the headers
    # (and the first MBs) left would be ~pause_s earlier: the old headers-sent stamp, and also the last
    # chunk's stamp alone, which is taken when the whole body is queued on the transport.
    assert sent_at >= headers_at + 0.75 * pause_s
    # When the last byte reaches the socket, MBs still wait in the kernel's buffers for the server to read.
    # The stamp follows the socket's taking that byte within one callback; on a saturated host the process
    # can be descheduled in between while the server thread reads on (seen in CI: 0.1 ms), hence the slack.
    assert sent_at <= body_complete_at + SCHEDULING_SLACK_S


async def test_the_send_stamp_is_not_earlier_than_the_last_byte() -> None:
    _assert_stamped_at_the_last_byte(await _big_body_send_stamps(0.2), 0.2)


def test_the_send_stamp_waits_for_the_last_byte_on_uvloop_too() -> None:
    pytest.importorskip("uvloop")
    from tokwatch.transport.measurement import loop_name, new_loop

    async def main() -> tuple[str, tuple[float, float, float]]:
        return loop_name(asyncio.get_running_loop()), await _big_body_send_stamps(0.2)

    with asyncio.Runner(loop_factory=new_loop) as runner:
        name, stamps = runner.run(main())
    assert name == "uvloop"
    _assert_stamped_at_the_last_byte(stamps, 0.2)


def test_reads_are_stamped_on_uvloop_too() -> None:
    """uvloop binds data_received at connect: the stamping must live in the protocol class itself."""
    pytest.importorskip("uvloop")
    from tokwatch.transport.measurement import loop_name, new_loop

    async def main() -> tuple[str, list[float]]:
        async def slow(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(4):
                await resp.write(b"x")
                await asyncio.sleep(0.05)
            return resp

        app = web.Application()
        app.router.add_get("/", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with (
                HttpClient() as client,
                client.stream("GET", f"http://127.0.0.1:{runner.addresses[0][1]}/", timeout=10) as resp,
            ):
                stamps = [t async for t, _ in resp.chunks()]
        finally:
            await runner.cleanup()
        return loop_name(asyncio.get_running_loop()), stamps

    with asyncio.Runner(loop_factory=new_loop) as runner:
        name, stamps = runner.run(main())
    assert name == "uvloop"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(gaps) == 3 and all(g >= 0.03 for g in gaps)  # not all stamped at the headers' time


class _PacedSender:
    """Sends headers, then `parts` body writes `gap_s` apart, and records when it wrote each (perf_counter:
    one clock with the client's stamps)."""

    def __init__(self, parts: int, gap_s: float) -> None:
        self.parts, self.gap_s = parts, gap_s
        self.written_at: list[float] = []

    def __call__(self, conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(self.parts):
            time.sleep(self.gap_s)
            self.written_at.append(time.perf_counter())  # before the write: arrival cannot precede it
            conn.sendall(b"6\r\npart-%d\r\n" % i)
        conn.sendall(b"0\r\n\r\n")


async def _pieces_while_busy(
    watch: bool, kernel: bool = True
) -> tuple[list[tuple[float, bytes]], list[float], float, int]:
    """Three parts arrive 60 ms apart while the client's loop is blocked; returns the pieces, the server's
    write times, when the loop was free again, and the reads the watcher stamped earlier than the loop."""
    sender = _PacedSender(parts=3, gap_s=0.06)
    with ThreadServer(sender) as server:
        async with HttpClient(watch_receives=watch, kernel_stamps=kernel) as client:
            async with client.stream("GET", f"{server.url}/", timeout=10) as resp:
                time.sleep(0.4)  # noqa: ASYNC251 - on purpose: the loop is busy while every part arrives
                unblocked = time.perf_counter()
                pieces = [(t, data) async for t, data in resp.chunks()]
            improved = client.watcher.improved_reads if client.watcher is not None else 0
    return pieces, sender.written_at, unblocked, improved


def _assert_arrival_stamps(pieces: list[tuple[float, bytes]], written: list[float], unblocked: float) -> None:
    assert [d for _, d in pieces] == [b"part-0", b"part-1", b"part-2"]  # one read's bytes split per arrival
    for i, (t, _) in enumerate(pieces):
        assert written[i] <= t < unblocked  # never before its write, and earlier than the loop could stamp
        if i + 1 < len(written):
            assert t < written[i + 1]  # stamped before the next part was even written


@pytest.mark.skipif(not rxwatch.available(), reason="the receive watcher needs Linux epoll")
async def test_reads_that_arrive_while_the_loop_is_busy_keep_their_arrival_times() -> None:
    """With the receive watcher each part is stamped at its arrival, not when the loop got to read it."""
    pieces, written, unblocked, improved = await _pieces_while_busy(watch=True)
    assert improved >= 1
    _assert_arrival_stamps(pieces, written, unblocked)


@pytest.mark.skipif(not rxwatch.available(), reason="the receive watcher needs Linux epoll")
def test_receive_watcher_on_uvloop_too() -> None:
    pytest.importorskip("uvloop")
    from tokwatch.transport.measurement import loop_name, new_loop

    async def main() -> tuple[str, tuple[list[tuple[float, bytes]], list[float], float, int]]:
        return loop_name(asyncio.get_running_loop()), await _pieces_while_busy(watch=True)

    with asyncio.Runner(loop_factory=new_loop) as runner:
        name, (pieces, written, unblocked, _) = runner.run(main())
    assert name == "uvloop"
    _assert_arrival_stamps(pieces, written, unblocked)


async def test_without_the_watcher_a_busy_loop_stamps_late() -> None:
    """The reference behaviour the watcher and the kernel's stamps fix: every part gets the time the loop
    read it."""
    pieces, _, unblocked, _ = await _pieces_while_busy(watch=False, kernel=False)
    assert pieces and all(t >= unblocked for t, _ in pieces)


@pytest.mark.skipif(not kernel_stamps.available(), reason="kernel receive stamps need Linux")
async def test_the_kernel_stamps_a_late_read_with_its_newest_segments_arrival() -> None:
    """Without the watcher, the one late read of all three parts carries the kernel's time of the last one:
    after its write, before the loop could read it (the earlier parts' arrivals are merged into it)."""
    pieces, written, unblocked, _ = await _pieces_while_busy(watch=False)
    assert b"".join(d for _, d in pieces) == b"part-0part-1part-2"
    t = pieces[-1][0]
    assert written[2] <= t < written[2] + 0.03 < unblocked


@pytest.mark.skipif(not kernel_stamps.available(), reason="kernel receive stamps need Linux")
async def test_kernel_stamps_never_precede_their_bytes_and_keep_each_reads_time() -> None:
    """Parts read on time, one read each: every stamp lies between its part's write and the next part's."""
    sender = _PacedSender(parts=4, gap_s=0.03)
    with ThreadServer(sender) as server:
        async with HttpClient() as client:
            assert client.kernel_stamps
            async with client.stream("GET", f"{server.url}/", timeout=10) as resp:
                pieces = [(t, data) async for t, data in resp.chunks()]
    assert [d for _, d in pieces] == [b"part-%d" % i for i in range(4)]
    for i, (t, _) in enumerate(pieces):
        assert sender.written_at[i] <= t
        if i + 1 < len(pieces):
            assert t < sender.written_at[i + 1]


async def _raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> asyncio.Server:
    """A raw HTTP/1.1 server on this loop: `handle` gets the connection once the request head was read."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            await handle(reader, writer)
        finally:
            # From Python 3.12 on, leaving `async with server` waits for every connection to close.
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


Batches = list[list[tuple[float, bytes]]]


async def _forty_parts(client: HttpClient, by_batch: bool) -> tuple[Batches, StreamResponse]:
    """Forty parts 2 ms apart, read piece by piece (`chunks`, one piece a batch here) or `by_batch`; checks
    that each part came out whole, in order, with its own stamp, never before it was written."""
    written: list[float] = []

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(40):
            await asyncio.sleep(0.002)
            written.append(time.perf_counter())
            writer.write(_http_chunk(b"part-%02d" % i))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await _raw_server(handle)
    async with server:
        port = server.sockets[0].getsockname()[1]
        async with client.stream("GET", f"http://127.0.0.1:{port}/", timeout=10) as resp:
            if by_batch:
                batches = [batch async for batch in resp.batches()]
            else:
                batches = [[piece] async for piece in resp.chunks()]
    pieces = [piece for batch in batches for piece in batch]
    assert b"".join(d for _, d in pieces) == b"".join(b"part-%02d" % i for i in range(40))
    stamps = [t for t, _ in pieces]
    assert stamps == sorted(stamps) and len(set(stamps)) >= 20  # reads kept apart, not one stamp for all
    for (t, data), w in zip(pieces, written, strict=False):
        assert data.startswith(b"part-") and t >= w  # never before the part was written
    return batches, resp


async def test_a_stream_wakes_its_reader_in_batches_and_keeps_every_read_stamp(client: HttpClient) -> None:
    """Forty parts 2 ms apart: each comes out as its own piece with its own stamp, in fewer wake-ups."""
    one_piece_each, resp = await _forty_parts(client, by_batch=False)
    assert resp.wakeups < len(one_piece_each)


async def test_batches_hand_over_what_arrived_since_the_last_one_in_order(client: HttpClient) -> None:
    """The same forty parts a batch at a time: one batch per wake-up (never an empty one), and the
    response's byte figures as after `chunks`."""
    batches, resp = await _forty_parts(client, by_batch=True)
    pieces = [piece for batch in batches for piece in batch]
    assert all(batches) and len(batches) < len(pieces)  # several reads a batch
    assert resp.first_byte_at == pieces[0][0] and resp.last_byte_at == pieces[-1][0]
    assert resp.bytes_received == sum(len(d) for _, d in pieces)


async def test_a_piece_followed_by_silence_reaches_the_reader_before_the_deadline(client: HttpClient) -> None:
    """A server that sends an error event and then holds the connection: the reader sees the event (within
    FLUSH_S) instead of waiting for more reads or the deadline."""
    release = asyncio.Event()

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_http_chunk(b'data: {"error": {"message": "overloaded"}}\n\n'))
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 30)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await _raw_server(handle)
    async with server:
        port = server.sockets[0].getsockname()[1]
        async with client.stream("GET", f"http://127.0.0.1:{port}/", timeout=20) as resp:
            async for _, data in resp.chunks():
                assert b"overloaded" in data
                assert not release.is_set()  # it came out while the server still held the stream
                release.set()


async def test_bytes_before_a_reset_come_out_before_the_failure(client: HttpClient) -> None:
    """Data then an abrupt close (no end of the chunked body): the data is yielded, then the reset raised."""

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_http_chunk(SSE) + _http_chunk(SSE))
        await writer.drain()
        writer.close()

    server = await _raw_server(handle)
    async with server:
        port = server.sockets[0].getsockname()[1]
        got: list[bytes] = []
        with pytest.raises(TransportError) as err:
            async with client.stream("GET", f"http://127.0.0.1:{port}/", timeout=10) as resp:
                async for _, data in resp.chunks():
                    got.append(data)
    assert b"".join(got) == SSE + SSE
    assert err.value.kind == "reset" and err.value.phase == "body"


async def test_identity_is_asked_for_and_a_gzip_body_is_decoded_anyway(serve, client: HttpClient) -> None:
    """tokwatch asks for an uncoded body; a server that gzips regardless is still read correctly."""
    asked: list[str] = []

    async def metrics(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("Accept-Encoding", ""))
        resp = web.Response(text="metric 1\n" * 500)
        resp.enable_compression(web.ContentCoding.gzip)
        return resp

    url = await serve({"/metrics": metrics})
    assert await client.get_text(url + "/metrics", timeout=5) == "metric 1\n" * 500
    assert asked == ["identity"]


async def test_a_gzip_bomb_stops_at_the_cap_and_its_inflation_yields_to_the_loop(
    serve, client: HttpClient
) -> None:
    """256 MiB of zeros in ~250 KiB: `too_large` at the cap, inflated a slice per loop turn (other callbacks
    run in between), never all at once."""
    bomb = gzip.compress(bytes(256 * 1024 * 1024), compresslevel=9)

    async def bombed(request: web.Request) -> web.StreamResponse:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    url = await serve({"/bomb": bombed})
    loop = asyncio.get_running_loop()
    turns = 0
    ticking = True

    def tick() -> None:
        nonlocal turns
        turns += 1
        if ticking:
            loop.call_soon(tick)

    cap = 8 * 1024 * 1024
    async with client.stream("GET", url + "/bomb", timeout=20, max_bytes=cap) as resp:
        tick()
        with pytest.raises(TransportError) as err:
            await resp.read()
        ticking = False
    assert err.value.kind == "too_large"
    assert turns >= cap // (128 * 1024)  # one slice of output per loop turn at most


async def test_a_redirect_is_the_answer_and_the_connection_is_kept(serve, client: HttpClient) -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    url = await serve({"/old": moved})
    for expect_reused in (False, True):
        async with client.stream("GET", url + "/old", timeout=5) as resp:
            assert resp.status == 302 and resp.headers["location"] == "/elsewhere"
            await resp.read()
            assert resp.reused is expect_reused


def test_a_body_ended_by_the_close_and_an_interim_answer() -> None:
    """HTTP/1.0 without a length (the body ends when the server closes), after a 100 Continue."""

    def handle(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        time.sleep(0.05)
        conn.sendall(b"part two")

    async def main() -> tuple[int, bytes]:
        with ThreadServer(handle) as server:
            async with HttpClient() as client, client.stream("GET", f"{server.url}/", timeout=5) as resp:
                return resp.status, await resp.read()

    assert asyncio.run(main()) == (200, b"part one, part two")


def test_garbage_instead_of_http_is_a_protocol_error() -> None:
    def handle(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    async def main() -> None:
        with ThreadServer(handle) as server:
            async with HttpClient() as client, client.stream("GET", f"{server.url}/", timeout=5):
                pass

    with pytest.raises(TransportError) as err:
        asyncio.run(main())
    assert err.value.kind == "protocol" and err.value.phase == "response"


async def test_the_connection_limit_is_given_back_after_failures(serve, free_port: Callable[[], int]) -> None:
    """With room for one connection: a refused connect, a body abandoned mid-way and a timed-out answer each
    give their place back, so the next request gets a connection instead of waiting for its deadline."""

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"part")
        await asyncio.sleep(30)
        return resp

    async def ok(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    url = await serve({"/slow": slow, "/ok": ok})
    async with HttpClient(limit=1) as client:
        with pytest.raises(TransportError):
            await client.get_text(f"http://127.0.0.1:{free_port()}/", timeout=5)
        with pytest.raises(RuntimeError):
            async with client.stream("GET", url + "/slow", timeout=10) as resp:
                async for _ in resp.chunks():
                    raise RuntimeError("the caller gave up on the body")
        with pytest.raises(TransportError) as err:
            await client.get_text(url + "/slow", timeout=0.3)
        assert err.value.kind == "timeout"
        assert await client.get_text(url + "/ok", timeout=2) == "ok"
