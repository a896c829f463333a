"""Each run's cost and energy in the store (SQLite and real PostgreSQL): written by both write paths, read
back as written, NULL for runs without prices or power and for runs stored before the migration."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg
import pytest

from tokwatch.figures.result import RunResult, Status
from tokwatch.storage.base import RunStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import migrations_for
from tokwatch.storage.sqlite import SQLiteStore

COST_COLUMNS = (
    "cost",
    "cost_currency",
    "cost_method",
    "cost_prompt_per_mtok",
    "cost_generation_per_mtok",
    "cost_blended_per_mtok",
    "energy_j",
    "energy_net_j",
    "energy_idle_watts",
)


def _query(store: RunStore, request: pytest.FixtureRequest, sql: str) -> list[tuple[Any, ...]]:
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _priced(run_id: str, t: float) -> RunRow:
    r = RunResult(endpoint="a", started_at=t, status=Status.OK, run_id=run_id)
    r.cost, r.cost_currency, r.cost_method = 0.00125, "EUR", "compute_time"
    r.cost_prompt_per_mtok, r.cost_generation_per_mtok, r.cost_blended_per_mtok = 0.18, 13.9, 3.61
    r.energy_j, r.energy_net_j, r.energy_idle_watts = 412.5, 92.5, 120.0
    return RunRow.from_result(r)


async def test_cost_and_energy_are_stored_as_measured_by_both_write_paths(
    store: RunStore, request: pytest.FixtureRequest
) -> None:
    now = time.time()
    plain = RunRow.from_result(RunResult(endpoint="a", started_at=now - 2, status=Status.OK))
    assert await store.write_runs([plain, _priced("p1", now - 1)]) == 2
    assert await store.bulk_load([_priced("p2", now)]) == 1
    rows = _query(store, request, f"SELECT {', '.join(COST_COLUMNS)}, run_id FROM runs ORDER BY time")
    figures = (0.00125, "EUR", "compute_time", 0.18, 13.9, 3.61, 412.5, 92.5, 120.0)
    assert rows == [(*(None,) * len(COST_COLUMNS), plain.run_id), (*figures, "p1"), (*figures, "p2")]


def test_the_migration_is_the_newest_of_both_families_and_adds_every_column() -> None:
    for family in ("sqlite", "postgres"):
        newest = migrations_for(family)[-1]
        assert newest.name == "run_cost_energy"
        assert all(f"ADD COLUMN {c} " in newest.sql for c in COST_COLUMNS), family
