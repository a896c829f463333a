"""Bounded inflation (issue 37): gzip bombs on three endpoints cost an exporter little memory, and the
healthy endpoint probed beside them keeps its figures. A real `tokwatch serve` process, a real simulator,
and raw-socket servers answering every request with a gzip-coded body that inflates to 256 MiB of zeros."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli_processes import stop, tokwatch, wait_http
from tests.support.thread_server import ThreadServer, read_head

BOMB_INFLATED = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A gzip stream of 256 MiB of zeros (about 250 KiB)."""
    enc = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1024 * 1024)
    parts = [enc.compress(block) for _ in range(BOMB_INFLATED // len(block))]
    return b"".join([*parts, enc.flush()])


class BombServer:
    """Answers every request with `200`, `Content-Encoding: gzip` and the bomb; serves until `close()`."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests = 0
        self._server = ThreadServer(self._answer).__enter__()
        self.url = f"{self._server.url}/v1"

    def close(self) -> None:
        self._server.__exit__(None, None, None)

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            head, _ = read_head(conn)
            if not head:
                return
            self.requests += 1
            head_text = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
            )
            conn.sendall(head_text.encode() + self.body)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _runs(body: str, endpoint: str, status: str | None = None) -> int:
    total = 0
    for line in body.splitlines():
        mine = line.startswith("tokwatch_probe_runs_total{") and f'endpoint="{endpoint}"' in line
        if mine and (status is None or f'status="{status}"' in line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def _run_exporter(
    tmp_path: Path, name: str, port: int, sim_url: str, bombs: list[str], rounds: int
) -> tuple[int, str]:
    """Serve until the healthy endpoint has `rounds` runs; returns the largest RSS sampled (KiB) and the
    last /metrics."""
    endpoints = [f"  - {{name: healthy, kind: openai, base_url: '{sim_url}/oa/v1', model: m}}"]
    endpoints += [
        f"  - {{name: bomb{i}, kind: openai, base_url: '{url}', model: m}}" for i, url in enumerate(bombs)
    ]
    cfg = tmp_path / f"{name}.yml"
    cfg.write_text(
        "probe: {max_tokens: 32}\n"
        "schedule: {interval: 2s, offset: 0s, parallelism: 4}\n"
        "storage: {enabled: false}\n"
        "metrics: {diagnostics: true}\n"  # the per-figure set-aside counter read below
        "endpoints:\n" + "\n".join(endpoints) + "\n"
    )
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    peak = 0
    body = ""
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kib(proc.pid))
            body = _metrics(port)
            if _runs(body, "healthy") >= rounds and all(
                _runs(body, f"bomb{i}") >= rounds for i in range(len(bombs))
            ):
                break
            time.sleep(0.05)
    finally:
        code, _out, err = stop(proc)
    assert code == 0, err
    assert _runs(body, "healthy") >= rounds, body
    return peak, body


def _set_aside(body: str, figure: str) -> int:
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.splitlines()
        if line.startswith("tokwatch_probe_figures_set_aside_total{")
        and 'endpoint="healthy"' in line
        and f'figure="{figure}"' in line
    )


@pytest.mark.slow
def test_gzip_bombs_cost_little_memory_and_leave_a_healthy_neighbours_figures(
    tmp_path: Path, free_port: Callable[[], int], sim_url: str, bomb: bytes
) -> None:
    rounds = 4
    alone, alone_body = _run_exporter(tmp_path, "alone", free_port(), sim_url, [], rounds)
    servers = [BombServer(bomb) for _ in range(3)]
    try:
        beside, body = _run_exporter(
            tmp_path, "bombs", free_port(), sim_url, [s.url for s in servers], rounds
        )
    finally:
        for s in servers:
            s.close()
    assert all(s.requests >= rounds for s in servers)
    for i in range(3):  # each bomb stopped at the size cap, as it is produced
        assert _runs(body, f"bomb{i}", "provider_error") >= rounds, body
    assert beside <= 1.2 * alone, f"RSS {beside / 1024:.0f} MiB beside bombs, {alone / 1024:.0f} MiB alone"
    assert _runs(body, "healthy", "ok") >= rounds
    # Set aside for a stall of the measurement loop: with the bombs inflated in slices and their lines
    # bounded, no more than without them (zero on an idle host; this host is shared, so both runs count).
    beside_tps, alone_tps = _set_aside(body, "tokens_per_second"), _set_aside(alone_body, "tokens_per_second")
    print(f"healthy tok/s set aside: {alone_tps} alone, {beside_tps} beside three gzip bombs")
    assert beside_tps <= alone_tps + 1
    print(f"peak RSS: {alone / 1024:.1f} MiB alone, {beside / 1024:.1f} MiB beside three gzip bombs")
