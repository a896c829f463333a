"""The kernel-stamped transport on a real TCP connection over 127.0.0.1: reads carry the kernel's receive
time, writes keep asyncio's flow control, and every way of closing reaches the protocol once."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.thread_server import ThreadServer, read_head
from tests.support.waiting import wait_until
from tokwatch.transport import kernel_stamps
from tokwatch.transport.http import HttpClient
from tokwatch.transport.kernel_stamps import KernelStampedTransport, StampsKeptOn

pytestmark = pytest.mark.skipif(not kernel_stamps.available(), reason="kernel receive stamps need Linux")


class Recorder(asyncio.Protocol):
    """Records what the transport tells it."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, bytes]] = []
        self.calls: list[str] = []
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.eof_answer: bool | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("made")

    def data_received_at(self, data: bytes, stamp: float) -> None:
        self.reads.append((stamp, data))

    def eof_received(self) -> bool | None:
        self.calls.append("eof")
        return self.eof_answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")


Pair = tuple[KernelStampedTransport, Recorder, socket.socket]


def _first_read_stamped() -> bool:
    """Whether a new loopback connection's first read carries the kernel's stamp (then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
    with client, peer:
        client.setsockopt(socket.SOL_SOCKET, kernel_stamps.SO_TIMESTAMPNS, 1)
        peer.sendall(b"x")
        client.settimeout(5)
        _data, anc, _flags, _addr = client.recvmsg(16, socket.CMSG_SPACE(16))
    return any(kind == kernel_stamps.SO_TIMESTAMPNS for _level, kind, _cdata in anc)


def _stamping_on(keeper: StampsKeptOn) -> None:
    """Wait (bounded) until the kernel's deferred switch-on that `keeper` asked for has happened."""
    assert keeper.holding
    for _ in range(200):
        if _first_read_stamped():
            return
        time.sleep(0.005)
    raise AssertionError("the kernel never stamped a read while a socket asked for stamps")


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """A started transport on one end of a loopback TCP connection, the blocking peer socket on the other;
    the kernel's stamping switched on before the first byte (see StampsKeptOn)."""
    keeper = StampsKeptOn()
    _stamping_on(keeper)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
    proto = Recorder()
    transport = KernelStampedTransport(client, proto)
    transport.start()
    try:
        yield transport, proto, peer
    finally:
        transport.abort()
        peer.close()
        keeper.close()
        await asyncio.wait_for(asyncio.shield(proto.lost), 5)


def test_while_a_socket_asks_for_stamps_every_new_connections_first_read_is_stamped() -> None:
    """Linux switches stamping on and off through deferred work as the first socket asks and the last one
    closes: without a keeper 6 to 15 of these 30 first reads carried no stamp here. With one, none may."""
    keeper = StampsKeptOn()
    try:
        _stamping_on(keeper)
        unstamped = 0
        for _ in range(30):  # each closed, and the kernel given time to switch off, before the next
            unstamped += not _first_read_stamped()
            time.sleep(0.01)
    finally:
        keeper.close()
    assert unstamped == 0
    assert not keeper.holding


async def test_the_client_keeps_stamping_on_from_its_first_request_to_close() -> None:
    with ThreadServer(_big_answer) as server:
        client = HttpClient(kernel_stamps=True)
        assert client._pool is None  # a client never used opens nothing
        async with client.stream("GET", f"{server.url}/", timeout=10) as resp:
            await resp.read()
        pool = client._pool
        assert pool is not None and pool._stamps_on is not None and pool._stamps_on.holding
        await client.close()
        assert not pool._stamps_on.holding
    async with HttpClient(kernel_stamps=False) as plain:
        with ThreadServer(_big_answer) as server:
            async with plain.stream("GET", f"{server.url}/", timeout=10) as resp:
                await resp.read()
        assert plain._pool is not None and plain._pool._stamps_on is None


async def test_a_read_carries_the_kernels_time_of_arrival_not_the_loops(pair: Pair) -> None:
    transport, proto, peer = pair
    sent = time.perf_counter()
    peer.sendall(b"one")
    time.sleep(0.1)  # noqa: ASYNC251 - on purpose: the loop reads only after this
    read_from = time.perf_counter()
    await wait_until(lambda: proto.reads, 5, "the read", interval=0.005)
    (stamp, data), *_ = proto.reads
    assert data == b"one" and transport.kernel_reads == 1 and proto.calls == ["made"]
    assert sent <= stamp < sent + 0.05 < read_from  # the arrival, 0.1 s before the loop read it
    assert transport.get_extra_info("peername") == peer.getsockname()


async def test_writes_the_socket_cannot_take_pause_the_protocol_until_they_drained(pair: Pair) -> None:
    transport, proto, peer = pair
    transport.set_write_buffer_limits(high=0, low=0)  # as tokwatch's connections: pause on any byte left
    payload = b"x" * (32 * 1024 * 1024)  # beyond both sockets' buffers
    transport.write(payload)
    assert proto.calls[-1] == "pause_writing" and transport.get_write_buffer_size() > 0
    got = bytearray()

    def drain() -> None:
        while len(got) < len(payload):
            got.extend(peer.recv(1 << 20))

    await asyncio.to_thread(drain)
    await wait_until(lambda: proto.calls[-1] == "resume_writing", 5, "resume_writing", interval=0.005)
    assert bytes(got) == payload and transport.get_write_buffer_size() == 0


async def test_close_sends_what_was_buffered_then_reports_a_clean_loss(pair: Pair) -> None:
    transport, proto, peer = pair
    payload = b"y" * (8 * 1024 * 1024)
    transport.write(payload)
    transport.close()
    assert transport.is_closing() and not transport.is_reading()
    transport.write(b"ignored")  # after close: dropped, as asyncio's transports do
    got = bytearray()

    def drain() -> None:
        while chunk := peer.recv(1 << 20):
            got.extend(chunk)

    await asyncio.to_thread(drain)
    assert bytes(got) == payload
    assert await asyncio.wait_for(proto.lost, 5) is None and proto.calls.count("lost") == 1


async def test_the_peer_closing_is_an_eof_then_a_clean_loss(pair: Pair) -> None:
    _, proto, peer = pair
    peer.sendall(b"last words")
    peer.shutdown(socket.SHUT_WR)
    assert await asyncio.wait_for(proto.lost, 5) is None
    assert proto.calls == ["made", "eof", "lost"] and proto.reads[-1][1] == b"last words"


async def test_a_reset_is_a_loss_with_its_error(pair: Pair) -> None:
    _, proto, peer = pair
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peer.close()  # linger 0: RST
    assert isinstance(await asyncio.wait_for(proto.lost, 5), ConnectionResetError)
    assert proto.calls.count("lost") == 1


async def test_paused_reading_leaves_the_bytes_to_the_kernel_until_resumed(pair: Pair) -> None:
    transport, proto, peer = pair
    transport.pause_reading()
    peer.sendall(b"held")
    await asyncio.sleep(0.05)
    assert proto.reads == []
    transport.resume_reading()
    await wait_until(lambda: proto.reads, 5, "the read", interval=0.005)
    assert proto.reads[0][1] == b"held"


def test_bad_write_buffer_limits_are_refused() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        with a, b:
            transport = KernelStampedTransport(a, Recorder())
            with pytest.raises(ValueError, match="high"):
                transport.set_write_buffer_limits(high=1, low=2)

    asyncio.run(main())


def _big_answer(conn: socket.socket) -> None:
    read_head(conn)
    body = b"z" * (1024 * 1024)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("kernel", [True, False])
async def test_a_reader_that_falls_behind_pauses_the_socket_and_loses_nothing(kernel: bool) -> None:
    """1 MB arrives while the reader sleeps: the connection stops reading above its high-water mark (the
    kernel and the server hold the rest) and resumes as the reader takes pieces."""
    with ThreadServer(_big_answer) as server:
        async with (
            HttpClient(kernel_stamps=kernel) as client,
            client.stream("GET", f"{server.url}/", timeout=10) as resp,
        ):
            await asyncio.sleep(0.3)
            assert resp._conn._read_paused  # the pause itself is what this test checks
            body = await resp.read()
    assert body == b"z" * (1024 * 1024)
