"""One empty database of a storage backend, for the store contract run against each: a store opened on it
(again after a restart), its `storage:` settings, and plain SQL on it as another client sees it; runs to
store."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tokwatch.settings.config import StorageSettings
from tokwatch.storage.base import RunStore
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.rows import RunRow
from tokwatch.storage.sqlite import SQLiteStore

BACKENDS = ("sqlite", "postgres")


def run_row(
    endpoint: str, t: float, tps: float | None = 50.0, status: str = "ok", run_id: str | None = None
) -> RunRow:
    """A stored run with the fields the store's figures read; its id from endpoint and time unless given."""
    return RunRow(
        run_id=run_id or f"{endpoint}-{t}", time=t, endpoint=endpoint, status=status, tokens_per_second=tps
    )


@dataclass(frozen=True)
class Database:
    """`where` is the SQLite file for `sqlite`, the DSN for `postgres`."""

    backend: str
    where: str

    @property
    def settings(self) -> StorageSettings:
        """The `storage:` settings that point the exporter at this database."""
        if self.backend == "sqlite":
            return StorageSettings(sqlite_path=self.where)
        return StorageSettings.model_validate({"dsn": self.where})

    async def open(self) -> RunStore:
        """A store on this database, connected but not migrated; the caller closes it."""
        if self.backend == "sqlite":
            return SQLiteStore(Path(self.where))
        store = PostgresStore(self.where, timeout_s=3.0)
        await store.open()
        return store

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        """Run one statement in its own committed transaction, outside the store; the rows it returned."""
        if self.backend == "sqlite":
            with contextlib.closing(sqlite3.connect(self.where)) as conn, conn:
                return conn.execute(sql).fetchall()
        with psycopg.connect(self.where, autocommit=True) as pg:
            cur = pg.execute(sql)  # type: ignore[arg-type]  # the tests' own literal SQL
            return cur.fetchall() if cur.description is not None else []
