"""SQLite backend: migrations, idempotent writes, renames, retention, history across restarts, numpy check."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from tokwatch.config import StorageSettings
from tokwatch.storage import EndpointSpec, SchemaTooNewError, open_store, window_figures
from tokwatch.storage.base import WINDOW_INCLUDABLE
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore


def _row(endpoint: str, t: float, tps: float | None = 50.0, status: str = "ok") -> RunRow:
    return RunRow(run_id=f"{endpoint}-{t}", time=t, endpoint=endpoint, status=status, tokens_per_second=tps)


async def test_migrate_from_empty_then_idempotent(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db" / "tw.db")
    try:
        assert (await store.schema_status()).current == 0
        assert await store.migrate() == [1, 2, 3, 4, 5, 6]
        assert await store.migrate() == []
        st = await store.schema_status()
        assert (st.current, st.known, st.pending) == (6, 6, ())
    finally:
        await store.close()


async def test_history_survives_restart_and_replay_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "tw.db"
    now = time.time()
    rows = [_row("a", now - i * 3600, 40.0 + i) for i in range(10)]
    store = await open_store(StorageSettings(sqlite_path=str(path)), instance="i1")
    try:
        assert await store.write_runs(rows) == 10
        assert await store.write_runs(rows) == 0
    finally:
        await store.close()
    store = await open_store(StorageSettings(sqlite_path=str(path)), instance="i1")
    try:
        assert await store.write_runs(rows[:3]) == 0
        assert await store.count_runs() == 10
        last = await store.last_runs(now - 86400)
        assert last["a"].ok_tokens_per_second == 40.0
    finally:
        await store.close()


async def test_rename_keeps_id_and_history(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    try:
        ids = await store.sync_endpoints([EndpointSpec("old"), EndpointSpec("other")])
        await store.write_runs([_row("old", now - 100, 10.0), _row("old", now - 200, 30.0)])
        renamed = await store.sync_endpoints([EndpointSpec("new", ("old",)), EndpointSpec("other")])
        assert renamed["new"] == ids["old"] and renamed["other"] == ids["other"]
        await store.write_runs([_row("old", now - 50, 20.0)])  # late replay under the old name
        stats = await store.window_stats(now - 86400, now)
        assert stats["new"].runs == 3 and stats["new"].median == 20.0
        assert "old" not in stats
    finally:
        await store.close()


async def test_window_figures_match_numpy(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    rng = np.random.default_rng(3)
    now = time.time()
    try:
        values = rng.lognormal(4, 0.2, size=30)
        rows = [_row("x", now - 60 - i * 2000, float(v)) for i, v in enumerate(values)]
        rows += [_row("x", now - 30 - i, None, "rate_limited") for i in range(4)]
        await store.write_runs(rows)
        inside = np.array([v for i, v in enumerate(values) if 60 + i * 2000 < 86400])
        f = (await window_figures(store, now))["x"]
        assert f.median == pytest.approx(float(np.median(inside)), rel=1e-12)
        assert f.stddev == pytest.approx(float(np.std(inside, ddof=1)), rel=1e-12)
        assert f.cv == pytest.approx(float(np.std(inside, ddof=1) / np.mean(inside)), rel=1e-12)
        assert f.ok_runs == len(inside) and f.runs == len(inside) + 4
        assert f.uptime == pytest.approx(len(inside) / (len(inside) + 4))
    finally:
        await store.close()


async def test_hourly_rollup_recomputed_per_hour(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    hour = 1_700_000_000 - 1_700_000_000 % 3600
    try:
        await store.write_runs([_row("h", hour + 10, 10.0), _row("h", hour + 20, 30.0)])
        await store.write_runs([_row("h", hour + 30, 20.0), _row("h", hour + 40, None, "timeout")])
        (row,) = await store.hourly(hour, hour + 3600)
        assert row["runs"] == 4 and row["ok_runs"] == 3 and row["tps_samples"] == 3
        assert row["tps_median"] == 20.0 and row["tps_min"] == 10.0 and row["tps_max"] == 30.0
        assert row["tps_stddev"] == pytest.approx(10.0)
    finally:
        await store.close()


async def test_retention_deletes_old_runs(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "tw.db")
    now = time.time()
    try:
        await store.write_runs([_row("a", now - 500 * 86400), _row("a", now - 10)])
        report = await store.maintain(now, 400 * 86400)
        assert report.rows_deleted == 1
        assert await store.count_runs() == 1
    finally:
        await store.close()


async def test_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "tw.db"
    store = SQLiteStore(path)
    await store.migrate()
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO tokwatch_schema VALUES (42, 'future', 0)")
    with pytest.raises(SchemaTooNewError, match="schema version 42"):
        await open_store(StorageSettings(sqlite_path=str(path)), instance="t")


async def test_window_leaves_out_on_demand_and_disturbed_runs_unless_included(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "w.db")
    try:
        await store.migrate()
        now = time.time()
        await store.write_runs(
            [
                RunRow(run_id="s1", time=now - 10, endpoint="a", status="ok", tokens_per_second=100.0),
                RunRow(run_id="s2", time=now - 9, endpoint="a", status="ok", tokens_per_second=110.0),
                RunRow(
                    run_id="d", time=now - 8, endpoint="a", status="ok", tokens_per_second=900.0,
                    timing_disturbed=True, max_stall_s=0.2,
                ),
                RunRow(run_id="o", time=now - 7, endpoint="a", status="timeout", triggered_by="on_demand"),
            ]
        )
        plain = (await store.window_stats(now - 60, now))["a"]
        assert (plain.runs, plain.ok_runs, plain.median) == (2, 2, 105.0)
        everything = (await store.window_stats(now - 60, now, include=frozenset(WINDOW_INCLUDABLE)))["a"]
        assert (everything.runs, everything.ok_runs, everything.median) == (4, 3, 110.0)
    finally:
        await store.close()
