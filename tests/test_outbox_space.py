"""Nothing held only in memory (issue 37): runs that could not reach the outbox (no room) while the database
was down go to the outbox as soon as it has room again, so a kill -9 after that loses none. A real
`tokwatch serve` under a 4 KiB file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) that the test lifts while the
process runs (prlimit), with a real PostgreSQL stopped and started."""

from __future__ import annotations

import resource
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli_processes import runs_total, stop, tokwatch, wait_http
from tests.support.postgres import LocalPostgres, stored_runs

FSIZE_LIMIT = 4096


def _full_disk() -> None:
    """In the child: files may not grow past 4 KiB (EFBIG, not SIGXFSZ), as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, hard))


def _gauge(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not on /metrics")


def _wait(check: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s:g}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_runs_held_in_memory_reach_the_outbox_when_space_returns_and_survive_kill_9(
    sim_url: str, tmp_path: Path, free_port: Callable[[], int], pg_server: LocalPostgres, pg_dsn: str
) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""
probe: {{max_tokens: 8, warmup: false}}
schedule: {{interval: 1s, offset: 0s}}
storage: {{dsn: '{pg_dsn}', outbox_path: '{tmp_path}/outbox.jsonl'}}
endpoints:
  - {{name: good, kind: openai, base_url: '{sim_url}/oa/v1', model: m}}
""")


    port = free_port()
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", preexec_fn=_full_disk)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        _wait(lambda: len(stored_runs(pg_dsn)) >= 2, 30, "runs in the database")
        pg_server.stop()
        # The outbox fills its 4 KiB, then runs wait in memory: nowhere durable to go.
        _wait(lambda: _gauge(port, "tokwatch_storage_queue_depth") >= 3, 30, "runs held in memory")
        held = _gauge(port, "tokwatch_storage_queue_depth")
        # Space returns (the limit lifted from outside; the database stays down).
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        lifted = time.monotonic()
        before_kill = 0

        def nothing_in_memory() -> bool:
            nonlocal before_kill
            before_kill = runs_total(port)  # scraped before the depth: every run it counts is durable
            return _gauge(port, "tokwatch_storage_queue_depth") == 0

        _wait(nothing_in_memory, 10, "the runs held in memory to reach the outbox")
        took = time.monotonic() - lifted
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
        pg_server.start()
    assert held >= 3 and took < 5
    # Restart: the outbox is replayed into the database that is back.
    proc = tokwatch("serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30)
        _wait(lambda: len(stored_runs(pg_dsn, killed_at)) >= before_kill, 30, "the replay")
    finally:
        code, _out, err = stop(proc)
    assert code == 0, err
    rows = stored_runs(pg_dsn)
    assert all(n == 1 for _, n in rows)  # exactly once
    assert len(stored_runs(pg_dsn, killed_at)) >= before_kill  # 0 lost
    print(f"{held:g} runs held in memory, on disk {took:.2f}s after space returned; 0 of {before_kill} lost")
