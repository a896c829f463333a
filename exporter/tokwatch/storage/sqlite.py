"""Embedded SQLite store (the default): one file, WAL journal, every call run in a worker thread.

The bench runs' queries are in sqlite_bench.py, on this store's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tokwatch.figures.series import SeriesKey
from tokwatch.figures.stats import median, sample_stddev
from tokwatch.storage.base import (
    HOUR_S,
    RUN_POINT_COLUMNS,
    EndpointSpec,
    LastRun,
    MaintenanceReport,
    RunPoint,
    RunStore,
    WindowStats,
    hour_bucket,
)
from tokwatch.storage.errors import SchemaNotReadyError, SchemaTooNewError, StorageError
from tokwatch.storage.rows import RUN_COLUMNS, RunRow, series_spans
from tokwatch.storage.schema import SchemaStatus, migrations_for, not_ready_message, too_new_message
from tokwatch.windows.window_percentiles import Percentiles
from tokwatch.windows.window_rule import WindowRule

T = TypeVar("T")

_INSERT_COLUMNS = ("endpoint_id", *RUN_COLUMNS)
_INSERT_SQL = (
    f"INSERT OR IGNORE INTO runs ({', '.join(_INSERT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _INSERT_COLUMNS)})"
)
_ALIAS_SQL = "INSERT OR IGNORE INTO endpoint_aliases (name, endpoint_id, created_at) VALUES (?, ?, ?)"
_ROLLUP_SQL = (
    "INSERT OR REPLACE INTO runs_hourly (endpoint_id, workload, site, bucket, runs, ok_runs, tps_samples, "
    "tps_median, tps_mean, tps_stddev, tps_min, tps_max, ttft_median_s, e2e_median_s, prefill_tps_median) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# What a rollup row is computed from, per run: status, tok/s, TTFT, E2E and the prefill sample.
_ROLLUP_INPUT = (
    f"status, tokens_per_second, ttft_s, e2e_s, CASE WHEN {WindowRule().prefill_sample_sql('runs')} "
    "THEN prefill_tokens_per_second END"
)
# Series with a run since a time: the series of every endpoint without a scan of its runs.
_SERIES_SQL = (
    "SELECT s.endpoint_id, e.name, s.workload, s.site FROM run_series s "
    "JOIN endpoints e ON e.id = s.endpoint_id WHERE s.last_time >= ?"
)
_SERIES_UPSERT = (
    "INSERT INTO run_series (endpoint_id, workload, site, first_time, last_time) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (endpoint_id, workload, site) DO UPDATE SET "
    "first_time = min(first_time, excluded.first_time), last_time = max(last_time, excluded.last_time)"
)


def tps_aggregates(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(median, mean, sample stddev) of tok/s; stddev is None below two values, as stddev_samp."""
    if not values:
        return None, None, None
    return median(values), sum(values) / len(values), sample_stddev(values) if len(values) >= 2 else None


RollupKey = tuple[int, str, str, float]  # endpoint id, workload, site, hour


def _rollup_row(key: RollupKey, rows: Iterable[tuple[Any, ...]]) -> tuple[Any, ...]:
    """One runs_hourly row from (status, tok/s, ttft, e2e, prefill sample) tuples of one series and hour."""
    runs = ok = 0
    tps: list[float] = []
    ttft: list[float] = []
    e2e: list[float] = []
    prefill: list[float] = []
    for status, value, ttft_s, e2e_s, prefill_sample in rows:
        runs += 1
        if status == "ok":
            ok += 1
            if value is not None:
                tps.append(value)
        if ttft_s is not None:
            ttft.append(ttft_s)
        if e2e_s is not None:
            e2e.append(e2e_s)
        if prefill_sample is not None:
            prefill.append(prefill_sample)
    med, mean, stddev = tps_aggregates(tps)
    return (
        *key,
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
        median(prefill) if prefill else None,
    )


def _matches(key: SeriesKey, endpoint: str | None, workload: str | None, site: str | None) -> bool:
    """The series is the endpoint's, workload's and site's asked for (None: any)."""
    return (
        (endpoint is None or key.endpoint == endpoint)
        and (workload is None or key.workload == workload)
        and (site is None or key.site == site)
    )


BUSY_TIMEOUT_S = 30.0
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def _open_wal(path: Path, timeout_s: float) -> sqlite3.Connection:
    """A connection to `path` in WAL mode, retrying while another connection holds the switch to WAL.

    Turning a new file to WAL takes an exclusive lock; when several processes open one new database at once
    (`tokwatch bench --segment` with `--workers`), SQLite answers "database is locked" at once instead of
    waiting out the busy timeout, so the open is tried again until the same timeout has passed."""
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout_s)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL survives a process crash (kill -9); only power loss may drop the last commits.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if (exc.sqlite_errorcode & 0xFF) not in _BUSY_CODES or time.monotonic() + pause > deadline:
                raise
        except BaseException:
            conn.close()
            raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class SQLiteStore(RunStore):
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
                self._conn = _open_wal(self.path, BUSY_TIMEOUT_S)
            except (OSError, sqlite3.Error) as exc:
                raise StorageError(f"cannot open SQLite database {self.path}: {exc}") from None
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

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` in a worker thread under the store's lock, a failed transaction rolled back and
        SQLite errors raised as StorageError; the bench store's calls too."""
        return await self._run(fn)

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
        with self._migration_lock():
            return self._migrate_locked(conn)

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """Hold other processes off this database's migrations (several `tokwatch bench --segment` or
        `--workers` processes open one store at once): the version is read and every pending migration
        applied under one lock, so no two apply the same one. A SQLite transaction cannot span a migration's
        script (executescript commits first), hence a lock file beside the database."""
        with open(self.path.with_name(self.path.name + ".migrate-lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _migrate_locked(self, conn: sqlite3.Connection) -> list[int]:
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

    @staticmethod
    def _note_series(conn: sqlite3.Connection, rows: Sequence[RunRow], ids: dict[str, int]) -> None:
        spans = series_spans(rows)
        conn.executemany(
            _SERIES_UPSERT, [(ids[ep], w, site, lo, hi) for (ep, w, site), (lo, hi) in spans.items()]
        )

    def _rollup_buckets(self, conn: sqlite3.Connection, keys: Iterable[RollupKey]) -> None:
        for key in keys:
            eid, workload, site, bucket = key
            rows = conn.execute(
                f"SELECT {_ROLLUP_INPUT} FROM runs "
                "WHERE endpoint_id = ? AND workload = ? AND site = ? AND time >= ? AND time < ?",
                (eid, workload, site, bucket, bucket + HOUR_S),
            ).fetchall()
            conn.execute(_ROLLUP_SQL, _rollup_row(key, rows))

    def _write_sync(self, conn: sqlite3.Connection, rows: Sequence[RunRow]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        ids = self._ids_for(conn, (r.endpoint for r in rows))
        before = conn.total_changes
        conn.executemany(_INSERT_SQL, [self._params(r, ids[r.endpoint]) for r in rows])
        inserted = conn.total_changes - before
        self._note_series(conn, rows, ids)
        self._rollup_buckets(
            conn, {(ids[r.endpoint], r.workload, r.site, hour_bucket(r.time)) for r in rows}
        )
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
        self._note_series(conn, rows, ids)
        lo, hi = min(r.time for r in rows), max(r.time for r in rows)
        self._refresh_range(conn, hour_bucket(lo), hour_bucket(hi) + HOUR_S)
        conn.execute("COMMIT")
        return inserted

    def _refresh_range(self, conn: sqlite3.Connection, since: float, until: float) -> None:
        groups: dict[RollupKey, list[tuple[Any, ...]]] = defaultdict(list)
        cur = conn.execute(
            f"SELECT endpoint_id, workload, site, time, {_ROLLUP_INPUT} FROM runs "
            "WHERE time >= ? AND time < ?",
            (since, until),
        )
        for eid, workload, site, t, *rest in cur:
            groups[(eid, workload, site, hour_bucket(t))].append(tuple(rest))
        conn.executemany(_ROLLUP_SQL, [_rollup_row(key, rows) for key, rows in groups.items()])

    async def bulk_load(self, rows: Sequence[RunRow]) -> int:
        """executemany in one transaction, then one pass over the loaded range for the rollup."""
        if not rows:
            return 0
        await self.ensure_ready()
        return await self._run(lambda conn: self._bulk_sync(conn, rows))

    # --- queries -------------------------------------------------------------------------------------

    def _window_sync(
        self, conn: sqlite3.Connection, since: float, until: float, rule: WindowRule, site: str | None
    ) -> dict[SeriesKey, WindowStats]:
        # Per series: runs, then the sums of the five counted flags in the SELECT's order.
        counts: dict[SeriesKey, list[int]] = defaultdict(lambda: [0] * 6)
        values: dict[SeriesKey, list[float]] = defaultdict(list)
        prefill: dict[SeriesKey, list[float]] = defaultdict(list)
        ttft: dict[SeriesKey, list[float]] = defaultdict(list)
        sql = (
            "SELECT e.name, r.workload, r.site, "
            f"r.status = 'ok', r.cache_assisted, r.prompt_size_missed, r.timing_disturbed, "
            f"CASE WHEN {rule.set_aside_sql()} THEN 1 ELSE 0 END, "
            f"CASE WHEN {rule.sample_sql()} THEN r.tokens_per_second END, "
            f"CASE WHEN {rule.prefill_sample_sql()} THEN r.prefill_tokens_per_second END, "
            f"CASE WHEN {rule.ttft_sample_sql()} THEN r.ttft_s END "
            "FROM runs r JOIN endpoints e ON e.id = r.endpoint_id WHERE r.time >= ? AND r.time < ?"
            + rule.where()
        )
        params: tuple[Any, ...] = (since, until)
        if site is not None:
            sql, params = sql + " AND r.site = ?", (*params, site)
        for row in conn.execute(sql, params):
            key = SeriesKey(*row[:3])
            c = counts[key]
            c[0] += 1
            for i, flag in enumerate(row[3:8], start=1):
                c[i] += flag
            for samples, value in zip((values, prefill, ttft), row[8:], strict=True):
                if value is not None:
                    samples[key].append(value)
        out = {}
        for key, (n, ok, cached, missed, disturbed, set_aside) in counts.items():
            med, mean, sd = tps_aggregates(values[key])
            pre = prefill[key]
            out[key] = WindowStats(
                key.endpoint,
                n,
                ok,
                len(values[key]),
                med,
                mean,
                sd,
                disturbed,
                set_aside,
                workload=key.workload,
                site=key.site,
                prefill_samples=len(pre),
                prefill_median=median(pre) if pre else None,
                cache_assisted=cached,
                prompt_size_missed=missed,
                tps_percentiles=Percentiles.of(values[key]),
                prefill_percentiles=Percentiles.of(pre),
                ttft_percentiles=Percentiles.of(ttft[key]),
            )
        return out

    async def window_stats(
        self, since: float, until: float, *, rule: WindowRule, site: str | None = None
    ) -> dict[SeriesKey, WindowStats]:
        """Aggregates computed in Python with tokwatch.figures.stats (SQLite has no percentile_cont)."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._window_sync(conn, since, until, rule, site))

    @staticmethod
    def _series(
        conn: sqlite3.Connection, since: float, endpoint: str | None, workload: str | None, site: str | None
    ) -> list[tuple[int, SeriesKey]]:
        """(endpoint id, series) of every series with a run since `since` (from `run_series`)."""
        out = []
        for eid, name, w, s in conn.execute(_SERIES_SQL, (since,)).fetchall():
            key = SeriesKey(name, w, s)
            if _matches(key, endpoint, workload, site):
                out.append((eid, key))
        return sorted(out, key=lambda item: item[1])

    def _last_sync(
        self, conn: sqlite3.Connection, since: float, site: str | None
    ) -> dict[SeriesKey, LastRun]:
        out = {}
        where = "endpoint_id = ? AND workload = ? AND site = ? AND time >= ?"
        for eid, key in self._series(conn, since, None, None, site):
            params = (eid, key.workload, key.site, since)
            last = conn.execute(
                f"SELECT time, status FROM runs WHERE {where} ORDER BY time DESC LIMIT 1", params
            ).fetchone()
            if last is None:
                continue
            last_ok = conn.execute(
                f"SELECT time, tokens_per_second, timing_source FROM runs WHERE {where} AND status = 'ok' "
                "ORDER BY time DESC LIMIT 1",
                params,
            ).fetchone()
            ok_time, ok_tps, ok_source = last_ok if last_ok else (None, None, None)
            out[key] = LastRun(
                key.endpoint, last[0], last[1], ok_time, ok_tps, ok_source, key.workload, key.site
            )
        return out

    async def last_runs(self, since: float, *, site: str | None = None) -> dict[SeriesKey, LastRun]:
        """Newest run and newest ok run per series (index range scans per series)."""
        await self.ensure_ready()
        return await self._run(lambda conn: self._last_sync(conn, since, site))

    def _recent_sync(
        self,
        conn: sqlite3.Connection,
        since: float,
        limit: int | None,
        endpoint: str | None,
        rule: WindowRule | None,
        workload: str | None,
        site: str | None,
    ) -> dict[SeriesKey, list[RunPoint]]:
        cols = ", ".join(f"r.{c}" for c in RUN_POINT_COLUMNS)
        sql = (
            f"SELECT {cols} FROM runs r WHERE r.endpoint_id = ? AND r.workload = ? AND r.site = ? "
            "AND r.time >= ?"
        )
        sql += ("" if rule is None else rule.where()) + " ORDER BY r.time DESC LIMIT ?"
        out: dict[SeriesKey, list[RunPoint]] = {}
        for eid, key in self._series(conn, since, endpoint, workload, site):
            params = (eid, key.workload, key.site, since, -1 if limit is None else limit)
            out[key] = [RunPoint.from_row(r) for r in conn.execute(sql, params).fetchall()]
        return out

    async def recent_runs(
        self,
        since: float,
        limit: int | None,
        *,
        endpoint: str | None = None,
        rule: WindowRule | None = None,
        workload: str | None = None,
        site: str | None = None,
    ) -> dict[SeriesKey, list[RunPoint]]:
        """Newest runs per series (one index range scan per series)."""
        await self.ensure_ready()
        return await self._run(
            lambda conn: self._recent_sync(conn, since, limit, endpoint, rule, workload, site)
        )

    async def hourly(self, since: float, until: float) -> list[dict[str, object]]:
        """Hourly rollup rows, oldest first."""
        await self.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[dict[str, object]]:
            cur = conn.execute(
                "SELECT e.name AS endpoint, h.workload, h.site, h.bucket, h.runs, h.ok_runs, h.tps_samples, "
                "h.tps_median, h.tps_mean, h.tps_stddev, h.tps_min, h.tps_max, h.ttft_median_s, "
                "h.e2e_median_s, h.prefill_tps_median "
                "FROM runs_hourly h "
                "JOIN endpoints e ON e.id = h.endpoint_id WHERE h.bucket >= ? AND h.bucket < ? "
                "ORDER BY h.bucket, e.name, h.workload, h.site",
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

    async def clock(self) -> float | None:
        """None: a file has no clock but this machine's."""
        return None

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
