"""The Benchmarks dashboard's SQL, run against a REAL PostgreSQL migrated by tokwatch and filled by the store.

Grafana is not available here, so its macros ($__timeFilter, multi-value $endpoint, single-value $run) are
expanded the way Grafana's PostgreSQL datasource does before the query reaches the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from dashboards import generate
from dashboards.lint import iter_panels
from tests.support.grafana_sql import expand_sql
from tests.support.postgres import LocalPostgres
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.slo import parse_slo
from tokwatch.bench.storing import bench_rows
from tokwatch.figures.result import Status
from tokwatch.storage.factory import bench_store
from tokwatch.storage.postgres import PostgresStore

psycopg = pytest.importorskip("psycopg")

T0 = datetime(2026, 5, 14, 12, 0, tzinfo=UTC).timestamp()
RANGE = (datetime(2026, 5, 14, 11, 0, tzinfo=UTC), datetime(2026, 5, 14, 18, 0, tzinfo=UTC))


def _outcome(run_id: str, endpoint: str, start: float, ttfts: list[float], failed: int = 0) -> BenchOutcome:
    records = []
    for i, ttft in enumerate(ttfts):
        r = RequestRecord(i, "chat", sent_at_s=0.1 * i, started_at_s=0.1 * i, dispatched_at_s=0.1 * i)
        r.ttft_s, r.tbt_s, r.e2e_s, r.tpot_s = ttft, [0.01, 0.01], ttft + 0.02, 0.01
        r.output_tokens, r.think_tokens, r.prompt_tokens = 3, 0, 10
        r.completed_at_s = r.sent_at_s + r.e2e_s
        records.append(r)
    for j in range(failed):
        r = RequestRecord(len(ttfts) + j, "chat", status=Status.TIMEOUT, sent_at_s=0.05, completed_at_s=0.5)
        records.append(r)
    return BenchOutcome(
        options={"endpoint": endpoint, "model": "m", "kind": "vllm", "load": "closed loop, concurrency 2"},
        records=records,
        started_at_unix=start,
        wall_s=2.0,
        complete=failed == 0,
        stop_reason="finished" if failed == 0 else "interrupted",
        slos=[parse_slo("ttft:p99<=0.5")],
        run_id=run_id,
    )


@pytest.fixture(scope="module")
def conn(pg_server: LocalPostgres) -> Iterator[Any]:
    """A database on the session's throwaway PostgreSQL, migrated by PostgresStore, with known bench runs."""
    dsn = pg_server.new_database()

    async def fill() -> None:
        store = PostgresStore(dsn, timeout_s=10)
        await store.open()
        try:
            await store.migrate()
            runs = [
                _outcome("run-a", "titan", T0, [0.1, 0.2, 0.3, 0.4]),
                _outcome("run-b", "titan", T0 + 3600, [0.2, 0.2, 0.9, 0.3], failed=1),
                _outcome("run-c", "cloud", T0 + 7200, [0.05, 0.06]),
                _outcome("run-old", "titan", T0 - 86400, [1.0]),  # outside the time range
            ]
            for outcome in runs:
                await bench_store(store).write_bench(*bench_rows(outcome))
        finally:
            await store.close()

    asyncio.run(fill())
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def expand(sql: str, endpoints: list[str], run: str = "run-b") -> str:
    """The panel's SQL as Grafana's PostgreSQL datasource sends it for this selection."""
    return expand_sql(sql, *RANGE, {"endpoint": endpoints, "run": run})


def _model() -> dict[str, Any]:
    return dict(json.loads((generate.JSON_DIR / "tokwatch-benchmarks.json").read_text(encoding="utf-8")))


def _queries() -> dict[str, str]:
    model = _model()
    queries = {
        f"{panel['title']}/{target['refId']}": target["rawSql"]
        for panel in iter_panels(model)
        for target in panel.get("targets", [])
    }
    for variable in model["templating"]["list"]:
        queries[f"variable {variable['name']}"] = variable["query"]
    return queries


def _rows(conn: Any, sql: str, endpoints: tuple[str, ...] = ("titan", "cloud")) -> list[dict[str, Any]]:
    cur = conn.execute(expand(sql, list(endpoints)))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _query(prefix: str) -> str:
    return next(sql for where, sql in _queries().items() if where.startswith(prefix))


def test_every_benchmarks_query_runs_on_the_real_schema(conn: Any) -> None:
    queries = _queries()
    assert len(queries) == 8  # 6 panel queries + 2 variables
    for where, sql in queries.items():
        try:
            _rows(conn, sql)
        except psycopg.Error as exc:  # name the panel, not just the SQL error
            pytest.fail(f"{where}: {exc}")


def test_runs_table(conn: Any) -> None:
    rows = _rows(conn, _query("Bench runs/"))
    assert [r["run id"] for r in rows] == ["run-c", "run-b", "run-a"]  # newest first, old run out of range
    b = rows[1]
    assert (b["endpoint"], b["model"], b["complete"], b["ok/measured"]) == (
        "titan",
        "m",
        "no (interrupted)",
        "4/5",
    )
    assert b["SLOs"] == "MISSED" and b["goodput"] == pytest.approx(3 / 5)
    assert rows[2]["SLOs"] == "met" and rows[2]["complete"] == "yes"
    assert rows[2]["TTFT p99"] == pytest.approx(0.397, abs=1e-3)
    assert [r["run id"] for r in _rows(conn, _query("Bench runs/"), ("cloud",))] == ["run-c"]


def test_per_run_series(conn: Any) -> None:
    latency = _rows(conn, _query("TTFT and TBT p99 per run"))
    assert {r["metric"] for r in latency} == {
        "titan TTFT p99",
        "titan TBT p99",
        "cloud TTFT p99",
        "cloud TBT p99",
    }
    titan_ttft = [r["value"] for r in latency if r["metric"] == "titan TTFT p99"]
    assert len(titan_ttft) == 2 and titan_ttft[0] == pytest.approx(0.397, abs=1e-3)
    throughput = _rows(conn, _query("Token throughput per run"))
    assert {r["metric"] for r in throughput} >= {"titan overall", "cloud overall"}
    goodput = {(r["metric"], round(r["value"], 3)) for r in _rows(conn, _query("Goodput per run"))}
    assert goodput == {("titan", 1.0), ("titan", 0.6), ("cloud", 1.0)}


def test_selected_run_request_panels(conn: Any) -> None:
    ttft = _rows(conn, _query("Request TTFT distribution"))
    assert sorted(r["TTFT"] for r in ttft) == [0.2, 0.2, 0.3, 0.9]  # ok requests of run-b only
    summary = _rows(conn, _query("Request TTFT summary"))[0]
    assert (summary["requests"], summary["ok"]) == (5, 4)
    assert summary["TTFT max"] == pytest.approx(0.9)
    choices = _rows(conn, _queries()["variable run"])
    assert [c["__value"] for c in choices] == ["run-c", "run-b", "run-a", "run-old"]
    assert choices[0]["__text"].startswith("2026-05-14 14:00:00 cloud m")
    endpoints = _rows(conn, _queries()["variable endpoint"])
    assert [e["endpoint"] for e in endpoints] == ["cloud", "titan"]
