"""The bench runs of a PostgreSQL store (plain tables in the TimescaleDB flavor too), over its pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokwatch.storage.base import BenchMerge, BenchStore
from tokwatch.storage.bench_rows import (
    BENCH_REQUEST_COLUMNS,
    BENCH_RUN_COLUMNS,
    BENCH_SEGMENT_COLUMNS,
    CAPACITY_COLUMNS,
    BenchRequestRow,
    BenchRunRow,
    BenchSegmentRow,
    CapacityRow,
)
from tokwatch.storage.postgres import PostgresStore, ts

_BENCH_TIMES = frozenset({"started_at", "finished_at", "sent_at", "start_at"})
_BENCH_RUN_SQL = (
    f"INSERT INTO bench_runs ({', '.join(BENCH_RUN_COLUMNS)}) VALUES "
    f"({', '.join('%s::jsonb' if c == 'summary' else '%s' for c in BENCH_RUN_COLUMNS)}) "
    "ON CONFLICT (id) DO NOTHING"
)
# The cast types an empty gap list, for which psycopg cannot infer an array type.
_BENCH_REQUEST_VALUES = ", ".join(
    "%s::double precision[]" if c == "tbt_s" else "%s" for c in BENCH_REQUEST_COLUMNS
)
_BENCH_REQUEST_SQL = (
    f"INSERT INTO bench_requests ({', '.join(BENCH_REQUEST_COLUMNS)}) "
    f"VALUES ({_BENCH_REQUEST_VALUES}) ON CONFLICT DO NOTHING"
)
_BENCH_RUN_SELECT = "SELECT " + ", ".join("summary::text" if c == "summary" else c for c in BENCH_RUN_COLUMNS)
_BENCH_SELECT_SQL = _BENCH_RUN_SELECT + " FROM bench_runs WHERE started_at >= %s ORDER BY started_at DESC"
_BENCH_ONE_SQL = _BENCH_RUN_SELECT + " FROM bench_runs WHERE id = %s"
_BENCH_REQUESTS_SQL = (
    f"SELECT {', '.join(BENCH_REQUEST_COLUMNS)} FROM bench_requests "
    "WHERE bench_run_id = %s ORDER BY request_id"
)
_BENCH_SEGMENT_SQL = (
    f"INSERT INTO bench_segments ({', '.join(BENCH_SEGMENT_COLUMNS)}) VALUES "
    f"({', '.join('%s::jsonb' if c == 'summary' else '%s' for c in BENCH_SEGMENT_COLUMNS)}) "
    "ON CONFLICT DO NOTHING"
)
_BENCH_SEGMENTS_SQL = (
    "SELECT "
    + ", ".join("summary::text" if c == "summary" else c for c in BENCH_SEGMENT_COLUMNS)
    + " FROM bench_segments WHERE bench_run_id = %s ORDER BY segment"
)
_BENCH_RUN_UPDATE_SQL = (
    "UPDATE bench_runs SET "
    + ", ".join(f"{c} = %s::jsonb" if c == "summary" else f"{c} = %s" for c in BENCH_RUN_COLUMNS if c != "id")
    + " WHERE id = %s"
)


_CAPACITY_SQL = (
    f"INSERT INTO bench_capacity ({', '.join(CAPACITY_COLUMNS)}) VALUES "
    f"({', '.join('%s::jsonb' if c == 'summary' else '%s' for c in CAPACITY_COLUMNS)}) "
    "ON CONFLICT (id) DO NOTHING"
)
_LATEST_CAPACITY_SQL = (
    "SELECT " + ", ".join("summary::text" if c == "summary" else c for c in CAPACITY_COLUMNS)
    + " FROM bench_capacity WHERE endpoint = %s AND result_rate IS NOT NULL ORDER BY finished_at DESC LIMIT 1"
)


class PostgresBenchStore(BenchStore):
    """Bench runs in the database of `store`, on its connections (the store migrates, opens and closes)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    @staticmethod
    def _bench_params(
        row: BenchRunRow | BenchRequestRow | BenchSegmentRow, columns: Sequence[str]
    ) -> tuple[Any, ...]:
        out = []
        for c in columns:
            value = getattr(row, c)
            if c in _BENCH_TIMES:
                value = ts(value)
            elif c == "tbt_s" and value is not None:
                value = list(value)  # psycopg adapts a list, not a tuple, to an array
            out.append(value)
        return tuple(out)

    @staticmethod
    def _bench_values(values: Sequence[Any], columns: Sequence[str]) -> dict[str, Any]:
        """A selected row as field values: times as unix seconds, the gap array as a tuple."""
        d = dict(zip(columns, values, strict=True))
        for key in _BENCH_TIMES & d.keys():
            d[key] = d[key].timestamp()
        if d.get("tbt_s") is not None:
            d["tbt_s"] = tuple(d["tbt_s"])
        return d

    async def write_capacity(self, row: CapacityRow) -> bool:
        """INSERT .. ON CONFLICT DO NOTHING of the search's result; True when it was new."""
        await self._store.ensure_ready()
        params = tuple(
            ts(row.finished_at) if c == "finished_at" else getattr(row, c) for c in CAPACITY_COLUMNS
        )
        async with self._store.connection() as conn:
            cur = await conn.execute(_CAPACITY_SQL.encode(), params)
            return cur.rowcount == 1

    async def latest_capacity(self, endpoint: str) -> CapacityRow | None:
        """The newest search of `endpoint` with a result."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn:
            row = await (await conn.execute(_LATEST_CAPACITY_SQL.encode(), (endpoint,))).fetchone()
        if row is None:
            return None
        values = dict(zip(CAPACITY_COLUMNS, row, strict=True))
        return CapacityRow(**{**values, "finished_at": values["finished_at"].timestamp()})

    async def write_bench(self, run: BenchRunRow, requests: Sequence[BenchRequestRow]) -> bool:
        """INSERT .. ON CONFLICT DO NOTHING of the run, then its requests, in one transaction."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn, conn.transaction():
            cur = await conn.execute(_BENCH_RUN_SQL.encode(), self._bench_params(run, BENCH_RUN_COLUMNS))
            new = cur.rowcount == 1
            if new and requests:  # a run stored before keeps the requests it was stored with
                async with conn.cursor() as c:
                    await c.executemany(
                        _BENCH_REQUEST_SQL.encode(),
                        [self._bench_params(r, BENCH_REQUEST_COLUMNS) for r in requests],
                    )
        return new

    async def bench_runs(self, since: float) -> list[BenchRunRow]:
        """Bench runs started at or after `since`, newest first; times as unix seconds."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn:
            rows = await (await conn.execute(_BENCH_SELECT_SQL.encode(), (ts(since),))).fetchall()
        return [BenchRunRow(**self._bench_values(values, BENCH_RUN_COLUMNS)) for values in rows]

    async def bench_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Ids starting with `prefix` (substr, not LIKE: `_` and `%` in a prefix are plain characters)."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM bench_runs WHERE substr(id, 1, %s) = %s ORDER BY id LIMIT %s",
                (len(prefix), prefix, limit),
            )
            return [str(r[0]) for r in await cur.fetchall()]

    async def bench_run(self, run_id: str) -> tuple[BenchRunRow, list[BenchRequestRow]] | None:
        """The run and its requests in request-id order (written in one transaction, so never half there)."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn:
            run = await (await conn.execute(_BENCH_ONE_SQL.encode(), (run_id,))).fetchone()
            if run is None:
                return None
            rows = await (await conn.execute(_BENCH_REQUESTS_SQL.encode(), (run_id,))).fetchall()
        return (
            BenchRunRow(**self._bench_values(run, BENCH_RUN_COLUMNS)),
            [BenchRequestRow(**self._bench_values(r, BENCH_REQUEST_COLUMNS)) for r in rows],
        )

    async def claim_bench_run(self, run: BenchRunRow) -> BenchRunRow:
        """INSERT .. ON CONFLICT DO NOTHING, then read back: every claimant gets the first one's row."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn, conn.transaction():
            await conn.execute(_BENCH_RUN_SQL.encode(), self._bench_params(run, BENCH_RUN_COLUMNS))
            row = await (await conn.execute(_BENCH_ONE_SQL.encode(), (run.id,))).fetchone()
        assert row is not None
        return BenchRunRow(**self._bench_values(row, BENCH_RUN_COLUMNS))

    async def write_bench_segment(
        self, run: BenchRunRow, segment: BenchSegmentRow, requests: Sequence[BenchRequestRow]
    ) -> bool:
        """The run row unless stored, the segment unless stored, and then its requests: one transaction."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn, conn.transaction():
            await conn.execute(_BENCH_RUN_SQL.encode(), self._bench_params(run, BENCH_RUN_COLUMNS))
            cur = await conn.execute(
                _BENCH_SEGMENT_SQL.encode(), self._bench_params(segment, BENCH_SEGMENT_COLUMNS)
            )
            new = cur.rowcount == 1
            if new and requests:
                async with conn.cursor() as c:
                    await c.executemany(
                        _BENCH_REQUEST_SQL.encode(),
                        [self._bench_params(r, BENCH_REQUEST_COLUMNS) for r in requests],
                    )
        return new

    async def bench_segments(self, run_id: str) -> list[BenchSegmentRow]:
        """The run's segments in segment order; times as unix seconds."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn:
            rows = await (await conn.execute(_BENCH_SEGMENTS_SQL.encode(), (run_id,))).fetchall()
        return [BenchSegmentRow(**self._bench_values(r, BENCH_SEGMENT_COLUMNS)) for r in rows]

    async def merge_bench_run(self, run_id: str, merge: BenchMerge) -> BenchRunRow | None:
        """Lock the run row (SELECT .. FOR UPDATE), read its parts, replace it: merges of one run queue up,
        and each reads everything committed before it took the lock."""
        await self._store.ensure_ready()
        async with self._store.connection() as conn, conn.transaction():
            row = await (await conn.execute((_BENCH_ONE_SQL + " FOR UPDATE").encode(), (run_id,))).fetchone()
            if row is None:
                return None
            segments = await (await conn.execute(_BENCH_SEGMENTS_SQL.encode(), (run_id,))).fetchall()
            requests = await (await conn.execute(_BENCH_REQUESTS_SQL.encode(), (run_id,))).fetchall()
            merged = merge(
                BenchRunRow(**self._bench_values(row, BENCH_RUN_COLUMNS)),
                [BenchSegmentRow(**self._bench_values(r, BENCH_SEGMENT_COLUMNS)) for r in segments],
                [BenchRequestRow(**self._bench_values(r, BENCH_REQUEST_COLUMNS)) for r in requests],
            )
            values = self._bench_params(merged, [c for c in BENCH_RUN_COLUMNS if c != "id"])
            await conn.execute(_BENCH_RUN_UPDATE_SQL.encode(), (*values, run_id))
        return merged
