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
from tokwatch.storage.bench_rows import CAPACITY_COLUMNS, CapacityRow
from tokwatch.storage.factory import bench_store
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


def test_the_migrations_are_the_newest_of_both_families_and_add_every_column() -> None:
    for family in ("sqlite", "postgres"):
        *_, cost, capacity = migrations_for(family)
        assert (cost.name, capacity.name) == ("run_cost_energy", "bench_capacity")
        assert all(f"ADD COLUMN {c} " in cost.sql for c in COST_COLUMNS), family
        assert all(f"    {c} " in capacity.sql for c in CAPACITY_COLUMNS), family


async def test_the_latest_capacity_search_of_an_endpoint_is_read_back(store: RunStore) -> None:
    bench = bench_store(store)
    now = time.time()

    def row(i: str, at: float, endpoint: str = "own", rate: float | None = 4.0) -> CapacityRow:
        return CapacityRow(id=i, finished_at=at, endpoint=endpoint, model="m", mode="slo", result_rate=rate,
                           output_tokens_per_s=None if rate is None else rate * 200, lower_bound=i == "new",
                           summary='{"mode": "slo"}', instance="lab")  # fmt: skip

    assert await bench.latest_capacity("own") is None
    assert await bench.write_capacity(row("old", now - 3600, rate=2.0))
    assert await bench.write_capacity(row("new", now - 60))
    assert await bench.write_capacity(row("failed", now - 10, rate=None))  # found no rate: not a basis
    assert await bench.write_capacity(row("other", now, endpoint="else"))
    assert not await bench.write_capacity(row("new", now))  # an id already stored is left as is
    latest = await bench.latest_capacity("own")
    assert latest is not None and latest.id == "new" and latest.lower_bound is True
    assert latest.finished_at == pytest.approx(now - 60) and latest.output_tokens_per_s == 800.0
