"""What every store promises, run against SQLite and a real PostgreSQL: migrations, refusing a newer schema,
idempotent replay across a restart, renames, window figures, the hourly rollup, retention, the window rule.

What only one backend does stays in its own file: PostgreSQL's partitions, outages, passwords and shards in
test_postgres.py, TimescaleDB in test_timescale.py, the SQLite file in test_sqlite.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.support.stores import Database, run_row
from tokwatch.figures.series import SeriesKey
from tokwatch.storage import EndpointSpec, SchemaTooNewError, open_store, window_figures
from tokwatch.storage.base import RunStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import known_version
from tokwatch.windows.window_rule import WINDOW_INCLUDABLE, WindowRule

MIGRATIONS = {flavor: list(range(1, known_version(flavor) + 1)) for flavor in ("sqlite", "postgres")}
# SQLite's statistics are computed in Python, PostgreSQL's by stddev_samp in SQL.
STDDEV_REL = {"sqlite": 1e-12, "postgres": 1e-9}
FUTURE_SCHEMA = {
    "sqlite": "INSERT INTO tokwatch_schema (version, name, applied_at) VALUES (99, 'from_the_future', 0)",
    "postgres": "INSERT INTO tokwatch_schema (version, name) VALUES (99, 'from_the_future')",
}


async def test_migrate_from_empty_then_idempotent(database: Database) -> None:
    store = await database.open()
    try:
        assert (await store.schema_status()).current == 0
        versions = MIGRATIONS[database.backend]
        assert await store.migrate() == versions
        assert await store.migrate() == []
        st = await store.schema_status()
        assert (st.current, st.known, st.pending, st.too_new) == (len(versions), len(versions), (), False)
    finally:
        await store.close()


async def test_refuses_newer_schema(database: Database) -> None:
    store = await database.open()
    await store.migrate()
    await store.close()
    database.execute(FUTURE_SCHEMA[database.backend])  # as a newer tokwatch would have left it
    with pytest.raises(SchemaTooNewError, match="schema version 99, newer than this tokwatch knows"):
        await open_store(database.settings, instance="test")


async def test_history_survives_restart_and_replay_is_idempotent(database: Database) -> None:
    now = time.time()
    rows = [run_row("a", now - i * 3600, 40.0 + i) for i in range(20)]
    store = await open_store(database.settings, instance="i1")
    try:
        assert await store.write_runs(rows) == 20
        assert await store.write_runs(rows) == 0
        assert await store.write_runs(rows[5:8]) == 0
    finally:
        await store.close()
    store = await open_store(database.settings, instance="i1")
    try:
        assert await store.write_runs(rows[:3]) == 0
        assert await store.count_runs() == 20
        last = await store.last_runs(now - 86400)
        assert last[SeriesKey("a")].ok_tokens_per_second == 40.0
    finally:
        await store.close()


async def test_rename_keeps_id_and_history(store: RunStore) -> None:
    now = time.time()
    ids = await store.sync_endpoints([EndpointSpec("old"), EndpointSpec("other")])
    await store.write_runs([run_row("old", now - 3600, 10.0), run_row("old", now - 7200, 30.0)])
    renamed = await store.sync_endpoints([EndpointSpec("new", ("old",)), EndpointSpec("other")])
    assert renamed["new"] == ids["old"] and renamed["other"] == ids["other"]
    await store.write_runs([run_row("old", now - 60, 20.0)])  # a late replay under the old name: same id
    stats = await store.window_stats(now - 86400, now + 1, rule=WindowRule())
    assert set(stats) == {SeriesKey("new")}
    assert SeriesKey("old") not in stats
    assert stats[SeriesKey("new")].runs == 3 and stats[SeriesKey("new")].median == 20.0
    again = await store.sync_endpoints([EndpointSpec("new", ("old",)), EndpointSpec("other")])
    assert again == renamed  # idempotent


async def test_window_figures_match_numpy(database: Database, store: RunStore) -> None:
    rel = STDDEV_REL[database.backend]
    rng = np.random.default_rng(7)
    now = time.time()
    rows: list[RunRow] = []
    expected = {}
    for ep in ("alpha", "beta", "gamma"):
        values = rng.lognormal(4, 0.2, size=37)
        statuses = ["ok"] * 37 + ["timeout"] * 3
        for i, st in enumerate(statuses):
            tps = float(values[i]) if st == "ok" else None
            rows.append(run_row(ep, now - 600 - i * 1800, tps, st))
        rows.append(run_row(ep, now - 3 * 86400, 999.0))  # outside 24 h, inside 7 d
        ok_in = [float(values[i]) for i in range(37) if 600 + i * 1800 < 86400]
        expected[ep] = (ok_in, sum(1 for i in range(40) if 600 + i * 1800 < 86400))
    rows += [run_row("alpha", now - 30 - i, None, "rate_limited") for i in range(4)]
    expected["alpha"] = (expected["alpha"][0], expected["alpha"][1] + 4)
    await store.write_runs(rows)
    figures = await window_figures(store, now, rule=WindowRule())
    for ep, (ok_in, n_all) in expected.items():
        f = figures[SeriesKey(ep)]
        arr = np.array(ok_in)
        assert f.window == "24h"
        assert f.runs == n_all
        assert f.ok_runs == len(ok_in)
        assert f.median == pytest.approx(float(np.median(arr)), rel=1e-12)
        assert f.stddev == pytest.approx(float(np.std(arr, ddof=1)), rel=rel)
        assert f.cv == pytest.approx(float(np.std(arr, ddof=1) / np.mean(arr)), rel=rel)
        assert f.uptime == pytest.approx(len(ok_in) / n_all)
    hourly = await store.hourly(now - 86400, now + 3600)
    assert sum(int(h["runs"]) for h in hourly if h["endpoint"] == "alpha") >= expected["alpha"][1]  # type: ignore[call-overload]


async def test_hourly_rollup_recomputed_per_hour(store: RunStore) -> None:
    hour = 1_700_000_000 - 1_700_000_000 % 3600
    await store.write_runs([run_row("h", hour + 10, 10.0), run_row("h", hour + 20, 30.0)])
    await store.write_runs([run_row("h", hour + 30, 20.0), run_row("h", hour + 40, None, "timeout")])
    (row,) = await store.hourly(hour, hour + 3600)
    assert row["runs"] == 4 and row["ok_runs"] == 3 and row["tps_samples"] == 3
    assert row["tps_median"] == 20.0 and row["tps_min"] == 10.0 and row["tps_max"] == 30.0
    assert row["tps_stddev"] == pytest.approx(10.0)


async def test_retention_removes_old_runs_and_keeps_recent_ones(store: RunStore) -> None:
    now = time.time()
    await store.write_runs([run_row("a", now - 500 * 86400), run_row("a", now - 10)])
    report = await store.maintain(now, 400 * 86400)
    assert await store.count_runs() == 1
    if store.backend == "sqlite":  # row by row; PostgreSQL drops whole months (test_postgres.py names them)
        assert report.rows_deleted == 1
    else:
        assert report.partitions_dropped


async def test_window_leaves_out_on_demand_and_disturbed_runs_unless_included(
    database: Database, store: RunStore
) -> None:
    now = time.time()
    await store.write_runs(
        [
            RunRow(run_id="s1", time=now - 10, endpoint="a", status="ok", tokens_per_second=100.0),
            RunRow(run_id="s2", time=now - 9, endpoint="a", status="ok", tokens_per_second=110.0),
            RunRow(
                run_id="d", time=now - 8, endpoint="a", status="ok", tokens_per_second=900.0,
                timing_disturbed=True, max_stall_s=0.2, merged_reads=3, send_delay_s=0.001,
                tps_set_aside=True,
            ),
            RunRow(run_id="o", time=now - 7, endpoint="a", status="timeout", triggered_by="on_demand"),
        ]
    )
    plain = (await store.window_stats(now - 60, now, rule=WindowRule()))[SeriesKey("a")]
    # the disturbed run counts (its status), its set-aside tok/s is no sample
    assert (plain.runs, plain.ok_runs, plain.median, plain.tps_set_aside) == (3, 3, 105.0, 1)
    everything = (await store.window_stats(now - 60, now, rule=WindowRule.of(WINDOW_INCLUDABLE)))[
        SeriesKey("a")
    ]
    assert (everything.runs, everything.ok_runs, everything.median) == (4, 3, 110.0)
    (row,) = database.execute(
        "SELECT triggered_by, timing_disturbed, max_stall_s, merged_reads FROM runs WHERE run_id = 'd'"
    )
    assert row == ("scheduled", True, 0.2, 3)  # SQLite's 1 for true compares equal
