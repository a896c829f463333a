"""Network phases against real servers on 127.0.0.1: a TLS server with a certificate the test trusts, a plain
one, a kept-alive connection, a name lookup; then the probe's timed run, its metrics and `/probe` family."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from typing import Any

import pytest
from aiohttp import web

from tests.probes.test_openai import sse_handler
from tests.support.pki import Pki, client_ssl, make_pki, server_ssl
from tokwatch.figures.result import RunResult, Status
from tokwatch.metrics.probe import probe_result_families
from tokwatch.probes.base import ProbeContext, ProbeLog, run_probe
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.settings.config import EndpointSettings, ProbeSettings
from tokwatch.transport import http as http_module
from tokwatch.transport import rxwatch
from tokwatch.transport.http import ConnectionSetup, HttpClient

HANDSHAKE_PAUSE_S = 0.3  # the server accepts, then waits this long before its side of the TLS handshake
ANSWER_PAUSE_S = 0.2  # the server read the request, then waits this long before the status line


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class _PausingServer:
    """A blocking HTTP/1.1 server in a thread that waits `accept_pause_s` after accepting a connection (over
    TLS, before its side of the handshake) and `answer_pause_s` after reading each request; keeps alive."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None, *, accept_pause_s: float, answer_pause_s: float
    ) -> None:
        self._ssl, self._accept_pause, self._answer_pause = ssl_context, accept_pause_s, answer_pause_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{self.port}/"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> _PausingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                time.sleep(self._accept_pause)
                try:
                    if self._ssl is None:
                        self._answer(conn)
                    else:
                        with self._ssl.wrap_socket(conn, server_side=True) as tls:
                            self._answer(tls)
                except (OSError, ssl.SSLError):
                    pass  # the client went away

    def _answer(self, conn: socket.socket) -> None:
        """Answer every request on the connection until the client closes it."""
        buf = b""
        for _ in range(100):
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").lower().split("\r\n")
            length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.startswith("content-length:")), 0)
            while len(buf) < length:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            time.sleep(self._answer_pause)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")


async def _one_request(client: HttpClient, url: str) -> tuple[ConnectionSetup, float, float, float, bool]:
    """(the connection's set-up, send delay, processing, first body byte - sent, reused) of one POST."""
    async with client.stream("POST", url, json_body={"prompt": "x"}, timeout=20) as resp:
        assert await resp.read() == b"ok"
        assert resp.connection is not None and resp.processing_s is not None
        assert resp.first_byte_at is not None
        body_s = resp.first_byte_at - resp.sent_at
        return resp.connection, resp.send_delay_s, resp.processing_s, body_s, resp.reused


async def _tls_phases(pki: Pki) -> tuple[ConnectionSetup, float, float, float, bool]:
    pauses = {"accept_pause_s": HANDSHAKE_PAUSE_S, "answer_pause_s": ANSWER_PAUSE_S}
    with _PausingServer(server_ssl(pki), **pauses) as srv:
        async with HttpClient(ssl_context=client_ssl(pki)) as client:
            return await _one_request(client, srv.url)


def _assert_tls_phases(got: tuple[ConnectionSetup, float, float, float, bool]) -> None:
    setup, send_delay, processing, body_s, reused = got
    assert setup.tls and not reused
    # The server held its side of the handshake (from its accept, after the client's connect began) ...
    assert setup.connect_s + setup.tls_s >= HANDSHAKE_PAUSE_S
    # ... and that wait is the TLS phase, not the TCP connect, which the server's kernel completed before
    # the server even accepted.
    assert 0.0 < setup.connect_s < setup.tls_s
    assert setup.resolve_s == 0.0  # an IP address: nothing to look up
    assert setup.rtt_s == setup.connect_s  # one address, answered at the first try
    # The set-up happened before the request's last byte went out: inside the send delay, never in latency.
    assert setup.resolve_s + setup.connect_s + setup.tls_s <= send_delay
    # The server waited before answering: time to the first response byte, which precedes the first body byte.
    assert ANSWER_PAUSE_S <= processing <= body_s


async def test_a_tls_connection_has_connect_and_tls_phases(pki: Pki) -> None:
    _assert_tls_phases(await _tls_phases(pki))


def test_a_tls_connection_has_connect_and_tls_phases_on_uvloop_too(pki: Pki) -> None:
    """The probes' measurement loop runs uvloop when installed: its SSL protocol calls connection_made too."""
    pytest.importorskip("uvloop")
    from tokwatch.transport.measurement import loop_name, new_loop

    async def main() -> tuple[str, tuple[ConnectionSetup, float, float, float, bool]]:
        return loop_name(asyncio.get_running_loop()), await _tls_phases(pki)

    with asyncio.Runner(loop_factory=new_loop) as runner:
        name, got = runner.run(main())
    assert name == "uvloop"
    _assert_tls_phases(got)


async def test_plain_http_has_a_tls_phase_of_zero() -> None:
    # The server waits after accepting, before reading the request: over plain HTTP the request is already
    # sent (the kernel took it), so that is the server's time, not set-up.
    with _PausingServer(None, accept_pause_s=HANDSHAKE_PAUSE_S, answer_pause_s=0.0) as srv:
        async with HttpClient() as client:
            setup, send_delay, processing, _, _ = await _one_request(client, srv.url)
    assert not setup.tls and setup.tls_s == 0.0
    assert 0.0 < setup.connect_s < HANDSHAKE_PAUSE_S
    set_up = setup.resolve_s + setup.connect_s
    assert set_up <= send_delay
    # The wait began at the server's accept, after the client's connect completed; the client sent the
    # request (t = 0) at most `send_delay - set_up` after that.
    assert processing + (send_delay - set_up) >= HANDSHAKE_PAUSE_S
    assert processing >= HANDSHAKE_PAUSE_S / 2  # most of it, unless the client took 0.15 s to send


async def test_a_reused_connection_brings_no_set_up_of_its_own(serve) -> None:  # type: ignore[no-untyped-def]
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    url = await serve({"/": ok})
    async with HttpClient() as client:
        first = await _one_request(client, url + "/")
        second = await _one_request(client, url + "/")
    assert not first[4] and second[4]  # the second request went out on the first one's connection
    assert second[0] is first[0]  # the same set-up record: nothing resolved, connected or negotiated again


async def test_a_name_is_looked_up_and_an_address_is_not(serve) -> None:  # type: ignore[no-untyped-def]
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    url = await serve({"/": ok})
    async with HttpClient() as by_address, HttpClient() as by_name:
        address = (await _one_request(by_address, url + "/"))[0]
        name = (await _one_request(by_name, url.replace("127.0.0.1", "localhost") + "/"))[0]
    assert address.resolve_s == 0.0
    assert name.resolve_s > 0.0  # "localhost" was looked up before connecting
    # Where "localhost" is also ::1 and that address refused first, connect counts both tries, rtt the one
    # that answered.
    assert 0.0 < name.rtt_s <= name.connect_s


def _answering_after(pause_s: float) -> Any:
    """An OpenAI-style streamed answer whose headers leave `pause_s` after the whole request arrived (so
    after the client's t = 0)."""
    answer = sse_handler(["a ", "b ", "c ", "d "])

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(pause_s)
        return await answer(request)

    return handler


def _ctx(client: HttpClient, url: str, *, warmup: bool) -> ProbeContext:
    ep = EndpointSettings(name="ep", kind="openai", base_url=url + "/v1", model="m", labels={"site": "lab"})
    return ProbeContext(
        endpoint=ep,
        settings=ProbeSettings(max_tokens=4, warmup=warmup),
        http=client,
        api_key=None,
        log=ProbeLog(),
    )


def _phase_samples(result: RunResult, client: HttpClient, url: str) -> dict[str, float]:
    """The `/probe` answer's phase gauge, by phase; every sample carries the endpoint's labels."""
    ep = _ctx(client, url, warmup=False).endpoint
    fams = {f.name: f for f in probe_result_families(result, ep)}
    samples = fams["tokwatch_probe_phase_seconds"].samples if "tokwatch_probe_phase_seconds" in fams else []
    assert all(s.labels["endpoint"] == "ep" and s.labels["site"] == "lab" for s in samples)
    return {s.labels["phase"]: s.value for s in samples}


async def test_the_timed_run_reports_the_set_up_of_the_connection_its_warm_up_opened(serve, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    routes = {"/v1/chat/completions": _answering_after(ANSWER_PAUSE_S)}
    url = await serve(routes, ssl_context=server_ssl(pki))
    async with HttpClient(ssl_context=client_ssl(pki)) as client:
        first = await run_probe(OpenAIProbe(), _ctx(client, url, warmup=True))
        # The next round straight away: the connection is still open, so this round set nothing up.
        kept = await run_probe(OpenAIProbe(), _ctx(client, url, warmup=True))
    assert first.status is Status.OK and kept.status is Status.OK, (first.error_message, kept.error_message)

    # The warm-up opened the connection and the timed run reused it: its set-up is this round's network.
    assert first.connection_reused is True
    assert first.phase_resolve_s == 0.0
    assert first.phase_connect_s is not None and first.phase_connect_s > 0.0
    assert first.phase_tls_s is not None and first.phase_tls_s > 0.0
    assert first.network_rtt_s == first.phase_connect_s
    # TTFT is defined as before: from the request's last byte on the socket, so the server's wait is in it
    # (over TLS too: t = 0 once was the response's arrival there), the connection's set-up is not, and
    # the first response byte comes before the first token.
    assert first.phase_processing_s is not None and first.ttft_s is not None
    assert ANSWER_PAUSE_S <= first.phase_processing_s <= first.ttft_s
    assert _phase_samples(first, client, url) == {
        "resolve": 0.0,
        "connect": first.phase_connect_s,
        "tls": first.phase_tls_s,
        "processing": first.phase_processing_s,
    }

    assert kept.connection_reused is True
    assert (kept.phase_resolve_s, kept.phase_connect_s, kept.phase_tls_s, kept.network_rtt_s) == (None,) * 4
    assert kept.phase_processing_s is not None and kept.phase_processing_s >= ANSWER_PAUSE_S
    # Exported, this round spent nothing on set-up: 0, so the series do not come and go with connection reuse.
    assert _phase_samples(kept, client, url) == {
        "resolve": 0.0,
        "connect": 0.0,
        "tls": 0.0,
        "processing": kept.phase_processing_s,
    }


async def test_without_a_warm_up_the_timed_run_opens_its_connection(serve, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    url = await serve({"/v1/chat/completions": _answering_after(ANSWER_PAUSE_S)}, ssl_context=server_ssl(pki))
    async with HttpClient(ssl_context=client_ssl(pki)) as client:
        r = await run_probe(OpenAIProbe(), _ctx(client, url, warmup=False))
    assert r.status is Status.OK, r.error_message
    assert r.connection_reused is False
    # The first request on a new TLS connection: its TTFT and time to first byte include the server's wait.
    assert r.ttft_s is not None and r.phase_processing_s is not None
    assert ANSWER_PAUSE_S <= r.phase_processing_s <= r.ttft_s
    phases: list[Any] = [r.phase_resolve_s, r.phase_connect_s, r.phase_tls_s]
    assert None not in phases and r.send_delay_s is not None
    assert sum(phases) <= r.send_delay_s  # its own set-up is in its send delay, not in its TTFT


async def test_a_run_that_never_connected_has_no_phases(free_port) -> None:  # type: ignore[no-untyped-def]
    async with HttpClient() as client:
        r = await run_probe(OpenAIProbe(), _ctx(client, f"http://127.0.0.1:{free_port()}", warmup=False))
    assert r.status is Status.UNREACHABLE
    assert r.network_phases() == {} and r.network_rtt_s is None and r.connection_reused is None


CHAT = {
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "x"}],
}


@pytest.mark.skipif(not rxwatch.available(), reason="the receive watcher needs Linux epoll")
async def test_the_receive_watcher_leaves_tls_connections_to_the_loop(serve, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    """Over TLS the socket's bytes (records, handshake) are not the body's: the watcher must not cut reads
    by them, so a TLS connection is never registered with it, and the stream still reads in full."""
    answer = sse_handler(["a", "b", "c"], gap=0.02)
    url = await serve({"/v1/chat/completions": answer}, ssl_context=server_ssl(pki))
    async with HttpClient(ssl_context=client_ssl(pki), watch_receives=True) as client:
        async with client.stream("POST", url + "/v1/chat/completions", json_body=CHAT, timeout=10) as resp:
            body = await resp.read()
        assert client.watcher is not None
        assert client.watcher.records == 0 and client.watcher.improved_reads == 0
    assert body.count(b"data:") >= 3 and resp.connection is not None and resp.connection.tls
    assert not resp.watched  # its stamps' bound is the loop's alone (StampLateness.lateness)
    plain = await serve({"/v1/chat/completions": answer})
    async with (
        HttpClient(watch_receives=True) as client,
        client.stream("POST", plain + "/v1/chat/completions", json_body=CHAT, timeout=10) as resp,
    ):
        await resp.read()
        assert resp.watched


async def test_an_idle_connection_past_the_keep_alive_is_not_reused(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(http_module, "IDLE_TIMEOUT_S", 0.05)
    url = await serve({"/v1/chat/completions": _answering_after(0.0)}) + "/v1/chat/completions"
    async with HttpClient() as client:
        reused = []
        for pause in (0.0, 0.0, 0.2):
            await asyncio.sleep(pause)
            async with client.stream("POST", url, json_body=CHAT, timeout=10) as resp:
                await resp.read()
                reused.append(resp.reused)
    assert reused == [False, True, False]
