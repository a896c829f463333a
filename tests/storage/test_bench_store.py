"""Bench runs in the store: rows from a BenchOutcome, migration of a database with data, idempotent writes."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from tests.support.stores import Database
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.slo import parse_slo
from tokwatch.bench.storing import bench_rows
from tokwatch.commands.store_commands import add_commands
from tokwatch.figures.result import Status
from tokwatch.storage.base import RunStore
from tokwatch.storage.factory import bench_store
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import known_version, migrations_for
from tokwatch.storage.sqlite import SQLiteStore

T0 = 1_790_000_000.0
SECRET = "sk-bench-secret-123456"


def _record(i: int, *, ok: bool = True, warmup: bool = False) -> RequestRecord:
    sent = 0.1 * i
    r = RequestRecord(i, "chat", warmup=warmup, sent_at_s=sent, started_at_s=sent, dispatched_at_s=sent)
    if ok:
        r.ttft_s = 0.1 + 0.01 * i
        r.tbt_s = [0.01, 0.02, 0.03]
        r.e2e_s = r.ttft_s + 0.06
        r.tpot_s = 0.02
        r.output_tokens, r.think_tokens, r.prompt_tokens = 4, 0, 100
        r.tokens_source = "usage"
        r.fluidity_index = 1.0
        r.decode_tokens_per_s = 50.0 + i
        r.completed_at_s = sent + r.e2e_s
    else:
        r.status = Status.PROVIDER_ERROR
        r.error_class = f"http_5xx token={SECRET}"
        r.completed_at_s = sent + 0.01
    return r


def _outcome(run_id: str = "bench-1", *, complete: bool = True, slos: bool = True) -> BenchOutcome:
    records = [_record(0, warmup=True), *(_record(i) for i in range(1, 9)), _record(9, ok=False)]
    return BenchOutcome(
        options={
            "endpoint": None,
            "target": f"http://user:{SECRET}@127.0.0.1:9/v1",
            "model": "m",
            "kind": "vllm",
            "load": "open loop 4/s poisson",
            "rate": 4.0,
            "arrivals": "poisson",
            "max_concurrency": 8,
        },
        records=records,
        started_at_unix=T0,
        wall_s=2.0,
        complete=complete,
        stop_reason="finished" if complete else "interrupted",
        slos=[parse_slo("ttft:p99<=0.5")] if slos else [],
        requested_rate=4.0,
        run_id=run_id,
    )


def test_rows_from_an_outcome() -> None:
    run, requests = bench_rows(_outcome(), instance="host-a")
    assert run.id == "bench-1" and run.instance == "host-a"
    assert SECRET not in run.endpoint and "127.0.0.1:9/v1" in run.endpoint
    assert (run.requests_measured, run.requests_ok, run.requests_errored) == (9, 8, 1)
    assert (run.arrivals, run.concurrency, run.requested_rate) == ("poisson", 8, 4.0)
    assert run.all_slos_met is True and run.goodput_ratio == pytest.approx(8 / 9)
    assert run.ttft_p50_s is not None and run.ttft_p50_s < run.ttft_p99_s  # type: ignore[operator]
    assert run.finished_at == T0 + 2.0
    assert json.loads(run.summary)["run_id"] == "bench-1" and SECRET not in run.summary
    assert [r.request_id for r in requests] == list(range(1, 10))  # warm-up excluded
    assert requests[0].sent_at == pytest.approx(T0 + 0.1)
    assert requests[0].tbt_p50_s == pytest.approx(0.02)
    assert requests[0].tbt_s == (0.01, 0.02, 0.03) and requests[-1].tbt_s == ()  # a failure: no gaps
    assert requests[0].normalized_latency_s == pytest.approx((0.11 + 0.06) / 4)
    assert run.generated_tokens_per_s == pytest.approx(32 / (2.0 - 0.1))  # 8 ok x 4 tokens, first send 0.1
    assert requests[-1].status == "provider_error" and SECRET not in (requests[-1].error_class or "")
    no_slo, _ = bench_rows(_outcome(slos=False))
    assert no_slo.all_slos_met is None


async def _roundtrip(store: RunStore) -> None:
    bench = bench_store(store)
    run, requests = bench_rows(_outcome(), instance="i")
    assert await bench.write_bench(run, requests) is True
    assert await bench.write_bench(run, requests) is False  # same run again: stored once
    later = _outcome("bench-2", complete=False)
    later.started_at_unix = T0 + 5
    partial, partial_requests = bench_rows(later)
    assert await bench.write_bench(partial, partial_requests) is True
    got = await bench.bench_runs(T0 - 1)
    assert [r.id for r in got] == ["bench-2", "bench-1"]  # newest first
    first = next(r for r in got if r.id == "bench-1")
    assert first.complete is True and first.all_slos_met is True
    assert first.started_at == pytest.approx(T0) and first.ttft_p99_s == pytest.approx(run.ttft_p99_s)
    assert json.loads(first.summary)["requests"]["total"] == 9
    assert next(r for r in got if r.id == "bench-2").complete is False
    assert await bench.bench_runs(T0 + 10) == []
    assert await store.count_runs() == 0  # never in the probe runs table
    # Read back by id for `bench compare`: every per-request figure, gap lists exact (empty stays empty).
    assert await bench.bench_run_ids("bench-") == ["bench-1", "bench-2"]
    assert await bench.bench_run_ids("bench-2") == ["bench-2"]
    assert await bench.bench_run_ids("bench_") == []  # `_` is no wildcard
    assert await bench.bench_run("bench-9") is None
    stored = await bench.bench_run("bench-1")
    assert stored is not None
    stored_run, stored_requests = stored
    assert stored_run.generated_tokens_per_s == run.generated_tokens_per_s
    assert [r.request_id for r in stored_requests] == list(range(1, 10))
    assert [r.tbt_s for r in stored_requests] == [r.tbt_s for r in requests]
    assert [r.normalized_latency_s for r in stored_requests] == [r.normalized_latency_s for r in requests]
    assert [r.decode_tokens_per_s for r in stored_requests] == [r.decode_tokens_per_s for r in requests]
    assert stored_requests[0].sent_at == pytest.approx(requests[0].sent_at)


async def test_a_bench_run_is_stored_once_and_read_back(database: Database, store: RunStore) -> None:
    await _roundtrip(store)
    counts = database.execute("SELECT bench_run_id, count(*) FROM bench_requests GROUP BY 1 ORDER BY 1")
    assert [tuple(row) for row in counts] == [("bench-1", 9), ("bench-2", 9)]


async def test_sqlite_migrates_from_version_1_keeping_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    v1 = migrations_for("sqlite")[0]
    with sqlite3.connect(path) as conn:  # a database exactly as tokwatch with schema 1 left it
        conn.executescript(v1.sql)
        conn.execute("CREATE TABLE tokwatch_schema (version INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
        conn.execute("INSERT INTO tokwatch_schema VALUES (1, 'init', 0)")
        conn.execute("INSERT INTO endpoints (name, created_at) VALUES ('a', 0)")
        conn.execute("INSERT INTO runs (run_id, time, endpoint_id, status) VALUES ('r1', 100.0, 1, 'ok')")
    store = SQLiteStore(path)
    try:
        assert (await store.schema_status()).current == 1
        assert await store.migrate() == list(range(2, known_version("sqlite") + 1))
        assert await store.migrate() == []
        assert await store.count_runs() == 1
        # the run stored before workloads and sites is one seed000 run from no site
        (last,) = (await store.last_runs(0.0)).values()
        assert (last.endpoint, last.workload, last.site, last.time) == ("a", "seed000", "", 100.0)
        await store.write_runs([RunRow(run_id="r2", time=time.time(), endpoint="a", status="ok")])
        run, requests = bench_rows(_outcome())
        assert await bench_store(store).write_bench(run, requests) is True
        assert await store.count_runs() == 2
    finally:
        await store.close()


async def test_sqlite_bench_rows_from_version_4_keep_their_data(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    run, requests = bench_rows(_outcome())
    later = {"normalized_latency_s", "decode_tokens_per_s", "tbt_s", "generated_tokens_per_s"}
    with sqlite3.connect(path) as conn:  # a database as tokwatch with schema 4 left it, with a bench run
        conn.execute("CREATE TABLE tokwatch_schema (version INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
        for m in migrations_for("sqlite")[:4]:
            conn.executescript(m.sql)
            conn.execute("INSERT INTO tokwatch_schema VALUES (?, ?, 0)", (m.version, m.name))
        for table, rows in (("bench_runs", [run]), ("bench_requests", requests)):
            columns = [c for c in type(rows[0]).__dataclass_fields__ if c not in later]
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                [tuple(getattr(r, c) for c in columns) for r in rows],
            )
    store = SQLiteStore(path)
    try:
        assert await store.migrate() == list(range(5, known_version("sqlite") + 1))
        stored = await bench_store(store).bench_run("bench-1")
        assert stored is not None
        old_run, old_requests = stored
        assert old_run.generated_tokens_per_s is None and old_run.requests_ok == 8
        assert len(old_requests) == 9 and all(r.tbt_s is None for r in old_requests)
        assert old_requests[0].ttft_s == requests[0].ttft_s  # what was stored is untouched
    finally:
        await store.close()


async def test_postgres_bench_roundtrip_and_migration_from_2(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn, timeout_s=10)
    await store.open()
    try:
        assert await store.migrate() == list(range(1, known_version("postgres") + 1))
        await _roundtrip(store)
        await store.write_runs([RunRow(run_id="r1", time=time.time(), endpoint="a", status="ok")])
    finally:
        await store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        n = conn.execute("SELECT count(*) FROM bench_requests WHERE bench_run_id = 'bench-1'").fetchone()
        kind = conn.execute("SELECT jsonb_typeof(summary) FROM bench_runs WHERE id = 'bench-1'").fetchone()
        assert n == (9,) and kind == ("object",)
        # Back to schema 2 (what the previous tokwatch left), with the probe data still there.
        conn.execute("DROP TABLE bench_segments; DROP TABLE bench_requests; DROP TABLE bench_runs")
        conn.execute("DROP TABLE bench_capacity")
        later = ("triggered_by", "timing_disturbed", "max_stall_s", "merged_reads", "send_delay_s")
        later += ("duration_s",)
        later += ("tps_error_ratio", "ttft_error_s", "itl_error_s", "tpot_error_s", "ttot_error_s")
        later += ("e2e_error_s", "set_aside", "tps_set_aside")
        later += ("workload", "site", "prompt_seed", "prompt_target_tokens", "prompt_words")
        later += ("prompt_size_missed",)
        later += ("cached_tokens", "cache_assisted", "prefill_tokens_per_second", "prefill_source")
        later += ("phase_resolve_s", "phase_connect_s", "phase_tls_s", "phase_processing_s")
        later += ("network_rtt_s", "connection_reused")
        later += ("phase_proxy_connect_s",)
        later += ("cost", "cost_currency", "cost_method", "cost_prompt_per_mtok", "cost_generation_per_mtok")
        later += ("cost_blended_per_mtok", "energy_j", "energy_net_j", "energy_idle_watts")
        for column in later:
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("DROP TABLE run_series")
        conn.execute("DELETE FROM runs_hourly")  # as schema 2 left it: keyed by endpoint and hour
        for column in ("workload", "site", "prefill_tps_median"):
            conn.execute(f"ALTER TABLE runs_hourly DROP COLUMN {column}")
        conn.execute("DROP INDEX runs_hourly_bucket")
        conn.execute("ALTER TABLE runs_hourly ADD PRIMARY KEY (endpoint_id, bucket)")
        conn.execute("DELETE FROM tokwatch_schema WHERE version >= 3")
    store = PostgresStore(pg_dsn, timeout_s=10)
    await store.open()
    try:
        assert (await store.schema_status()).current == 2
        await store.ensure_ready()  # auto-migrates, as the exporter and `tokwatch bench` do
        assert (await store.schema_status()).current == known_version("postgres")
        assert await store.count_runs() == 1
        series = [(k.endpoint, k.workload, k.site) for k in await store.last_runs(0.0)]
        assert series == [("a", "seed000", "")]  # the run stored before: seed000, no site
        assert await bench_store(store).bench_runs(0) == []
        run, requests = bench_rows(_outcome())
        assert await bench_store(store).write_bench(run, requests) is True
    finally:
        await store.close()


def test_report_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "tokwatch.yml"
    db = tmp_path / "tw.db"
    cfg.write_text(f"storage:\n  sqlite_path: {db}\n")

    async def seed() -> None:
        store = SQLiteStore(db)
        outcome = _outcome()
        outcome.started_at_unix = time.time() - 60
        await bench_store(store).write_bench(*bench_rows(outcome))
        await store.close()

    asyncio.run(seed())

    def run(argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="tokwatch")
        add_commands(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return int(args.func(args))

    assert run(["report", "--bench", "-c", str(cfg), "--since", "30d"]) == 0
    out = capsys.readouterr().out
    assert "bench-1" in out and "open loop 4/s poisson" in out and "8/9" in out and "met" in out
    assert run(["report", "--bench", "-c", str(cfg), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["bench_runs"]] == ["bench-1"]
    assert data["bench_runs"][0]["summary"]["requests"]["ok"] == 8
    assert run(["report", "--bench", "-c", str(cfg), "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("| started (UTC) |")
    assert run(["report", "--bench", "-c", str(cfg), "--since", "1s"]) == 0
    assert "no bench runs stored" in capsys.readouterr().out
    assert run(["report", "--bench", "-c", str(cfg), "--since", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--since" in err and "Traceback" not in err
