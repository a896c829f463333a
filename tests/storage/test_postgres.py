"""PostgreSQL only, against a real server: partitions and their retention, secrets in errors, outages,
shards migrating at once, a full disk. What every store does is in test_store_contract.py."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.postgres import PASSWORD, LocalPostgres
from tests.support.stores import run_row
from tokwatch.figures.result import Status
from tokwatch.storage import (
    RunWriter,
    StorageError,
)
from tokwatch.storage.postgres import PostgresStore


async def _store(dsn: str, **kw: object) -> PostgresStore:
    store = PostgresStore(dsn, timeout_s=3.0, **kw)  # type: ignore[arg-type]
    await store.open()
    return store


async def test_runs_is_a_partitioned_table_without_timescaledb(pg_dsn: str) -> None:
    store = await _store(pg_dsn)
    try:
        await store.migrate()
        assert store.backend == "postgres"  # no timescaledb on this server
    finally:
        await store.close()
    with psycopg.connect(pg_dsn) as conn:
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'runs'").fetchone()
    assert kind == ("p",)  # partitioned table


async def test_partitions_ahead_and_retention_drop(pg_dsn: str) -> None:
    store = await _store(pg_dsn)
    try:
        await store.migrate()
        now = time.time()
        this_month = datetime.fromtimestamp(now, UTC)
        parts = await store.partitions()
        assert f"runs_p{this_month.year:04d}_{this_month.month:02d}" in parts
        assert len(parts) >= 4  # previous, current and two ahead
        # A replayed run far in the past gets its own partition on demand.
        old = datetime(2020, 3, 15, tzinfo=UTC).timestamp()
        assert await store.write_runs([run_row("a", old), run_row("a", now)]) == 2
        assert "runs_p2020_03" in await store.partitions()
        report = await store.maintain(now, retention_s=400 * 86400)
        assert "runs_p2020_03" in report.partitions_dropped
        assert "runs_p2020_03" not in await store.partitions()
        assert await store.count_runs() == 1  # the recent run survives
    finally:
        await store.close()


async def test_password_never_in_errors(
    pg_server: LocalPostgres, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-Pa55word-xyz"
    dsn = pg_dsn.replace(PASSWORD, wrong)
    store = await _store(dsn)
    try:
        with pytest.raises(StorageError) as info:
            await store.migrate()
        message = str(info.value)
        assert wrong not in message and PASSWORD not in message
        assert "127.0.0.1" in message  # still says which database
        assert "password authentication failed" in message  # and why
        assert PASSWORD not in store.location and wrong not in store.location
    finally:
        await store.close()
    # Unparseable DSN: clear error, no secret.
    with pytest.raises(StorageError) as bad:
        PostgresStore(f"host=127.0.0.1 password={wrong} port")
    assert "invalid storage DSN" in str(bad.value)
    assert wrong not in str(bad.value)
    # a password with a space: psycopg's own message would quote a piece of it
    with pytest.raises(StorageError) as spaced:
        PostgresStore("host=127.0.0.1 password=two words here dbname=tw")
    assert "words" not in str(spaced.value) and "password='…'" in str(spaced.value)
    assert wrong not in caplog.text and PASSWORD not in caplog.text  # pool warnings included


async def test_outage_mid_run_every_run_arrives_once(
    pg_server: LocalPostgres, pg_dsn: str, tmp_path: Path, make_run: Any
) -> None:
    store = await _store(pg_dsn)
    writer = RunWriter(
        store, outbox_path=tmp_path / "outbox.jsonl", write_timeout_s=2.0, retry_min_s=0.2, retry_max_s=0.5
    )
    await writer.start()
    now = time.time()
    try:
        first = [make_run("ep", now - 100 + i) for i in range(5)]
        for r in first:
            writer.submit(r)
        assert await writer.flush(10)
        await asyncio.to_thread(pg_server.stop)
        during = [make_run("ep", now - 50 + i, status=Status.TIMEOUT, tps=None) for i in range(7)]
        for r in during:
            writer.submit(r)
        for _ in range(200):  # the runs are on disk at once; the writer notices the outage
            if writer.outbox.pending == len(during) and writer.stats().write_errors_total:
                break
            await asyncio.sleep(0.05)
        assert writer.outbox.pending == len(during)
        s = writer.stats()
        assert s.write_errors_total >= 1 and not s.up and s.oldest_unwritten_age_seconds > 0
        await asyncio.to_thread(pg_server.start)
        writer.submit(make_run("ep", now))
        assert await writer.flush(30)
        assert writer.stats().up
    finally:
        await writer.close()
        await store.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT run_id, count(*) FROM runs GROUP BY run_id").fetchall()
    assert len(rows) == 13
    assert all(n == 1 for _, n in rows)
    assert {r[0] for r in rows} >= {r.run_id for r in during}


async def _until(predicate: Any, timeout_s: float, step_s: float = 0.1) -> float:
    """Seconds until `predicate()` held (polled); fails the test at the timeout."""
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s:g}s"
        await asyncio.sleep(step_s)
    return time.monotonic() - t0


@pytest.mark.slow
async def test_storage_up_is_measured_and_writes_resume_soon_after_a_long_outage(
    pg_server: LocalPostgres, pg_dsn: str, tmp_path: Path, make_run: Any
) -> None:
    # Defaults as shipped (retry backoff, pool), except a faster idle check so the test need not wait 15 s.
    store = PostgresStore(pg_dsn, timeout_s=2.0)
    await store.open()
    outbox = tmp_path / "outbox.jsonl"
    writer = RunWriter(store, outbox_path=outbox, write_timeout_s=2.0, check_interval_s=1.0)
    await writer.start()
    now = time.time()
    try:
        writer.submit(make_run("ep", now - 100))
        assert await writer.flush(15)
        assert writer.stats().up
        await asyncio.to_thread(pg_server.stop)
        # Nothing is written during the outage, yet the gauge falls: it comes from a real round trip.
        await _until(lambda: not writer.stats().up, 10)
        # Long enough for psycopg's pool to back off its own reconnects to tens of seconds (issue 9: 122 s).
        for i in range(8):
            writer.submit(make_run("ep", now - 60 + i, status=Status.TIMEOUT, tps=None))
            await asyncio.sleep(5)
        assert writer.outbox.pending == 8 and not writer.stats().up
        await asyncio.to_thread(pg_server.start)
        resumed_after = await _until(lambda: writer.outbox.pending == 0 and writer.stats().up, 30)
        print(f"writes resumed {resumed_after:.1f}s after PostgreSQL was back")
    finally:
        await writer.close()
        await store.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT run_id, count(*) FROM runs GROUP BY run_id").fetchall()
    assert len(rows) == 9 and all(n == 1 for _, n in rows)


async def test_shards_starting_together_share_one_schema(pg_dsn: str) -> None:
    stores = [await _store(pg_dsn) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(len(a) for a in applied)[:3] == [0, 0, 0]  # one of them migrated, under the lock
        # Every store then creates next months' partitions and writes at once: no "already exists".
        now = time.time()
        await asyncio.gather(*(s.maintain(now + 40 * 86400, 400 * 86400.0) for s in stores))
        later = now + 70 * 86400
        written = await asyncio.gather(
            *(s.write_runs([run_row("a", later + i, run_id=f"r{i}")]) for i, s in enumerate(stores))
        )
        assert written == [1, 1, 1, 1]
    finally:
        for s in stores:
            await s.close()


async def test_disk_full_runs_in_memory_still_reach_the_database(
    pg_dsn: str, tmp_path: Path, make_run: Any, disk_full: Any
) -> None:
    store = await _store(pg_dsn)  # the server is another process: the file-size limit is this one's
    outbox = tmp_path / "outbox.jsonl"
    outbox.write_bytes(b"\n" * disk_full.limit)  # an outbox already at the limit
    writer = RunWriter(store, outbox_path=outbox, queue_size=100)
    await writer.start()
    try:
        with disk_full.active():
            for i in range(5):
                writer.submit(make_run("a", time.time() + i))
            await _until(lambda: writer.stats().writes_total == 5, 15)
    finally:
        await writer.close()
        await store.close()
    s = writer.stats()
    assert (s.writes_total, s.dropped_total, s.queue_depth) == (5, 0, 0)


@pytest.mark.slow
async def test_writes_resume_within_the_probe_interval_after_postgres_returns(
    pg_server: LocalPostgres, pg_dsn: str, tmp_path: Path, make_run: Any
) -> None:
    # The exporter as shipped, with a 10 s probe interval: writes must resume within min(30 s, 10 s).
    from tokwatch.service.app import App
    from tokwatch.settings.config import load_config_text
    from tokwatch.storage.writer import resume_bound

    cfg = load_config_text(f"""
schedule: {{interval: 10s, offset: 0s}}
storage: {{dsn: '{pg_dsn}', outbox_path: '{tmp_path / "outbox.jsonl"}'}}
endpoints:
  - {{name: ep, kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}}
""")
    bound = resume_bound(cfg.schedule.interval)
    assert bound == 10.0
    app = App(cfg)
    await app.start(schedule=False)
    writer = app.writer
    assert writer is not None
    now = time.time()
    try:
        writer.submit(make_run("ep", now - 100))
        assert await writer.flush(15)
        await asyncio.to_thread(pg_server.stop)
        for i in range(3):
            writer.submit(make_run("ep", now - 60 + i, status=Status.TIMEOUT, tps=None))
        # Down long enough for the writer's back-off to reach its cap (1 s, 2 s, then 10/3 s; it was 10 s) and
        # the pool's own reconnect back-off to grow; PostgreSQL comes back right after a failed attempt, the
        # worst moment: the whole back-off is still ahead.
        await _until(lambda: writer.stats().write_errors_total >= 5, 40, step_s=0.01)
        assert writer.outbox.pending == 3 and not writer.stats().up
        await asyncio.to_thread(pg_server.start)
        resumed_after = await _until(lambda: writer.outbox.pending == 0, 30, step_s=0.02)
        print(f"writes resumed {resumed_after:.1f}s after PostgreSQL was back (bound {bound:g}s)")
        assert resumed_after < bound
        assert writer.stats().up
    finally:
        await app.stop()
        if not pg_server.running:
            await asyncio.to_thread(pg_server.start)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT run_id, count(*) FROM runs GROUP BY run_id").fetchall()
    assert len(rows) == 4 and all(n == 1 for _, n in rows)
