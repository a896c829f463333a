"""RunWriter: non-blocking submit, overflow and outage to the outbox, replay, kill -9, redaction."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.postgres import free_port
from tokwatch.figures.result import Status
from tokwatch.settings.redact import Redactor
from tokwatch.storage import RunWriter
from tokwatch.storage.outbox import Outbox
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.sqlite import SQLiteStore


async def test_submit_flush_and_counters(tmp_path: Path, make_run: Any) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=tmp_path / "outbox.jsonl", instance="host-1")
    await writer.start()
    try:
        now = time.time()
        for i in range(25):
            writer.submit(make_run("a", now - i))
        assert await writer.flush(10)
        s = writer.stats()
        assert (s.writes_total, s.queue_depth, s.outbox_runs, s.up) == (25, 0, 0, True)
        assert s.oldest_unwritten_age_seconds == 0.0
    finally:
        await writer.close()
    assert await store.count_runs() == 25
    await store.close()


async def test_overflow_spills_to_outbox_in_order_then_replays(tmp_path: Path, make_run: Any) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=tmp_path / "outbox.jsonl", queue_size=3)
    now = time.time()
    runs = [make_run("a", now - 10 + i) for i in range(8)]
    for r in runs:  # writer not started: the queue overflows
        writer.submit(r)
    assert writer.outbox.pending >= 4
    items, _ = writer.outbox.peek(100)
    ids = [i.row.run_id for i in items]
    assert ids == [r.run_id for r in runs][: len(ids)]  # oldest first
    await writer.start()
    try:
        assert await writer.flush(10)
    finally:
        await writer.close()
    assert await store.count_runs() == 8
    await store.close()


async def test_database_down_then_close_keeps_everything(tmp_path: Path, make_run: Any) -> None:
    dead = PostgresStore(f"postgresql://u:pw-Secret-123@127.0.0.1:{free_port()}/x", timeout_s=0.5)
    await dead.open()
    writer = RunWriter(dead, outbox_path=tmp_path / "outbox.jsonl", write_timeout_s=0.5, retry_min_s=0.1)
    await writer.start()
    now = time.time()
    try:
        t0 = time.perf_counter()
        for i in range(5):
            writer.submit(make_run("a", now + i))
        assert time.perf_counter() - t0 < 1.0  # submit never waits for the database
        for _ in range(100):
            if writer.outbox.pending == 5 and writer.stats().write_errors_total:
                break
            await asyncio.sleep(0.05)
        assert writer.outbox.pending == 5  # on disk before the database is even tried
        assert writer.stats().write_errors_total >= 1 and not writer.stats().up
        writer.submit(make_run("a", now + 10))
    finally:
        await writer.close(timeout_s=2)
        await dead.close()
    assert writer.outbox.pending == 6
    # Restart against a working database: the outbox is replayed, once.
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=tmp_path / "outbox.jsonl")
    await writer.start()
    try:
        assert await writer.flush(10)
    finally:
        await writer.close()
    assert await store.count_runs() == 6
    await store.close()


_CHILD = """
import asyncio, sys, time
from pathlib import Path
from tokwatch.figures.result import RunResult, Status
from tokwatch.storage import RunWriter
from tokwatch.storage.postgres import PostgresStore

async def main():
    store = PostgresStore(sys.argv[1], timeout_s=0.3)
    await store.open()
    writer = RunWriter(store, outbox_path=Path(sys.argv[2]), write_timeout_s=0.3, retry_min_s=0.05)
    await writer.start()
    for i in range(int(sys.argv[3])):
        run = RunResult(endpoint="k", started_at=time.time(), status=Status.OK, tokens_per_second=9.0)
        writer.submit(run)
    while writer.outbox.pending < int(sys.argv[3]):
        await asyncio.sleep(0.02)
    print("READY", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_kill_9_then_restart_replays_outbox(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.jsonl"
    dsn = f"postgresql://u:p@127.0.0.1:{free_port()}/x"  # nothing listens: the database is down
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        dsn,
        str(outbox),
        "4",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"READY"
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=outbox)
    await writer.start()
    try:
        assert await writer.flush(10)
    finally:
        await writer.close()
    assert await store.count_runs() == 4
    await store.close()


async def test_error_text_is_redacted_before_storage(tmp_path: Path, make_run: Any) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    writer = RunWriter(store, outbox_path=tmp_path / "o.jsonl", redactor=Redactor(["sk-live-abcdef123456"]))
    run = make_run("a", time.time(), tps=None, status=Status.AUTH_FAILURE)
    run.error_message = "401 for key sk-live-abcdef123456 with Bearer zzzzzzzzzz"
    run.error_class = "http_401"
    writer.submit(run)
    await writer.start()
    try:
        assert await writer.flush(10)
    finally:
        await writer.close()
    await store.close()

    def all_bytes() -> bytes:
        return b"".join(p.read_bytes() for p in tmp_path.glob("tw.db*") if p.is_file())

    raw = await asyncio.to_thread(all_bytes)
    assert b"sk-live-abcdef123456" not in raw and b"zzzzzzzzzz" not in raw


async def test_disk_full_and_database_down_every_run_is_stored_or_counted(
    tmp_path: Path, make_run: Any, disk_full: Any
) -> None:
    dead = PostgresStore(f"postgresql://u:p@127.0.0.1:{free_port()}/x", timeout_s=0.3)
    await dead.open()
    outbox = tmp_path / "outbox.jsonl"
    writer = RunWriter(dead, outbox_path=outbox, queue_size=10, write_timeout_s=0.3, retry_min_s=0.05)
    await writer.start()
    now = time.time()
    submitted = 76
    try:
        with disk_full.active():
            for i in range(submitted):
                writer.submit(make_run("a", now - 100 + i, status=Status.TIMEOUT, tps=None))
                await asyncio.sleep(0.005)
            for _ in range(200):
                s = writer.stats()
                if s.outbox_runs + s.queue_depth + s.dropped_total == submitted:
                    break
                await asyncio.sleep(0.05)
            s = writer.stats()
            on_disk = s.outbox_runs
            assert 0 < on_disk < submitted and outbox.stat().st_size <= disk_full.limit
            assert s.queue_depth == 10  # held in memory, bounded by queue_size
            assert s.dropped_total == submitted - on_disk - 10
            await writer.close(timeout_s=2)  # memory cannot reach disk or database: counted, not silent
    finally:
        await writer.close(timeout_s=2)
        await dead.close()
    assert writer.stats().dropped_total == submitted - on_disk
    assert outbox.read_bytes().endswith(b"\n")  # no torn record left behind
    assert Outbox(outbox).pending == on_disk


def test_retry_timings_follow_the_resume_bound() -> None:
    from tokwatch.storage.writer import RetryTimings, resume_bound

    assert resume_bound(3600.0) == 30.0 and resume_bound(10.0) == 10.0
    assert RetryTimings.for_resume_within(30.0) == RetryTimings(1.0, 10.0, 15.0)  # a long interval
    ten = RetryTimings.for_resume_within(resume_bound(10.0))
    assert (ten.retry_min_s, round(ten.retry_max_s, 3), ten.check_interval_s) == (1.0, 3.333, 10.0)
    one = RetryTimings.for_resume_within(resume_bound(1.0))  # the shortest interval the config allows
    assert one.retry_min_s == one.retry_max_s == 1 / 3 and one.check_interval_s == 1.0


async def test_the_writer_follows_the_probe_interval_across_reloads(tmp_path: Path) -> None:
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config

    def write(interval: str) -> None:
        cfg.write_text(f"""
schedule: {{interval: {interval}, offset: 0s}}
storage: {{sqlite_path: '{tmp_path / "tw.db"}', outbox_path: '{tmp_path / "outbox.jsonl"}'}}
endpoints:
  - {{name: ep, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}}
""")

    cfg = tmp_path / "tokwatch.yml"
    write("10s")
    app = App(load_config(str(cfg)), str(cfg))
    await app.start(schedule=False)
    try:
        assert app.writer is not None
        assert app.writer.timings.retry_max_s == 10 / 3 and app.writer.timings.check_interval_s == 10.0
        write("1h")
        assert (await app.reload())[0]
        assert app.writer.timings.retry_max_s == 10.0 and app.writer.timings.check_interval_s == 15.0
    finally:
        await app.stop()


async def test_a_burst_of_dropped_runs_is_logged_once_with_its_count(
    tmp_path: Path, make_run: Any, disk_full: Any, caplog: Any
) -> None:
    """Outbox unwritable (a disk with no room at all) and memory full: runs beyond queue_size are dropped,
    counted, and logged once per burst with the count, never hidden by the repeat throttle."""
    import logging

    from tokwatch.storage.writer import DROP_BURST_QUIET_S

    store = SQLiteStore(tmp_path / "tw.db")
    # No writer task: every run goes through the producer's own path, so the drops are exact:
    # the 4th run spills 4 (3 kept, 1 dropped), the 8th and 12th spill 4 each with no room (4 + 4 dropped).
    writer = RunWriter(store, outbox_path=tmp_path / "outbox.jsonl", queue_size=3)
    now = time.time()
    disk_full.limit = 0
    with caplog.at_level(logging.ERROR, logger="tokwatch.storage.writer"):
        with disk_full.active():
            for i in range(12):
                writer.submit(make_run("a", now + i))
        assert writer.stats().dropped_total == 9
        for _ in range(int(DROP_BURST_QUIET_S * 40)):
            if any("runs dropped" in m for m in caplog.messages):
                break
            await asyncio.sleep(0.05)
    dropped = [m for m in caplog.messages if "runs dropped" in m]
    assert len(dropped) == 1 and dropped[0].startswith("storage: 9 runs dropped in ")
    assert "counted in tokwatch_storage_dropped_runs" in dropped[0]
    assert len([m for m in caplog.messages if "held in memory" in m]) == 1
