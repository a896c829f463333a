"""The bench runs of a SQLite store, on its connection and under its lock."""

from __future__ import annotations

import sqlite3
import sys
from array import array
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
from tokwatch.storage.sqlite import SQLiteStore

_BENCH_RUN_SQL = (
    f"INSERT OR IGNORE INTO bench_runs ({', '.join(BENCH_RUN_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in BENCH_RUN_COLUMNS)})"
)
_BENCH_REQUEST_SQL = (
    f"INSERT OR IGNORE INTO bench_requests ({', '.join(BENCH_REQUEST_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in BENCH_REQUEST_COLUMNS)})"
)
_BENCH_SEGMENT_SQL = (
    f"INSERT OR IGNORE INTO bench_segments ({', '.join(BENCH_SEGMENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in BENCH_SEGMENT_COLUMNS)})"
)
_BENCH_RUN_UPDATE_SQL = (
    f"UPDATE bench_runs SET {', '.join(f'{c} = ?' for c in BENCH_RUN_COLUMNS if c != 'id')} WHERE id = ?"
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


def _bench_segment_row(values: Sequence[Any]) -> BenchSegmentRow:
    d = dict(zip(BENCH_SEGMENT_COLUMNS, values, strict=True))
    d["complete"] = bool(d["complete"])
    return BenchSegmentRow(**d)


def _bench_request_params(row: BenchRequestRow) -> tuple[Any, ...]:
    return tuple(
        (None if row.tbt_s is None else pack_floats(row.tbt_s)) if c == "tbt_s" else getattr(row, c)
        for c in BENCH_REQUEST_COLUMNS
    )


def _bench_request_row(values: Sequence[Any]) -> BenchRequestRow:
    d = dict(zip(BENCH_REQUEST_COLUMNS, values, strict=True))
    d["tbt_s"] = None if d["tbt_s"] is None else unpack_floats(d["tbt_s"])
    return BenchRequestRow(**d)


class SQLiteBenchStore(BenchStore):
    """Bench runs in the file of `store`, through its connection (the store migrates, opens and closes)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

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
        await self._store.ensure_ready()
        return await self._store.run(lambda conn: self._write_bench_sync(conn, run, requests))

    async def write_capacity(self, row: CapacityRow) -> bool:
        """INSERT OR IGNORE the search's result; True when it was new."""
        await self._store.ensure_ready()
        sql = (
            f"INSERT OR IGNORE INTO bench_capacity ({', '.join(CAPACITY_COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in CAPACITY_COLUMNS)})"
        )
        columns = (getattr(row, c) for c in CAPACITY_COLUMNS)
        values = tuple(int(v) if isinstance(v, bool) else v for v in columns)

        def write(conn: sqlite3.Connection) -> bool:
            with conn:
                return conn.execute(sql, values).rowcount == 1

        return await self._store.run(write)

    async def latest_capacity(self, endpoint: str) -> CapacityRow | None:
        """The newest search of `endpoint` with a result."""
        await self._store.ensure_ready()

        def query(conn: sqlite3.Connection) -> CapacityRow | None:
            row = conn.execute(
                f"SELECT {', '.join(CAPACITY_COLUMNS)} FROM bench_capacity WHERE endpoint = ? "
                "AND result_rate IS NOT NULL ORDER BY finished_at DESC LIMIT 1",
                (endpoint,),
            ).fetchone()
            if row is None:
                return None
            values = dict(zip(CAPACITY_COLUMNS, row, strict=True))
            return CapacityRow(**{**values, "lower_bound": bool(values["lower_bound"])})

        return await self._store.run(query)

    async def bench_runs(self, since: float) -> list[BenchRunRow]:
        """Bench runs started at or after `since`, newest first."""
        await self._store.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[BenchRunRow]:
            cur = conn.execute(
                f"SELECT {', '.join(BENCH_RUN_COLUMNS)} FROM bench_runs WHERE started_at >= ? "
                "ORDER BY started_at DESC",
                (since,),
            )
            return [_bench_run_row(values) for values in cur.fetchall()]

        return await self._store.run(query)

    async def bench_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Ids starting with `prefix` (substr, not LIKE: `_` and `%` in a prefix are plain characters)."""
        await self._store.ensure_ready()

        def query(conn: sqlite3.Connection) -> list[str]:
            cur = conn.execute(
                "SELECT id FROM bench_runs WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
                (len(prefix), prefix, limit),
            )
            return [str(r[0]) for r in cur.fetchall()]

        return await self._store.run(query)

    async def bench_run(self, run_id: str) -> tuple[BenchRunRow, list[BenchRequestRow]] | None:
        """The run and its requests in request-id order (written in one transaction, so never half there)."""
        await self._store.ensure_ready()

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

        return await self._store.run(query)

    @staticmethod
    def _select_run(conn: sqlite3.Connection, run_id: str) -> BenchRunRow | None:
        row = conn.execute(
            f"SELECT {', '.join(BENCH_RUN_COLUMNS)} FROM bench_runs WHERE id = ?", (run_id,)
        ).fetchone()
        return None if row is None else _bench_run_row(row)

    @staticmethod
    def _select_segments(conn: sqlite3.Connection, run_id: str) -> list[BenchSegmentRow]:
        cur = conn.execute(
            f"SELECT {', '.join(BENCH_SEGMENT_COLUMNS)} FROM bench_segments WHERE bench_run_id = ? "
            "ORDER BY segment",
            (run_id,),
        )
        return [_bench_segment_row(values) for values in cur.fetchall()]

    async def claim_bench_run(self, run: BenchRunRow) -> BenchRunRow:
        """INSERT OR IGNORE, then read back in the same transaction: every claimant gets the first's row."""
        await self._store.ensure_ready()

        def claim(conn: sqlite3.Connection) -> BenchRunRow:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_BENCH_RUN_SQL, tuple(getattr(run, c) for c in BENCH_RUN_COLUMNS))
            stored = self._select_run(conn, run.id)
            conn.execute("COMMIT")
            assert stored is not None
            return stored

        return await self._store.run(claim)

    async def write_bench_segment(
        self, run: BenchRunRow, segment: BenchSegmentRow, requests: Sequence[BenchRequestRow]
    ) -> bool:
        """The run row unless stored, the segment unless stored, and then its requests: one transaction."""
        await self._store.ensure_ready()

        def write(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_BENCH_RUN_SQL, tuple(getattr(run, c) for c in BENCH_RUN_COLUMNS))
            cur = conn.execute(_BENCH_SEGMENT_SQL, tuple(getattr(segment, c) for c in BENCH_SEGMENT_COLUMNS))
            new = cur.rowcount == 1
            if new:
                conn.executemany(_BENCH_REQUEST_SQL, [_bench_request_params(r) for r in requests])
            conn.execute("COMMIT")
            return new

        return await self._store.run(write)

    async def bench_segments(self, run_id: str) -> list[BenchSegmentRow]:
        """The run's segments in segment order."""
        await self._store.ensure_ready()
        return await self._store.run(lambda conn: self._select_segments(conn, run_id))

    async def merge_bench_run(self, run_id: str, merge: BenchMerge) -> BenchRunRow | None:
        """Read and replace the run row inside one IMMEDIATE transaction (the file's write lock)."""
        await self._store.ensure_ready()

        def update(conn: sqlite3.Connection) -> BenchRunRow | None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                run = self._select_run(conn, run_id)
                if run is None:
                    conn.execute("COMMIT")
                    return None
                rows = conn.execute(
                    f"SELECT {', '.join(BENCH_REQUEST_COLUMNS)} FROM bench_requests "
                    "WHERE bench_run_id = ? ORDER BY request_id",
                    (run_id,),
                ).fetchall()
                requests = [_bench_request_row(r) for r in rows]
                merged = merge(run, self._select_segments(conn, run_id), requests)
                values = [getattr(merged, c) for c in BENCH_RUN_COLUMNS if c != "id"]
                conn.execute(_BENCH_RUN_UPDATE_SQL, (*values, run_id))
            except BaseException:
                conn.execute("ROLLBACK")  # a failed merge leaves the row as it was, and the file unlocked
                raise
            conn.execute("COMMIT")
            return merged

        return await self._store.run(update)
