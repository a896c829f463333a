"""Resets are resets (issue 37): a TCP RST in the middle of a stream is `provider_error`/`reset` within a
second, in probes and bench requests, with the receive watcher on and off, on uvloop as the exporter and the
bench run; an RST that ends a body without length or chunking is a reset, not the body's end.

The server is a raw socket: the response head, k SSE events, then SO_LINGER 0 and close (the kernel sends an
RST instead of a FIN)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.thread_server import ThreadServer, read_head
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.session import run_bench
from tokwatch.figures.result import Status
from tokwatch.probes import get_probe
from tokwatch.probes.base import ProbeContext, ProbeLog, run_probe
from tokwatch.settings.config import EndpointSettings, ProbeSettings
from tokwatch.settings.redact import Redactor
from tokwatch.transport import rxwatch
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import new_loop

RUNS = 20
EVENTS_BEFORE_RESET = 5


def _event(i: int) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": f" w{i}"}}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class ResettingServer:
    """Answers every request with a 200 stream of `events` SSE events, then resets the connection."""

    def __init__(self, *, chunked: bool, events: int = EVENTS_BEFORE_RESET) -> None:
        self.chunked = chunked
        self.events = events
        self.resets = 0
        self._server = ThreadServer(self._answer, timeout_s=5.0)
        self.url = f"{self._server.url}/v1"

    def __enter__(self) -> ResettingServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            head, _ = read_head(conn)
            if not head:
                return
            framing = b"Transfer-Encoding: chunked\r\n" if self.chunked else b"Connection: close\r\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing + b"\r\n")
            for i in range(self.events):
                event = _event(i)
                conn.sendall(b"%x\r\n%s\r\n" % (len(event), event) if self.chunked else event)
                if i < self.events - 1:
                    time.sleep(0.005)
        # No FIN: SO_LINGER 0 makes close() abort the connection with an RST, right behind the last
        # event, so it often arrives with it (uvloop then dropped it: issue 37). Closed here, before the
        # server's own shutdown of the socket could send a FIN first.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        self.resets += 1


WATCHER = [False, pytest.param(True, marks=pytest.mark.skipif(not rxwatch.available(), reason="Linux only"))]


@pytest.fixture(params=[True, False], ids=["chunked", "unframed"])
def server(request: pytest.FixtureRequest) -> Iterator[ResettingServer]:
    with ResettingServer(chunked=request.param) as srv:
        yield srv


def _probe_runs(url: str, watch: bool) -> list[tuple[Status, str | None, float]]:
    """RUNS probes (no warm-up) on a fresh loop of the kind the exporter measures on (uvloop)."""

    async def body() -> list[tuple[Status, str | None, float]]:
        out = []
        async with HttpClient(watch_receives=watch) as http:
            ep = EndpointSettings(name="ep", kind="openai", base_url=url, model="m", timeout=10)
            for _ in range(RUNS):
                ctx = ProbeContext(
                    endpoint=ep,
                    settings=ProbeSettings(warmup=False),
                    http=http,
                    api_key=None,
                    log=ProbeLog(Redactor()),
                )
                t0 = time.perf_counter()
                r = await run_probe(get_probe("openai"), ctx)
                out.append((r.status, r.error_class, time.perf_counter() - t0))
        return out

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(body())


@pytest.mark.slow
@pytest.mark.parametrize("watch", WATCHER, ids=["watcher_off", "watcher_on"])
def test_a_reset_mid_stream_is_a_reset_within_a_second_in_every_probe(
    server: ResettingServer, watch: bool
) -> None:
    runs = _probe_runs(server.url, watch)
    assert len(runs) == RUNS
    for status, error_class, took in runs:
        assert (status, error_class) == (Status.PROVIDER_ERROR, "reset")
        assert took < 1.0, f"reset seen after {took:.2f}s"


@pytest.mark.parametrize("watch", WATCHER, ids=["watcher_off", "watcher_on"])
def test_a_reset_mid_stream_is_a_reset_within_a_second_in_every_bench_request(
    server: ResettingServer, watch: bool, tmp_path: Path
) -> None:
    opts = BenchOptions(
        url=server.url,
        kind="openai",
        model="m",
        number=RUNS,
        warmup=0,
        concurrency=2,
        timeout=10,
        receive_watcher="on" if watch else "off",
        max_consecutive_failures=RUNS * 2,
        fail_fast=RUNS * 2,
        output_tokens="16",
        input_tokens="8",
    )
    with asyncio.Runner(loop_factory=new_loop) as runner:
        outcome, _ = runner.run(run_bench(opts, out_dir=tmp_path / "bench"))
    records = outcome.records
    assert len(records) == RUNS
    for rec in records:
        assert (rec.status, rec.error_class) == (Status.PROVIDER_ERROR, "reset"), rec.error_message
        assert rec.completed_at_s is not None
        took = rec.completed_at_s - rec.started_at_s
        assert took < 1.0, f"reset seen after {took:.2f}s"
