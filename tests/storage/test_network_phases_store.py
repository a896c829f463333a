"""Network phases in the store (SQLite and real PostgreSQL): written by both write paths, read back as
written, NULL for runs that measured none and for runs stored before the migrations (network_phases, then
proxy_connect); one file per version."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg
import pytest

from tests.storage.test_cost_store import COST_COLUMNS
from tokwatch.figures.result import RunResult, Status
from tokwatch.storage.base import RunStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import migrations_for, select_migrations
from tokwatch.storage.sqlite import SQLiteStore

PHASE_COLUMNS = (  # the network_phases migration's; proxy_connect's phase_proxy_connect_s came after
    "phase_resolve_s",
    "phase_connect_s",
    "phase_tls_s",
    "phase_processing_s",
    "network_rtt_s",
    "connection_reused",
)


def _query(
    store: RunStore, request: pytest.FixtureRequest, sql: str, *, fetch: bool = True
) -> list[tuple[Any, ...]]:
    """Rows of `sql` run straight on the store's database (SQLite's 0/1 flags made booleans)."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            cur = conn.execute(sql)
            names = [d[0] for d in cur.description or ()]
            rows = cur.fetchall() if fetch else []
        flag = names.index("connection_reused") if "connection_reused" in names else None
        return [
            tuple(bool(v) if i == flag and v is not None else v for i, v in enumerate(row)) for row in rows
        ]
    with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if fetch else []


def _measured(run_id: str, t: float) -> RunRow:
    result = RunResult(endpoint="a", started_at=t, status=Status.OK, run_id=run_id, ttft_s=0.31)
    result.phase_resolve_s, result.phase_connect_s, result.phase_tls_s = 0.004, 0.021, 0.043
    result.phase_processing_s, result.network_rtt_s, result.connection_reused = 0.025, 0.02, True
    result.phase_proxy_connect_s, result.proxied = 0.012, True
    return RunRow.from_result(result)


async def test_phases_are_stored_as_measured_by_both_write_paths(
    store: RunStore, request: pytest.FixtureRequest
) -> None:
    now = time.time()
    unmeasured = RunRow.from_result(RunResult(endpoint="a", started_at=now - 3, status=Status.UNREACHABLE))
    kept = RunResult(endpoint="a", started_at=now - 2, status=Status.OK, run_id="kept")
    kept.phase_processing_s, kept.connection_reused = 0.03, True  # a connection kept from an earlier round
    assert await store.write_runs([unmeasured, RunRow.from_result(kept), _measured("m1", now - 1)]) == 3
    assert await store.bulk_load([_measured("m2", now)]) == 1

    cols = ", ".join((*PHASE_COLUMNS, "phase_proxy_connect_s"))
    rows = _query(store, request, f"SELECT {cols}, run_id FROM runs ORDER BY time")
    assert rows == [
        (None, None, None, None, None, None, None, unmeasured.run_id),
        (None, None, None, 0.03, None, True, None, "kept"),
        (0.004, 0.021, 0.043, 0.025, 0.02, True, 0.012, "m1"),
        (0.004, 0.021, 0.043, 0.025, 0.02, True, 0.012, "m2"),
    ]


async def test_runs_stored_before_the_migration_keep_their_data(
    store: RunStore, request: pytest.FixtureRequest
) -> None:
    now = time.time()
    await store.write_runs([RunRow(run_id="old", time=now - 5, endpoint="a", status="ok", ttft_s=0.2)])
    family = "sqlite" if isinstance(store, SQLiteStore) else "postgres"
    *_, phases, proxy, cost, capacity = migrations_for(family)
    # Rolling back is only possible for the newest migrations (a later one may change what one added).
    names = (phases.name, proxy.name, cost.name, capacity.name)
    assert names == ("network_phases", "proxy_connect", "run_cost_energy", "bench_capacity"), (
        "a newer migration: roll it back too"
    )
    # Back to the schema before, from another connection: the columns and the version rows gone, the run kept.
    for sql in (
        *(f"ALTER TABLE runs DROP COLUMN {c}" for c in (*PHASE_COLUMNS, "phase_proxy_connect_s")),
        *(f"ALTER TABLE runs DROP COLUMN {c}" for c in COST_COLUMNS),
        "DROP TABLE bench_capacity",
        f"DELETE FROM tokwatch_schema WHERE version >= {phases.version}",
    ):
        _query(store, request, sql, fetch=False)
    assert (await store.schema_status()).current == phases.version - 1
    assert await store.migrate() == [phases.version, proxy.version, cost.version, capacity.version]
    await store.write_runs([_measured("new", now)])
    cols = "phase_connect_s, connection_reused, phase_proxy_connect_s, ttft_s, run_id"
    sql = f"SELECT {cols} FROM runs ORDER BY time"
    rows = _query(store, request, sql)
    assert rows == [(None, None, None, 0.2, "old"), (0.021, True, 0.012, 0.31, "new")]


def test_two_files_for_one_version_are_refused() -> None:
    files = [("0001_init.sql", "a"), ("0002_runs.sql", "b"), ("0002_network_phases.sql", "c")]
    with pytest.raises(RuntimeError, match="version 2 has two files"):
        select_migrations(files, "sqlite")
    # A flavor's own file for a version is not a second file: it wins over the shared one, whichever the
    # names put first.
    for own, shared in (("0002_a.timescale.sql", "0002_b.sql"), ("0002_b.timescale.sql", "0002_a.sql")):
        files = [("0001_init.sql", "a"), (own, "own"), (shared, "shared")]
        assert [m.sql for m in select_migrations(files, "timescale")] == ["a", "own"]
        assert [m.sql for m in select_migrations(files, "postgres")] == ["a", "shared"]
    with pytest.raises(RuntimeError, match=r"not numbered 1\.\.N"):
        select_migrations([("0001_init.sql", "a"), ("0003_x.sql", "c")], "sqlite")
