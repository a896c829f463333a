"""Embedded SQLite store (the default): one file, WAL journal, every call run in a worker thread."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tokwatch.stats import median, sample_stddev
from tokwatch.storage.base import (
    HOUR_S,
    RUN_POINT_COLUMNS,
    EndpointSpec,
    LastRun,
    MaintenanceReport,
    RunPoint,
    Store,
    WindowStats,
    hour_bucket,
)
from tokwatch.storage.bench_rows import (
    BENCH_REQUEST_COLUMNS,
    BENCH_RUN_COLUMNS,
    BenchRequestRow,
    BenchRunRow,
)
from tokwatch.storage.errors import SchemaNotReadyError, SchemaTooNewError, StorageError
from tokwatch.storage.rows import RUN_COLUMNS, RunRow
from tokwatch.storage.schema import SchemaStatus, migrations_for, not_ready_message, too_new_message
from tokwatch.window_rule import WindowRule

T = TypeVar("T")

_INSERT_COLUMNS = ("endpoint_id", *RUN_COLUMNS)
_INSERT_SQL = (
    f"INSERT OR IGNORE INTO runs ({', '.join(_INSERT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _INSERT_COLUMNS)})"
)
_ALIAS_SQL = "INSERT OR IGNORE INTO endpoint_aliases (name, endpoint_id, created_at) VALUES (?, ?, ?)"
_ROLLUP_SQL = (
    "INSERT OR REPLACE INTO runs_hourly (endpoint_id, bucket, runs, ok_runs, tps_samples, tps_median, "
    "tps_mean, tps_stddev, tps_min, tps_max, ttft_median_s, e2e_median_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_BENCH_RUN_SQL = (
    f"INSERT OR IGNORE INTO bench_runs ({', '.join(BENCH_RUN_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in BENCH_RUN_COLUMNS)})"
)
_BENCH_REQUEST_SQL = (
    f"INSERT OR IGNORE INTO bench_requests ({', '.join(BENCH_REQUEST_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in BENCH_REQUEST_COLUMNS)})"
)
_BENCH_BOOLS = ("complete", "all_slos_met")  # INTEGER 0/1 in SQLite


def pack_floats(values: Sequence[float]) -> bytes:
    """Per-token gaps as the `tbt_s` BLOB: little-endian float64, 8 bytes each (exact, unlike JSON text)."""
    a = array("d", values)
    if sys.byteorder == "big":  # the file format is little-endian on every machine
        a.byteswap()
    return a.tobytes()


def unpack_floats(blob: bytes) -> tuple[float, ...]:
    """The inverse of pack_floats."""
    a = array("d")
    a.frombytes(blob)
    if sys.byteorder == "big":
        a.byteswap()
    return tuple(a)


def _bench_run_row(values: Sequence[Any]) -> BenchRunRow:
    d = dict(zip(BENCH_RUN_COLUMNS, values, strict=True))
    for key in _BENCH_BOOLS:
        d[key] = None if d[key] is None else bool(d[key])
    return BenchRunRow(**d)


def _bench_request_params(row: BenchRequestRow) -> tuple[Any, ...]:
    return tuple(
        (None if row.tbt_s is None else pack_floats(row.tbt_s)) if c == "tbt_s" else getattr(row, c)
        for c in BENCH_REQUEST_COLUMNS
    )


def _bench_request_row(values: Sequence[Any]) -> BenchRequestRow:
    d = dict(zip(BENCH_REQUEST_COLUMNS, values, strict=True))
    d["tbt_s"] = None if d["tbt_s"] is None else unpack_floats(d["tbt_s"])
    return BenchRequestRow(**d)


def tps_aggregates(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(median, mean, sample stddev) of tok/s; stddev is None below two values, as stddev_samp."""
    if not values:
        return None, None, None
    return median(values), sum(values) / len(values), sample_stddev(values) if len(values) >= 2 else None


def _rollup_row(endpoint_id: int, bucket: float, rows: Iterable[tuple[Any, ...]]) -> tuple[Any, ...]:
    """One runs_hourly row from (status, tok/s, ttft, e2e) tuples of the same endpoint and hour."""
    runs = ok = 0
    tps: list[float] = []
    ttft: list[float] = []
    e2e: list[float] = []
    for status, value, ttft_s, e2e_s in rows:
        runs += 1
        if status == "ok":
            ok += 1
            if value is not None:
                tps.append(value)
        if ttft_s is not None:
            ttft.append(ttft_s)
        if e2e_s is not None:
            e2e.append(e2e_s)
    med, mean, stddev = tps_aggregates(tps)
    return (
        endpoint_id,
        bucket,
        runs,
        ok,
        len(tps),
        med,
        mean,
        stddev,
        min(tps) if tps else None,
        max(tps) if tps else None,
        median(ttft) if ttft else None,
        median(e2e) if e2e else None,
    )


class SQLiteStore(Store):
    """Runs in one SQLite file; history survives restarts. Calls are serialised by a lock."""

    backend = "sqlite"

    def __init__(self, path: Path, *, auto_migrate: bool = True) -> None:
        self.path = path
        self.location = str(path)
        self._auto_migrate = auto_migrate
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._ids: dict[str, int] = {}
        self._ready = False

    # --- plumbing ------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
                conn.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL survives a process crash (kill -9); only power loss may drop the last commits.
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
            except (OSError, sqlite3.Error) as exc:
                raise StorageError(f"cannot open SQLite database {self.path}: {exc}") from None
            self._conn = conn
        return self._conn

    def _locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._connect()
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StorageError(f"SQLite {self.path}: {exc}") from None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._locked, fn)

    # --- schema --------------------------------------------------------------------------------------

    @staticmethod
    def _current_version(conn: sqlite3.Connection) -> tuple[int, tuple[int, ...]]:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tokwatch_schema "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied = tuple(r[0] for r in conn.execute("SELECT version FROM tokwatch_schema ORDER BY version"))
        return (max(applied) if applied else 0), applied

    def _migrate_sync(self, conn: sqlite3.Connection) -> list[int]:
        migrations = migrations_for("sqlite")
        current, _ = self._current_version(conn)
        if current > len(migrations):
            raise SchemaTooNewError(too_new_message(current, len(migrations), self.location))
        done = []
        for m in migrations[current:]:
            conn.executescript(
                f"BEGIN IMMEDIATE;\n{m.sql}\n"
                f"INSERT INTO tokwatch_schema (version, name, applied_at) VALUES ({m.version}, '{m.name}', "
                f"{time.time()});\nCOMMIT;"
            )
            done.append(m.version)
        return done

    async def migrate(self) -> list[int]:
        """Apply pending migrations in one transaction each."""
        done = await self._run(self._migrate_sync)
        self._ready = True
        return done

    async def schema_status(self) -> SchemaStatus:
        """Current and known schema versions."""

        def status(conn: sqlite3.Connection) -> SchemaStatus:
            current, applied = self._current_version(conn)
            return SchemaStatus(self.backend, self.location, current, len(migrations_for("sqlite")), applied)

        return await self._run(status)

    async def ensure_ready(self) -> None:
        """Migrate when allowed, else check; raise SchemaTooNewError on a newer schema."""
        if self._ready:
            return
        if self._auto_migrate:
            await self.migrate()
            return
        st = await self.schema_status()
        if st.too_new:
            raise SchemaTooNewError(too_new_message(st.current, st.known, self.location))
        if st.pending:
            raise SchemaNotReadyError(not_ready_message(st.current, self.location))
        self._ready = True

    # --- endpoints -----------------------------------------------------------------------------------

    @staticmethod
    def _lookup(conn: sqlite3.Connection, name: str) -> int | None:
        row = conn.execute("SELECT id FROM endpoints WHERE name = ?", (name,)).fetchone()
        if row is None:
            row = conn.execute("SELECT endpoint_id FROM endpoint_aliases WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else None

    def _sync_sync(self, conn: sqlite3.Connection, specs: Sequence[EndpointSpec]) -> dict[str, int]:
        now = time.time()
        out: dict[str, int] = {}
        conn.execute("BEGIN IMMEDIATE")
        for spec in specs:
            eid = self._lookup(conn, spec.name)
            if eid is None:
                for old in spec.renamed_from:
                    eid = self._lookup(conn, old)
                    if eid is not None:
                        break
                if eid is not None:
                    (previous,) = conn.execute("SELECT name FROM endpoints WHERE id = ?", (eid,)).fetchone()
                    conn.execute(
                        "UPDATE endpoints SET name = ?, renamed_at = ? WHERE id = ?", (spec.name, now, eid)
                    )
                    conn.execute(
                        _ALIAS_SQL,
                        (previous, eid, now),
                    )
                else:
                    cur = conn.execute(
                        "INSERT INTO endpoints (name, created_at) VALUES (?, ?)", (spec.name, now)
                    )
                    eid = int(cur.lastrowid or 0)
            for old in spec.renamed_from:
                conn.execute(
                    _ALIAS_SQL,
                    (old, eid, now),
                )
            out[spec.name] = eid
        conn.execute("COMMIT")
        self._ids.clear()
        return out

    async def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> dict[str, int]:
        """Stable ids; a name listed in `renamed_from` hands its id (and history) to the new name."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._sync_sync(conn, specs))

    def _ids_for(self, conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, int]:
        out = {}
        for name in set(names):
            eid = self._ids.get(name)
            if eid is None:
                eid = self._lookup(conn, name)
                if eid is None:
                    cur = conn.execute(
                        "INSERT INTO endpoints (name, created_at) VALUES (?, ?)", (name, time.time())
                    )
                    eid = int(cur.lastrowid or 0)
                self._ids[name] = eid
            out[name] = eid
        return out

    # --- runs ----------------------------------------------------------------------------------------

    @staticmethod
    def _params(row: RunRow, eid: int) -> tuple[Any, ...]:
        return (eid, *(getattr(row, c) for c in RUN_COLUMNS))

    def _rollup_buckets(self, conn: sqlite3.Connection, keys: Iterable[tuple[int, float]]) -> None:
        for eid, bucket in keys:
            rows = conn.execute(
                "SELECT status, tokens_per_second, ttft_s, e2e_s FROM runs "
                "WHERE endpoint_id = ? AND time >= ? AND time < ?",
                (eid, bucket, bucket + HOUR_S),
            ).fetchall()
            conn.execute(_ROLLUP_SQL, _rollup_row(eid, bucket, rows))

    def _write_sync(self, conn: sqlite3.Connection, rows: Sequence[RunRow]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        ids = self._ids_for(conn, (r.endpoint for r in rows))
        before = conn.total_changes
        conn.executemany(_INSERT_SQL, [self._params(r, ids[r.endpoint]) for r in rows])
        inserted = conn.total_changes - before
        self._rollup_buckets(conn, {(ids[r.endpoint], hour_bucket(r.time)) for r in rows})
        conn.execute("COMMIT")
        return inserted

    async def write_runs(self, rows: Sequence[RunRow]) -> int:
        """Insert runs (INSERT OR IGNORE on run_id) and recompute the hours they touch, in one transaction."""
        if not rows:
            return 0
        await self.ensure_ready()
        try:
            return await self._run(lambda conn: self._write_sync(conn, rows))
        except StorageError:
            self._ids.clear()  # ids created in a rolled-back transaction are gone
            raise

    def _bulk_sync(self, conn: sqlite3.Connection, rows: Sequence[RunRow]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        ids = self._ids_for(conn, (r.endpoint for r in rows))
        before = conn.total_changes
        conn.executemany(_INSERT_SQL, [self._params(r, ids[r.endpoint]) for r in rows])
        inserted = conn.total_changes - before
        lo, hi = min(r.time for r in rows), max(r.time for r in rows)
        self._refresh_range(conn, hour_bucket(lo), hour_bucket(hi) + HOUR_S)
        conn.execute("COMMIT")
        return inserted

    def _refresh_range(self, conn: sqlite3.Connection, since: float, until: float) -> None:
        groups: dict[tuple[int, float], list[tuple[Any, ...]]] = defaultdict(list)
        cur = conn.execute(
            "SELECT endpoint_id, time, status, tokens_per_second, ttft_s, e2e_s FROM runs "
            "WHERE time >= ? AND time < ?",
            (since, until),
        )
        for eid, t, *rest in cur:
            groups[(eid, hour_bucket(t))].append(tuple(rest))
        conn.executemany(_ROLLUP_SQL, [_rollup_row(eid, b, rows) for (eid, b), rows in groups.items()])

    async def bulk_load(self, rows: Sequence[RunRow]) -> int:
        """executemany in one transaction, then one pass over the loaded range for the rollup."""
        if not rows:
            return 0
        await self.ensure_ready()
        return await self._run(lambda conn: self._bulk_sync(conn, rows))

    # --- queries -------------------------------------------------------------------------------------

    def _window_sync(
        self, conn: sqlite3.Connection, since: float, until: float, rule: WindowRule
    ) -> dict[str, WindowStats]:
        runs: dict[str, int] = defaultdict(int)
        ok: dict[str, int] = defaultdict(int)
        disturbed: dict[str, int] = defaultdict(int)
        set_aside: dict[str, int] = defaultdict(int)
        values: dict[str, list[float]] = defaultdict(list)
        cur = conn.execute(
            f"SELECT e.name, r.status = 'ok', CASE WHEN {rule.sample_sql()} THEN r.tokens_per_second END, "
            f"r.timing_disturbed, CASE WHEN {rule.set_aside_sql()} THEN 1 ELSE 0 END "
            "FROM runs r JOIN endpoints e ON e.id = r.endpoint_id WHERE r.time >= ? AND r.time < ?"
            + rule.where(),
            (since, until),
        )
        for name, is_ok, sample, is_disturbed, is_set_aside in cur:
            runs[name] += 1
            ok[name] += is_ok
            disturbed[name] += is_disturbed
            set_aside[name] += is_set_aside
            if sample is not None:
                values[name].append(sample)
        out = {}
        for name, n in runs.items():
            med, mean, sd = tps_aggregates(values[name])
            out[name] = WindowStats(
                name, n, ok[name], len(values[name]), med, mean, sd, disturbed[name], set_aside[name]
            )
        return out

    async def window_stats(
        self, since: float, until: float, *, rule: WindowRule
    ) -> dict[str, WindowStats]:
        """Aggregates computed in Python with tokwatch.stats (SQLite has no percentile_cont)."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._window_sync(conn, since, until, rule))

    def _last_sync(self, conn: sqlite3.Connection, since: float) -> dict[str, LastRun]:
        out = {}
        for eid, name in conn.execute("SELECT id, name FROM endpoints").fetchall():
            last = conn.execute(
                "SELECT time, status FROM runs WHERE endpoint_id = ? AND time >= ? "
                "ORDER BY time DESC LIMIT 1",
                (eid, since),
            ).fetchone()
            if last is None:
                continue
            last_ok = conn.execute(
                "SELECT time, tokens_per_second, timing_source FROM runs "
                "WHERE endpoint_id = ? AND time >= ? AND status = 'ok' ORDER BY time DESC LIMIT 1",
                (eid, since),
            ).fetchone()
            ok_time, ok_tps, ok_source = last_ok if last_ok else (None, None, None)
            out[name] = LastRun(name, last[0], last[1], ok_time, ok_tps, ok_source)
        return out

    async def last_runs(self, since: float) -> dict[str, LastRun]:
        """Newest run and newest ok run per endpoint (index range scans per endpoint)."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._last_sync(conn, since))

    def _recent_sync(
        self,
        conn: sqlite3.Connection,
        since: float,
        limit: int | None,
        endpoint: str | None,
        rule: WindowRule | None,
    ) -> dict[str, list[RunPoint]]:
        cols = ", ".join(f"r.{c}" for c in RUN_POINT_COLUMNS)
        sql = f"SELECT {cols} FROM runs r WHERE r.endpoint_id = ? AND r.time >= ?"
        sql += ("" if rule is None else rule.where()) + " ORDER BY r.time DESC LIMIT ?"
        if endpoint is None:
            endpoints = conn.execute("SELECT id, name FROM endpoints").fetchall()
        else:
            endpoints = conn.execute("SELECT id, name FROM endpoints WHERE name = ?", (endpoint,)).fetchall()
        out: dict[str, list[RunPoint]] = {}
        for eid, name in endpoints:
            rows = conn.execute(sql, (eid, since, -1 if limit is None else limit)).fetchall()
            out[name] = [RunPoint.from_row(r) for r in rows]
        return out

    async def recent_runs(
        self,
        since: float,
        limit: int | None,
        *,
        endpoint: str | None = None,
        rule: WindowRule | None = None,
    ) -> dict[str, list[RunPoint]]:
        """Newest runs per endpoint (one index range scan per endpoint)."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._recent_sync(conn, since, limit, endpoint, rule))

    async def hourly(self, since: float, until: float) -> list[dict[str, object]]:
        """Hourly rollup rows, oldest first."""
        await self.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[dict[str, object]]:
            cur = conn.execute(
                "SELECT e.name AS endpoint, h.bucket, h.runs, h.ok_runs, h.tps_samples, h.tps_median, "
                "h.tps_mean, h.tps_stddev, h.tps_min, h.tps_max, h.ttft_median_s, h.e2e_median_s "
                "FROM runs_hourly h "
                "JOIN endpoints e ON e.id = h.endpoint_id WHERE h.bucket >= ? AND h.bucket < ? "
                "ORDER BY h.bucket, e.name",
                (since, until),
            )
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

        return await self._run(query)

    async def count_runs(self) -> int:
        """Rows in runs."""
        await self.ensure_ready()
        return await self._run(lambda conn: int(conn.execute("SELECT count(*) FROM runs").fetchone()[0]))

    async def ping(self) -> None:
        """A query against the database file."""
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    # --- bench runs ----------------------------------------------------------------------------------

    @staticmethod
    def _write_bench_sync(
        conn: sqlite3.Connection, run: BenchRunRow, requests: Sequence[BenchRequestRow]
    ) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(_BENCH_RUN_SQL, tuple(getattr(run, c) for c in BENCH_RUN_COLUMNS))
        new = cur.rowcount == 1
        if new:  # a run stored before keeps the requests it was stored with
            conn.executemany(_BENCH_REQUEST_SQL, [_bench_request_params(r) for r in requests])
        conn.execute("COMMIT")
        return new

    async def write_bench(self, run: BenchRunRow, requests: Sequence[BenchRequestRow]) -> bool:
        """INSERT OR IGNORE the run, then its requests, in one transaction; True when the run was new."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._write_bench_sync(conn, run, requests))

    async def bench_runs(self, since: float) -> list[BenchRunRow]:
        """Bench runs started at or after `since`, newest first."""
        await self.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[BenchRunRow]:
            cur = conn.execute(
                f"SELECT {', '.join(BENCH_RUN_COLUMNS)} FROM bench_runs WHERE started_at >= ? "
                "ORDER BY started_at DESC",
                (since,),
            )
            return [_bench_run_row(values) for values in cur.fetchall()]

        return await self._run(query)

    async def bench_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Ids starting with `prefix` (substr, not LIKE: `_` and `%` in a prefix are plain characters)."""
        await self.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[str]:
            cur = conn.execute(
                "SELECT id FROM bench_runs WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
                (len(prefix), prefix, limit),
            )
            return [str(r[0]) for r in cur.fetchall()]

        return await self._run(query)

    async def bench_run(self, run_id: str) -> tuple[BenchRunRow, list[BenchRequestRow]] | None:
        """The run and its requests in request-id order (written in one transaction, so never half there)."""
        await self.ensure_ready()

        def query(conn: sqlite3.Connection) -> tuple[BenchRunRow, list[BenchRequestRow]] | None:
            run = conn.execute(
                f"SELECT {', '.join(BENCH_RUN_COLUMNS)} FROM bench_runs WHERE id = ?", (run_id,)
            ).fetchone()
            requests = conn.execute(
                f"SELECT {', '.join(BENCH_REQUEST_COLUMNS)} FROM bench_requests "
                "WHERE bench_run_id = ? ORDER BY request_id",
                (run_id,),
            ).fetchall()
            if run is None:
                return None
            return _bench_run_row(run), [_bench_request_row(r) for r in requests]

        return await self._run(query)

    async def maintain(self, now: float, retention_s: float) -> MaintenanceReport:
        """Retention: delete runs older than `retention_s` (the hourly rollup is kept)."""
        await self.ensure_ready()

        def delete(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM runs WHERE time < ?", (now - retention_s,)).rowcount

        return MaintenanceReport(rows_deleted=await self._run(delete))

    async def close(self) -> None:
        """Close the file."""

        def close() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(close)
