"""The Run history dashboard's SQL, run against a REAL PostgreSQL with tokwatch's own migrations applied.

Grafana is not available here, so its macros ($__timeFilter, $__timeGroupAlias, multi-value $endpoint) are
expanded the way Grafana's PostgreSQL datasource does before the query reaches the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tokwatch
from dashboards import generate
from dashboards.lint import iter_panels
from tests.support.grafana_sql import expand_sql
from tests.support.postgres import LocalPostgres

psycopg = pytest.importorskip("psycopg")

MIGRATIONS = Path(tokwatch.__file__).resolve().parent / "storage" / "migrations" / "postgres"
T0 = datetime(2026, 5, 14, 12, 0, tzinfo=UTC)
RANGE = (T0 - timedelta(hours=1), T0 + timedelta(hours=6))


@pytest.fixture(scope="module")
def pg_dsn(pg_server: LocalPostgres) -> str:
    """A database on the session's throwaway PostgreSQL (tests/conftest.py)."""
    return pg_server.new_database()


@pytest.fixture(scope="module")
def store(pg_dsn: str) -> Iterator[Any]:
    """The store schema from tokwatch's migrations, with a few known runs."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for path in sorted(MIGRATIONS.glob("*.sql")):
            if ".timescale." not in path.name:
                conn.execute(path.read_text(encoding="utf-8"))
        # The exporter creates monthly partitions itself; a default partition stands in for them here.
        conn.execute("CREATE TABLE runs_test_default PARTITION OF runs DEFAULT")
        conn.execute("INSERT INTO endpoints (id, name) VALUES (1, 'titan'), (2, 'cloud'), (3, 'other')")
        runs = [
            ("r1", 1, "ok", 10.0, 0),
            ("r2", 1, "ok", 20.0, 60),
            ("r3", 1, "timeout", None, 120),
            ("r4", 1, "ok", 30.0, 180),
            ("r5", 2, "rate_limited", None, 60),
            ("r6", 2, "ok", 50.0, 240),
            ("r7", 3, "ok", 99.0, 240),
        ]
        for run_id, endpoint, status, tps, minutes in runs:
            conn.execute(
                "INSERT INTO runs (time, run_id, endpoint_id, status, tokens_per_second, timing_source, "
                "ttft_s, itl_p99_s, e2e_s, duration_s, http_status, error_class, error_message) "
                "VALUES (%s, %s, %s, %s, %s, 'engine', 0.2, 0.05, %s, %s, %s, %s, %s)",
                (
                    T0 + timedelta(minutes=minutes),
                    run_id,
                    endpoint,
                    status,
                    tps,
                    5.0 if status == "ok" else None,  # a failed run has no e2e latency ...
                    5.0 if status == "ok" else 60.0 if status == "timeout" else 0.3,  # ... but a duration
                    429 if status == "rate_limited" else None,
                    None if status == "ok" else status,
                    None if status == "ok" else f"{status} after retries",
                ),
            )
        # The same endpoint measured from site b with another workload: a series of its own, which the
        # panels above (site '' and seed000 selected) must not mix in.
        for run_id, status, tps, minutes in (("b1", "ok", 500.0, 30), ("b2", "timeout", None, 90)):
            conn.execute(
                "INSERT INTO runs (time, run_id, endpoint_id, status, tokens_per_second, timing_source, "
                "ttft_s, duration_s, workload, site) "
                "VALUES (%s, %s, 1, %s, %s, 'engine', 0.1, 5.0, 'long', 'b')",
                (T0 + timedelta(minutes=minutes), run_id, status, tps),
            )
        conn.execute(
            "INSERT INTO run_series (endpoint_id, workload, site, first_time, last_time) VALUES "
            "(1, 'seed000', '', %s, %s), (2, 'seed000', '', %s, %s), (1, 'long', 'b', %s, %s)",
            (T0, T0, T0, T0, T0, T0),
        )
        conn.execute(
            "INSERT INTO runs_hourly (endpoint_id, workload, site, bucket, runs, ok_runs, tps_samples, "
            "tps_median) VALUES (1, 'seed000', '', %s, 4, 3, 3, 20.0), (1, 'long', 'b', %s, 2, 1, 1, 500.0)",
            (T0, T0),
        )
        yield conn


def expand(
    sql: str,
    endpoints: list[str],
    interval_s: int = 3600,
    workloads: tuple[str, ...] = ("seed000",),
    sites: tuple[str, ...] = ("",),
) -> str:
    """The panel's SQL as Grafana's PostgreSQL datasource sends it for this selection."""
    variables = {"endpoint": endpoints, "workload": workloads, "site": sites}
    return expand_sql(sql, *RANGE, variables, interval_s)


def _queries() -> dict[str, str]:
    model = json.loads((generate.JSON_DIR / "tokwatch-history.json").read_text(encoding="utf-8"))
    queries = {
        f"{panel['title']}/{target['refId']}": target["rawSql"]
        for panel in iter_panels(model)
        for target in panel.get("targets", [])
    }
    for variable in model["templating"]["list"]:
        queries[f"variable {variable['name']}"] = variable["query"]
    return queries


def _rows(conn: Any, sql: str, **selected: Any) -> list[dict[str, Any]]:
    cur = conn.execute(expand(sql, ["titan", "cloud"], **selected))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_every_history_query_runs_on_the_real_schema(store: Any) -> None:
    queries = _queries()
    assert len(queries) == 10
    for where, sql in queries.items():
        try:
            _rows(store, sql)
        except psycopg.Error as exc:  # name the panel, not just the SQL error
            pytest.fail(f"{where}: {exc}")


def test_window_summary_matches_the_tile_definitions(store: Any) -> None:
    summary = next(sql for where, sql in _queries().items() if where.startswith("Window figures"))
    rows = {r["endpoint"]: r for r in _rows(store, summary)}
    assert set(rows) == {"titan", "cloud"}  # 'other' is not selected, nor titan's site-b series
    titan = rows["titan"]
    assert titan["median tok/s"] == pytest.approx(20.0)
    assert titan["stddev tok/s"] == pytest.approx(10.0)
    assert titan["CV"] == pytest.approx(0.5)
    assert titan["uptime"] == pytest.approx(0.75)
    assert (titan["runs"], titan["failed runs"]) == (4, 1)
    assert list(rows) == ["cloud", "titan"]  # ordered by median, fastest first


def test_tps_series_has_gaps_at_failed_runs(store: Any) -> None:
    tps = next(
        sql for where, sql in _queries().items() if where.startswith("tok/s per run") and where.endswith("/A")
    )
    titan = [r["value"] for r in _rows(store, tps) if r["metric"] == "titan · seed000"]
    assert titan == [10.0, 20.0, None, 30.0]
    failed = next(
        sql for where, sql in _queries().items() if where.startswith("tok/s per run") and where.endswith("/B")
    )
    counts = {r["metric"]: r["value"] for r in _rows(store, failed)}
    assert counts == {"titan · seed000 failed runs": 1, "cloud · seed000 failed runs": 1}


def test_recent_failures_table(store: Any) -> None:
    recent = next(sql for where, sql in _queries().items() if where.startswith("Recent non-ok runs"))
    rows = _rows(store, recent)
    assert [(r["endpoint"], r["status"], r["HTTP"]) for r in rows] == [
        ("titan", "TIMEOUT", None),
        ("cloud", "RATE LIMITED", 429),
    ]
    assert rows[1]["error class"] == "rate_limited"
    assert [r["duration"] for r in rows] == [60.0, 0.3]  # how long tokwatch waited, for failed runs too


def test_sites_and_workloads_stay_apart(store: Any) -> None:
    """Both sites and both workloads selected: one row (one series name) per endpoint, site and workload."""
    queries = _queries()
    both = {"workloads": ("seed000", "long"), "sites": ("", "b")}
    summary = next(sql for where, sql in queries.items() if where.startswith("Window figures"))
    rows = {(r["endpoint"], r["site"], r["workload"]): r for r in _rows(store, summary, **both)}
    assert set(rows) == {("titan", "", "seed000"), ("cloud", "", "seed000"), ("titan", "b", "long")}
    assert rows[("titan", "b", "long")]["median tok/s"] == pytest.approx(500.0)
    assert rows[("titan", "b", "long")]["uptime"] == pytest.approx(0.5)
    assert rows[("titan", "", "seed000")]["runs"] == 4
    hourly = next(sql for where, sql in queries.items() if where.startswith("Hourly median"))
    assert sorted((r["metric"], r["value"]) for r in _rows(store, hourly, **both)) == [
        ("titan @ b · long", 500.0),
        ("titan · seed000", 20.0),
    ]
    only_b = _rows(store, hourly, workloads=("seed000", "long"), sites=("b",))
    assert [r["metric"] for r in only_b] == ["titan @ b · long"]
    sites = store.execute(queries["variable site"]).fetchall()
    assert sites == [("(no site)", ""), ("b", "b")]
    assert store.execute(queries["variable workload"]).fetchall() == [("long",), ("seed000",)]
