"""`--workers`: the counters the live view reads while the workers measure (nothing else crosses then)."""

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

from tokwatch.bench.live import LiveStats
from tokwatch.bench.workers import LiveCounters
from tokwatch.figures.result import Status


def test_each_worker_counts_its_own_row_and_the_parent_sums_them(make_record):
    counters = LiveCounters.create(mp.get_context("spawn"), 2)
    started = [counters.on_start(k) for k in range(2)]
    finished = [counters.on_record(k) for k in range(2)]
    warm = make_record(0, warmup=True, tokens=5)
    ok = [make_record(i, tokens=5) for i in range(1, 4)]
    failed = make_record(4, status=Status.TIMEOUT)
    for k, r in [(0, warm), (0, ok[0]), (1, ok[1]), (1, ok[2]), (1, failed)]:
        started[k](r)
    for k, r in [(0, warm), (0, ok[0]), (1, ok[1])]:
        finished[k](r)
    totals = counters.totals()
    assert totals.in_flight == 2 and totals.completed == 2 and totals.tokens == 10  # warm-up not counted
    for k, r in [(1, ok[2]), (1, failed)]:
        finished[k](r)
    totals = counters.totals()
    assert (totals.in_flight, totals.completed, totals.tokens) == (0, 4, 15)
    assert totals.by_status["ok"] == 3 and totals.by_status["timeout"] == 1
    stats = LiveStats()
    stats.absorb(totals.by_status, totals.in_flight, totals.tokens)
    assert stats.completed == 4 and "Errors: 1" in stats.line() and "TTFT p99: -" in stats.line()


def _spawned_children(parent: int) -> list[int]:
    """The multiprocessing 'spawn' children of `parent` (from /proc: no process library needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_workers_end_when_their_parent_is_killed(tmp_path, stream_server):
    stream_server.gap = 0.05  # requests stay in flight while the parent is killed
    cmd = [sys.executable, "-m", "tokwatch", "bench", "--url", stream_server.url, "--model", "m"]
    cmd += ["--workers", "2", "--rate", "20", "--duration", "60s", "--output-tokens", "8"]
    cmd += ["--no-server-metrics", "--live-interval", "3600", "--output-dir", str(tmp_path / "run")]
    parent = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    workers: list[int] = []
    try:
        for _ in range(300):  # the workers are up and sending (bounded: 30 s)
            workers = _spawned_children(parent.pid)
            if len(workers) == 2 and stream_server.bodies:
                break
            await asyncio.sleep(0.1)
        assert len(workers) == 2 and stream_server.bodies
        parent.kill()  # SIGKILL: the parent can neither stop nor collect them
        await parent.wait()
        for _ in range(200):  # bounded: 20 s (without the watch they would wait out a 600 s barrier)
            if not any(_alive(pid) for pid in workers):
                break
            await asyncio.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
        for pid in workers:
            if _alive(pid):  # still the worker (a pid is not reused while its process lives)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
