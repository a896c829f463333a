"""PostgreSQL store (psycopg 3, async pool): monthly range partitions, or a hypertable under TimescaleDB.

The same queries serve both flavors; only the `runs` DDL (migration 0002) and housekeeping differ.
The bench runs' queries are in postgres_bench.py, on this store's pool.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from tokwatch.figures.series import SeriesKey
from tokwatch.settings.redact import Redactor
from tokwatch.storage import timescale
from tokwatch.storage.base import (
    RUN_POINT_COLUMNS,
    EndpointSpec,
    LastRun,
    MaintenanceReport,
    RunPoint,
    RunStore,
    WindowStats,
)
from tokwatch.storage.errors import (
    SchemaNotReadyError,
    SchemaTooNewError,
    StorageError,
    StoreUnavailableError,
)
from tokwatch.storage.rows import RUN_COLUMNS, RunRow, series_spans
from tokwatch.storage.schema import (
    Flavor,
    SchemaStatus,
    known_version,
    migrations_for,
    not_ready_message,
    too_new_message,
)
from tokwatch.windows.window_percentiles import QUANTILES, Percentiles
from tokwatch.windows.window_rule import WindowRule

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x746F6B77  # "tokw": serialises concurrent `db migrate` runs
_INSERT_COLUMNS = ("endpoint_id", *RUN_COLUMNS)
_INSERT_SQL = (
    f"INSERT INTO runs ({', '.join(_INSERT_COLUMNS)}) VALUES ({', '.join('%s' for _ in _INSERT_COLUMNS)}) "
    "ON CONFLICT DO NOTHING"
)
_COPY_SQL = f"COPY runs ({', '.join(_INSERT_COLUMNS)}) FROM STDIN"
_OK_TPS = "FILTER (WHERE r.status = 'ok' AND r.tokens_per_second IS NOT NULL)"
_PREFILL = f"FILTER (WHERE {WindowRule().prefill_sample_sql()})"
_ROLLUP_SQL = f"""
INSERT INTO runs_hourly AS h (endpoint_id, workload, site, bucket, runs, ok_runs, tps_samples, tps_median,
                              tps_mean, tps_stddev, tps_min, tps_max, ttft_median_s, e2e_median_s,
                              prefill_tps_median)
SELECT r.endpoint_id, r.workload, r.site, date_trunc('hour', r.time, 'UTC'), count(*),
       count(*) FILTER (WHERE r.status = 'ok'),
       count(*) {_OK_TPS},
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.tokens_per_second) {_OK_TPS},
       avg(r.tokens_per_second) {_OK_TPS}, stddev_samp(r.tokens_per_second) {_OK_TPS},
       min(r.tokens_per_second) {_OK_TPS}, max(r.tokens_per_second) {_OK_TPS},
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.ttft_s),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.e2e_s),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.prefill_tokens_per_second) {_PREFILL}
FROM runs r
WHERE r.time >= %(since)s AND r.time < %(until)s
  AND (%(ids)s::bigint[] IS NULL OR r.endpoint_id = ANY(%(ids)s))
GROUP BY r.endpoint_id, r.workload, r.site, date_trunc('hour', r.time, 'UTC')
ON CONFLICT (endpoint_id, workload, site, bucket) DO UPDATE SET
    runs = EXCLUDED.runs, ok_runs = EXCLUDED.ok_runs, tps_samples = EXCLUDED.tps_samples,
    tps_median = EXCLUDED.tps_median, tps_mean = EXCLUDED.tps_mean, tps_stddev = EXCLUDED.tps_stddev,
    tps_min = EXCLUDED.tps_min, tps_max = EXCLUDED.tps_max, ttft_median_s = EXCLUDED.ttft_median_s,
    e2e_median_s = EXCLUDED.e2e_median_s, prefill_tps_median = EXCLUDED.prefill_tps_median
"""


def _window_sql(rule: WindowRule) -> str:
    """One aggregate query per series over the runs `rule` counts, tok/s figures over its samples."""
    sample = f"FILTER (WHERE {rule.sample_sql()})"
    prefill = f"FILTER (WHERE {rule.prefill_sample_sql()})"
    ttft = f"FILTER (WHERE {rule.ttft_sample_sql()})"
    return f"""
SELECT e.name, r.workload, r.site, count(*), count(*) FILTER (WHERE r.status = 'ok'), count(*) {sample},
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.tokens_per_second) {sample},
       avg(r.tokens_per_second) {sample}, stddev_samp(r.tokens_per_second) {sample},
       count(*) {prefill},
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.prefill_tokens_per_second) {prefill},
       count(*) FILTER (WHERE r.cache_assisted), count(*) FILTER (WHERE r.prompt_size_missed),
       percentile_cont(%(quantiles)s::float8[]) WITHIN GROUP (ORDER BY r.tokens_per_second) {sample},
       percentile_cont(%(quantiles)s::float8[]) WITHIN GROUP (ORDER BY r.prefill_tokens_per_second) {prefill},
       count(*) {ttft},
       percentile_cont(%(quantiles)s::float8[]) WITHIN GROUP (ORDER BY r.ttft_s) {ttft},
       count(*) FILTER (WHERE r.timing_disturbed), count(*) FILTER (WHERE {rule.set_aside_sql()})
FROM runs r JOIN endpoints e ON e.id = r.endpoint_id
WHERE r.time >= %(since)s AND r.time < %(until)s {rule.where()}
  AND (%(site)s::text IS NULL OR r.site = %(site)s::text)
GROUP BY e.name, r.workload, r.site
"""


# Series with a run since `since` (the series of every endpoint without a scan of its runs), narrowed to a
# workload and site where given.
_SERIES = """
(SELECT endpoint_id, workload, site FROM run_series
 WHERE last_time >= %(since)s
   AND (%(workload)s::text IS NULL OR workload = %(workload)s::text)
   AND (%(site)s::text IS NULL OR site = %(site)s::text)) s
JOIN endpoints e ON e.id = s.endpoint_id
"""
_SERIES_UPSERT = """
INSERT INTO run_series AS s (endpoint_id, workload, site, first_time, last_time) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (endpoint_id, workload, site) DO UPDATE SET
    first_time = LEAST(s.first_time, EXCLUDED.first_time),
    last_time = GREATEST(s.last_time, EXCLUDED.last_time)
"""
_IN_SERIES = "endpoint_id = s.endpoint_id AND workload = s.workload AND site = s.site AND time >= %(since)s"
_LAST_SQL = f"""
SELECT e.name, s.workload, s.site, l.time, l.status, k.time, k.tokens_per_second, k.timing_source
FROM {_SERIES}
JOIN LATERAL (SELECT time, status FROM runs WHERE {_IN_SERIES} ORDER BY time DESC LIMIT 1) l ON true
LEFT JOIN LATERAL (SELECT time, tokens_per_second, timing_source FROM runs
                   WHERE {_IN_SERIES} AND status = 'ok' ORDER BY time DESC LIMIT 1) k ON true
"""
_RECENT_SQL = f"""
SELECT e.name, s.workload, s.site, {", ".join(f"r.{c}" for c in RUN_POINT_COLUMNS)}
FROM {_SERIES}
JOIN LATERAL (SELECT * FROM runs r WHERE r.{_IN_SERIES.replace(" AND ", " AND r.")} /*filter*/
              ORDER BY r.time DESC LIMIT %(limit)s) r ON true
WHERE %(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text
ORDER BY e.name, s.workload, s.site, r.time DESC
"""
_PARTITION_RE = re.compile(r"^runs_p(\d{4})_(\d{2})$")
# How long to wait for a pooled connection before asking the database directly why there is none (while it
# answers / while it was found down); see `PostgresStore._getconn`.
_POOL_LOOK_S, _POOL_LOOK_DOWN_S = 1.0, 0.05
PARTITIONS_AHEAD = 2  # months created beyond the current one


def _float(v: Any) -> float | None:
    return float(v) if v is not None else None


def ts(t: float) -> datetime:
    """Unix seconds -> aware UTC datetime (the driver's timestamptz type)."""
    return datetime.fromtimestamp(t, UTC)


def month_start(t: float) -> datetime:
    """First instant of the UTC month containing unix time `t`."""
    d = ts(t)
    return datetime(d.year, d.month, 1, tzinfo=UTC)


def add_months(d: datetime, n: int) -> datetime:
    """The first of the month `n` months after `d`'s month."""
    index = d.year * 12 + d.month - 1 + n
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def partition_name(month: datetime) -> str:
    """`runs_pYYYY_MM`: the partition holding that month."""
    return f"runs_p{month.year:04d}_{month.month:02d}"


def normalize_dsn(dsn: str) -> str:
    """A URL DSN whose userinfo holds a raw `@` (`postgresql://u:p@ss@host/db`) with its user and password
    percent-encoded: libpq ends the userinfo at the first `@`, which sends part of the password to DNS as a
    host name and into logs; urllib (and a reader) end it at the last. Other DSNs unchanged."""
    if not dsn.startswith(("postgresql://", "postgres://")):
        return dsn
    parts = urlsplit(dsn)
    if parts.netloc.count("@") < 2:
        return dsn
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    netloc = quote(unquote(user), safe="") + (sep + quote(unquote(password), safe="") if sep else "")
    return urlunsplit(parts._replace(netloc=f"{netloc}@{hostport}"))


def describe_dsn(dsn: str) -> str:
    """`postgresql://user@host:port/dbname`, never the password."""
    try:
        parts = conninfo_to_dict(normalize_dsn(dsn))
    except psycopg.Error:
        return "postgresql://(unparseable DSN)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host') or 'localhost'}{port}/{parts.get('dbname') or ''}"


class PostgresStore(RunStore):
    """Runs in PostgreSQL; TimescaleDB is detected at the first migration and remembered in tokwatch_meta."""

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 4,
        timeout_s: float = 5.0,
        auto_migrate: bool = True,
        retention_s: float = 400 * 86400.0,
        compress_after_s: float = timescale.DEFAULT_COMPRESS_AFTER_S,
        use_timescale: bool = True,
    ) -> None:
        password = None
        given = dsn
        dsn = normalize_dsn(dsn)
        try:
            password = str(conninfo_to_dict(dsn).get("password") or "") or None
        except psycopg.Error:
            pass
        self._redact = Redactor([given, dsn, password])
        try:
            options: dict[str, Any] = {"application_name": "tokwatch"}
            if "connect_timeout" not in conninfo_to_dict(dsn):
                options["connect_timeout"] = max(1, int(timeout_s))
            conninfo = make_conninfo(dsn, **options)
        except psycopg.Error:
            # psycopg's message quotes the token it choked on, which may be part of a password: say what
            # is wrong without echoing any of the DSN.
            raise StorageError(
                "invalid storage DSN: not a postgresql:// URL or a key=value list (a value with spaces "
                "needs quotes: password='…')"
            ) from None
        self.location = describe_dsn(dsn)
        self._conninfo = conninfo
        self._timeout = timeout_s
        self._auto_migrate = auto_migrate
        self._retention_s = retention_s
        self._compress_after_s = compress_after_s
        self._use_timescale = use_timescale
        self._flavor: Flavor | None = None
        self._ready = False
        self._ids: dict[str, int] = {}
        self._partitions: set[str] = set()
        self._pool_size = pool_size
        self._checked_out = 0
        self._down = False  # the last connection attempt found the database unreachable
        self._pool_errors_seen = 0  # the pool's failed connection attempts when it last gave a connection
        self._pool = self._new_pool()

    @property
    def backend(self) -> str:  # type: ignore[override]
        """`timescaledb` once detected, else `postgres`."""
        return "timescaledb" if self._flavor == "timescale" else "postgres"

    async def open(self) -> None:
        """Start the pool without waiting: a database that is down now is retried in the background."""
        await self._pool.open(wait=False)

    def _new_pool(self) -> AsyncConnectionPool:
        return AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            timeout=self._timeout,
            kwargs={"autocommit": True},
            check=AsyncConnectionPool.check_connection,
            name="tokwatch-storage",
        )

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        try:
            conn = await self._getconn()
            self._checked_out += 1
            pool = self._pool
            try:
                yield conn
            finally:
                self._checked_out -= 1
                await pool.putconn(conn)
        except psycopg.OperationalError as exc:
            message = self._redact(str(exc)).strip()
            raise StoreUnavailableError(f"database {self.location}: {message}") from None
        except psycopg.Error as exc:
            raise StorageError(f"database {self.location}: {self._redact(str(exc)).strip()}") from None

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A pooled connection, database errors raised as StorageError (redacted); the bench store's too."""
        return self._connection()

    async def _getconn(self) -> AsyncConnection[Any]:
        # A short look at the pool first (an idle connection comes at once, a new one in milliseconds); past
        # it, one direct attempt tells a database that is down from a pool that is busy, slow, or stuck in its
        # own reconnect backoff (which grows to minutes). While the database is known to be down, barely a
        # look: a retry then costs one connection attempt, and the database's return is seen at the next one.
        look = min(self._timeout, _POOL_LOOK_DOWN_S if self._down else _POOL_LOOK_S)
        try:
            return self._got(await self._pool.getconn(timeout=look))
        except PoolTimeout:
            pass
        if self._checked_out < self._pool_size:  # else every connection is in use here: busy, not down
            reason = await self._why_no_connection()
            if reason is not None:
                self._down = True
                raise StoreUnavailableError(f"database {self.location}: {reason}")
            failed = self._pool.get_stats().get("connections_errors", 0) > self._pool_errors_seen
            if self._down or failed:
                # The database answers again but the pool is still backing off its reconnects: a fresh pool
                # connects now, so writes resume with the database.
                return await self._replace_pool()
        # Busy, or slow to connect (it has not failed since it last gave a connection): wait the rest.
        try:
            return self._got(await self._pool.getconn(timeout=max(0.0, self._timeout - look)))
        except PoolTimeout:
            raise StoreUnavailableError(
                f"database {self.location}: no free pooled connection within {self._timeout:g}s"
            ) from None

    async def _replace_pool(self) -> AsyncConnection[Any]:
        """A new pool in place of one stuck in its reconnect backoff (which grows to minutes)."""
        log.info("storage: database %s answers again; reconnecting", self.location)
        old, self._pool = self._pool, self._new_pool()
        self._pool_errors_seen = 0
        await self._pool.open(wait=False)
        await old.close(timeout=0)
        try:
            return self._got(await self._pool.getconn(timeout=self._timeout))
        except PoolTimeout:
            raise StoreUnavailableError(
                f"database {self.location}: no pooled connection within {self._timeout:g}s"
            ) from None

    def _got(self, conn: AsyncConnection[Any]) -> AsyncConnection[Any]:
        """A connection from the pool: the database is up, and the pool's failures so far are seen."""
        self._down = False
        self._pool_errors_seen = self._pool.get_stats().get("connections_errors", 0)
        return conn

    async def _why_no_connection(self) -> str | None:
        """One direct attempt: why the database cannot be reached (auth, refused, DNS...), None if it can."""
        try:
            conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(self._conninfo), self._timeout)
        except psycopg.Error as exc:
            return self._redact(str(exc)).strip()
        except (TimeoutError, OSError):
            return f"no connection within {self._timeout:g}s"
        await conn.close()
        return None

    # --- schema --------------------------------------------------------------------------------------

    async def _version(self, conn: AsyncConnection[Any]) -> tuple[int, tuple[int, ...]]:
        exists = await (await conn.execute("SELECT to_regclass('tokwatch_schema')")).fetchone()
        if exists is None or exists[0] is None:
            return 0, ()
        rows = await (await conn.execute("SELECT version FROM tokwatch_schema ORDER BY version")).fetchall()
        applied = tuple(int(r[0]) for r in rows)
        return (max(applied) if applied else 0), applied

    async def _load_flavor(self, conn: AsyncConnection[Any]) -> Flavor | None:
        exists = await (await conn.execute("SELECT to_regclass('tokwatch_meta')")).fetchone()
        if exists is None or exists[0] is None:
            return None
        row = await (await conn.execute("SELECT value FROM tokwatch_meta WHERE key = 'flavor'")).fetchone()
        return "timescale" if row and row[0] == "timescale" else ("postgres" if row else None)

    async def migrate(self) -> list[int]:
        """Apply pending migrations in one transaction, under an advisory lock; detect TimescaleDB first."""
        async with self._connection() as conn:
            flavor = await self._load_flavor(conn)
            if flavor is None:
                use_ts = self._use_timescale and await timescale.timescale_available(conn)
                flavor = "timescale" if use_ts else "postgres"
            migrations = migrations_for(flavor)
            done = []
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS tokwatch_schema "
                    "(version integer PRIMARY KEY, name text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                )
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS tokwatch_meta (key text PRIMARY KEY, value text NOT NULL)"
                )
                await conn.execute(
                    "INSERT INTO tokwatch_meta (key, value) VALUES ('flavor', %s) "
                    "ON CONFLICT (key) DO NOTHING",
                    (flavor,),
                )
                current, _ = await self._version(conn)
                if current > len(migrations):
                    raise SchemaTooNewError(too_new_message(current, len(migrations), self.location))
                for m in migrations[current:]:
                    await conn.execute(m.sql.encode())
                    await conn.execute(
                        "INSERT INTO tokwatch_schema (version, name) VALUES (%s, %s)", (m.version, m.name)
                    )
                    done.append(m.version)
            self._flavor = flavor
        self._ready = True
        await self._housekeeping(datetime.now(UTC).timestamp(), self._retention_s)
        return done

    async def schema_status(self) -> SchemaStatus:
        """Current and known schema versions (of the detected flavor)."""
        async with self._connection() as conn:
            self._flavor = await self._load_flavor(conn) or self._flavor
            current, applied = await self._version(conn)
        known = known_version(self._flavor or "postgres")
        return SchemaStatus(self.backend, self.location, current, known, applied)

    async def ensure_ready(self) -> None:
        """Migrate when allowed, else check; raises SchemaTooNewError on a schema newer than this code."""
        if self._ready:
            return
        st = await self.schema_status()
        if st.too_new:
            raise SchemaTooNewError(too_new_message(st.current, st.known, self.location))
        if st.pending:
            if not self._auto_migrate:
                raise SchemaNotReadyError(not_ready_message(st.current, self.location))
            await self.migrate()
        self._ready = True

    # --- endpoints -----------------------------------------------------------------------------------

    @staticmethod
    async def _lookup(conn: AsyncConnection[Any], name: str) -> int | None:
        row = await (await conn.execute("SELECT id FROM endpoints WHERE name = %s", (name,))).fetchone()
        if row is None:
            row = await (
                await conn.execute("SELECT endpoint_id FROM endpoint_aliases WHERE name = %s", (name,))
            ).fetchone()
        return int(row[0]) if row else None

    async def _create(self, conn: AsyncConnection[Any], name: str) -> int:
        await conn.execute("INSERT INTO endpoints (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))
        eid = await self._lookup(conn, name)
        assert eid is not None  # just inserted or already there
        return eid

    async def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> dict[str, int]:
        """Stable ids; a name listed in `renamed_from` hands its id (and history) to the new name."""
        await self.ensure_ready()
        out: dict[str, int] = {}
        async with self._connection() as conn, conn.transaction():
            for spec in specs:
                eid = await self._lookup(conn, spec.name)
                if eid is None:
                    for old in spec.renamed_from:
                        eid = await self._lookup(conn, old)
                        if eid is not None:
                            break
                    if eid is not None:
                        await conn.execute(
                            "INSERT INTO endpoint_aliases (name, endpoint_id) SELECT name, id FROM endpoints "
                            "WHERE id = %s ON CONFLICT (name) DO NOTHING",
                            (eid,),
                        )
                        await conn.execute(
                            "UPDATE endpoints SET name = %s, renamed_at = now() WHERE id = %s",
                            (spec.name, eid),
                        )
                    else:
                        eid = await self._create(conn, spec.name)
                for old in spec.renamed_from:
                    await conn.execute(
                        "INSERT INTO endpoint_aliases (name, endpoint_id) VALUES (%s, %s) "
                        "ON CONFLICT (name) DO NOTHING",
                        (old, eid),
                    )
                out[spec.name] = eid
        self._ids.clear()
        return out

    async def _ids_for(self, conn: AsyncConnection[Any], names: Iterable[str]) -> dict[str, int]:
        out = {}
        for name in set(names):
            eid = self._ids.get(name)
            if eid is None:
                eid = await self._lookup(conn, name) or await self._create(conn, name)
                self._ids[name] = eid
            out[name] = eid
        return out

    # --- partitions (plain PostgreSQL) ---------------------------------------------------------------

    async def _ensure_partitions(self, conn: AsyncConnection[Any], months: Iterable[datetime]) -> list[str]:
        created = []
        for month in sorted(set(months)):
            name = partition_name(month)
            if name in self._partitions:
                continue
            exists = await (await conn.execute("SELECT to_regclass(%s)", (name,))).fetchone()
            if exists is None or exists[0] is None:
                # DDL takes no bind parameters; the bounds are timestamps this code formatted itself.
                lo, hi = month.isoformat(), add_months(month, 1).isoformat()
                # Another exporter (a shard) may create the same partition at the same moment, and
                # IF NOT EXISTS does not cover that race: serialise on the schema lock.
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF runs "
                        f"FOR VALUES FROM ('{lo}') TO ('{hi}')".encode()
                    )
                created.append(name)
            self._partitions.add(name)
        return created

    async def partitions(self) -> list[str]:
        """Names of the monthly partitions of `runs`, oldest first (empty under TimescaleDB)."""
        async with self._connection() as conn:
            rows = await (
                await conn.execute(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = to_regclass('runs') ORDER BY c.relname"
                )
            ).fetchall()
        return [r[0] for r in rows if _PARTITION_RE.match(r[0])]

    async def _housekeeping(self, now: float, retention_s: float) -> MaintenanceReport:
        report = MaintenanceReport()
        async with self._connection() as conn, conn.transaction():
            # Shards share the database and run this at start-up together: one at a time.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            if self._flavor == "timescale":
                await timescale.ensure_policies(
                    conn, retention_s=retention_s, compress_after_s=self._compress_after_s
                )
                return report
            current = month_start(now)
            report.partitions_created = await self._ensure_partitions(
                conn, [add_months(current, n) for n in range(-1, PARTITIONS_AHEAD + 1)]
            )
            cutoff = ts(now - retention_s)
            rows = await (
                await conn.execute(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = to_regclass('runs')"
                )
            ).fetchall()
            for (name,) in rows:
                m = _PARTITION_RE.match(name)
                if not m:
                    continue
                end = add_months(datetime(int(m.group(1)), int(m.group(2)), 1, tzinfo=UTC), 1)
                # Whole months only: a partition goes when its newest possible run is past retention.
                if end <= cutoff:
                    await conn.execute(f"DROP TABLE IF EXISTS {name}".encode())
                    self._partitions.discard(name)
                    report.partitions_dropped.append(name)
        return report

    async def maintain(self, now: float, retention_s: float) -> MaintenanceReport:
        """Plain: create partitions ahead and drop those past retention. TimescaleDB: (re)set the policies."""
        await self.ensure_ready()
        self._retention_s = retention_s
        return await self._housekeeping(now, retention_s)

    async def run_policies(self) -> list[int]:
        """TimescaleDB: run compression and retention now (`CALL run_job`); returns the job ids run."""
        await self.ensure_ready()
        async with self._connection() as conn:
            return await timescale.run_policies(conn)

    # --- runs ----------------------------------------------------------------------------------------

    @staticmethod
    def _params(row: RunRow, eid: int) -> tuple[Any, ...]:
        return (eid, *(ts(row.time) if c == "time" else getattr(row, c) for c in RUN_COLUMNS))

    @staticmethod
    async def _note_series(conn: AsyncConnection[Any], rows: Sequence[RunRow], ids: dict[str, int]) -> None:
        spans = series_spans(rows)
        params = [(ids[ep], w, site, ts(lo), ts(hi)) for (ep, w, site), (lo, hi) in spans.items()]
        async with conn.cursor() as cur:
            await cur.executemany(_SERIES_UPSERT.encode(), params)

    async def _refresh_rollup(
        self, conn: AsyncConnection[Any], since: float, until: float, ids: Sequence[int] | None
    ) -> None:
        await conn.execute(
            _ROLLUP_SQL.encode(),
            {"since": ts(since), "until": ts(until), "ids": list(ids) if ids is not None else None},
        )

    @staticmethod
    def _hour_range(rows: Sequence[RunRow]) -> tuple[float, float]:
        lo = min(r.time for r in rows)
        hi = max(r.time for r in rows)
        return lo - lo % 3600, hi - hi % 3600 + 3600

    async def write_runs(self, rows: Sequence[RunRow]) -> int:
        """INSERT .. ON CONFLICT DO NOTHING and the rollup of the touched hours, in one transaction."""
        if not rows:
            return 0
        await self.ensure_ready()
        try:
            async with self._connection() as conn:
                if self._flavor != "timescale":
                    await self._ensure_partitions(conn, (month_start(r.time) for r in rows))
                async with conn.transaction():
                    ids = await self._ids_for(conn, (r.endpoint for r in rows))
                    async with conn.cursor() as cur:
                        params = [self._params(r, ids[r.endpoint]) for r in rows]
                        await cur.executemany(_INSERT_SQL.encode(), params)
                        inserted = max(cur.rowcount, 0)
                    await self._note_series(conn, rows, ids)
                    since, until = self._hour_range(rows)
                    await self._refresh_rollup(conn, since, until, sorted(set(ids.values())))
        except StorageError:
            self._ids.clear()  # ids created in a rolled-back transaction are gone
            raise
        return inserted

    async def bulk_load(self, rows: Sequence[RunRow]) -> int:
        """COPY new rows (no conflict handling: for empty ranges), then refresh the rollup of their range."""
        if not rows:
            return 0
        await self.ensure_ready()
        async with self._connection() as conn:
            if self._flavor != "timescale":
                await self._ensure_partitions(conn, {month_start(r.time) for r in rows})
            async with conn.transaction():
                ids = await self._ids_for(conn, (r.endpoint for r in rows))
                async with conn.cursor() as cur, cur.copy(_COPY_SQL.encode()) as copy:
                    for r in rows:
                        await copy.write_row(self._params(r, ids[r.endpoint]))
                await self._note_series(conn, rows, ids)
                since, until = self._hour_range(rows)
                await self._refresh_rollup(conn, since, until, None)
        return len(rows)

    # --- queries -------------------------------------------------------------------------------------

    async def window_stats(
        self, since: float, until: float, *, rule: WindowRule, site: str | None = None
    ) -> dict[SeriesKey, WindowStats]:
        """One aggregate query (percentile_cont = numpy's linear median; stddev_samp = n-1 stddev)."""
        await self.ensure_ready()
        sql = _window_sql(rule)
        params = {"since": ts(since), "until": ts(until), "site": site, "quantiles": list(QUANTILES)}
        async with self._connection() as conn:
            rows = await (await conn.execute(sql.encode(), params)).fetchall()
        out = {}
        for row in rows:
            name, workload, run_site, runs, ok, samples, med, mean, sd = row[:9]
            pre_n, pre_med, cached, missed = row[9:13]
            tps_q, pre_q, ttft_n, ttft_q, disturbed, set_aside = row[13:]
            key = SeriesKey(name, workload, run_site)
            out[key] = WindowStats(
                name,
                int(runs),
                int(ok),
                int(samples),
                _float(med),
                _float(mean),
                _float(sd),  # stddev_samp: NULL below two samples, as on SQLite
                int(disturbed),
                int(set_aside),
                workload=workload,
                site=run_site,
                prefill_samples=int(pre_n),
                prefill_median=_float(pre_med),
                cache_assisted=int(cached),
                prompt_size_missed=int(missed),
                tps_percentiles=Percentiles.computed(int(samples), tps_q),
                prefill_percentiles=Percentiles.computed(int(pre_n), pre_q),
                ttft_percentiles=Percentiles.computed(int(ttft_n), ttft_q),
            )
        return out

    async def last_runs(self, since: float, *, site: str | None = None) -> dict[SeriesKey, LastRun]:
        """Newest run and newest ok run per series (index scans through LATERAL joins)."""
        await self.ensure_ready()
        params = {"since": ts(since), "workload": None, "site": site}
        async with self._connection() as conn:
            rows = await (await conn.execute(_LAST_SQL.encode(), params)).fetchall()
        out = {}
        for name, workload, run_site, t, status, ok_t, ok_tps, ok_src in rows:
            ok_time = ok_t.timestamp() if ok_t else None
            key = SeriesKey(name, workload, run_site)
            out[key] = LastRun(name, t.timestamp(), status, ok_time, ok_tps, ok_src, workload, run_site)
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
        """Newest runs per series through a LATERAL join (index scan on (endpoint_id, time))."""
        await self.ensure_ready()
        sql = _RECENT_SQL.replace("/*filter*/", "" if rule is None else rule.where())
        params = {"since": ts(since), "limit": limit, "endpoint": endpoint}
        params.update(workload=workload, site=site)
        async with self._connection() as conn:
            rows = await (await conn.execute(sql.encode(), params)).fetchall()
        out: dict[SeriesKey, list[RunPoint]] = {}
        for name, series_workload, series_site, t, *rest in rows:
            key = SeriesKey(name, series_workload, series_site)
            out.setdefault(key, []).append(RunPoint.from_row((t.timestamp(), *rest)))
        return out

    async def hourly(self, since: float, until: float) -> list[dict[str, object]]:
        """Hourly rollup rows, oldest first; bucket as unix seconds."""
        await self.ensure_ready()
        async with self._connection() as conn:
            cur = await conn.execute(
                "SELECT e.name AS endpoint, h.workload, h.site, h.bucket, h.runs, h.ok_runs, h.tps_samples, "
                "h.tps_median, h.tps_mean, h.tps_stddev, h.tps_min, h.tps_max, h.ttft_median_s, "
                "h.e2e_median_s, h.prefill_tps_median "
                "FROM runs_hourly h "
                "JOIN endpoints e ON e.id = h.endpoint_id WHERE h.bucket >= %s AND h.bucket < %s "
                "ORDER BY h.bucket, e.name, h.workload, h.site",
                (ts(since), ts(until)),
            )
            names = [d.name for d in cur.description or ()]
            rows = await cur.fetchall()
        out = []
        for r in rows:
            d = dict(zip(names, r, strict=True))
            bucket = d["bucket"]
            d["bucket"] = bucket.timestamp() if isinstance(bucket, datetime) else bucket
            out.append(d)
        return out

    async def clock(self) -> float | None:
        """The server's clock_timestamp() (the real time at the read, not the transaction's start)."""
        async with self._connection() as conn:
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            row = await cur.fetchone()
        assert row is not None
        return float(row[0])

    async def count_runs(self) -> int:
        """Rows in runs."""
        await self.ensure_ready()
        async with self._connection() as conn:
            row = await (await conn.execute("SELECT count(*) FROM runs")).fetchone()
        return int(row[0]) if row else 0

    async def ping(self) -> None:
        """`SELECT 1` on a pooled connection."""
        async with self._connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        """Close the pool."""
        await self._pool.close()
