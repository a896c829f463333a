"""Build the configured store and writer from `StorageSettings`."""

from __future__ import annotations

import os
from pathlib import Path

from tokwatch.settings.config import StorageSettings
from tokwatch.storage.base import BenchStore, RunStore
from tokwatch.storage.errors import StoreUnavailableError
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.postgres_bench import PostgresBenchStore
from tokwatch.storage.sqlite import SQLiteStore
from tokwatch.storage.sqlite_bench import SQLiteBenchStore
from tokwatch.storage.state_lock import LockTarget, StateLock, lock_target
from tokwatch.storage.writer import RESUME_WITHIN_S, RunWriter, resume_bound

DSN_ENV = "TOKWATCH_DSN"


def state_dir() -> Path:
    """`$XDG_STATE_HOME/tokwatch` when XDG_STATE_HOME is set, else `./tokwatch-state`."""
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "tokwatch" if xdg else Path("tokwatch-state")


def resolve_dsn(settings: StorageSettings) -> str | None:
    """`storage.dsn`, else the TOKWATCH_DSN environment variable, else None (SQLite)."""
    if settings.dsn is not None:
        return settings.dsn.get_secret_value() or None
    return os.environ.get(DSN_ENV) or None


def sqlite_path(settings: StorageSettings) -> Path:
    """Where the embedded database lives."""
    return Path(settings.sqlite_path) if settings.sqlite_path else state_dir() / "tokwatch.db"


def outbox_path(settings: StorageSettings) -> Path:
    """Where runs wait when the database cannot take them."""
    return Path(settings.outbox_path) if settings.outbox_path else state_dir() / "outbox.jsonl"


def state_lock(settings: StorageSettings) -> StateLock:
    """The locks an exporter holds on its state: the outbox, the SQLite file (without a DSN) and the state
    directory when a default path puts either there (docs/storage.md, "One owner per state")."""
    targets: list[LockTarget] = [lock_target("outbox", outbox_path(settings))]
    uses_state_dir = settings.outbox_path is None
    if resolve_dsn(settings) is None:
        targets.append(lock_target("SQLite file", sqlite_path(settings)))
        uses_state_dir = uses_state_dir or settings.sqlite_path is None
    if uses_state_dir:
        targets.insert(0, lock_target("state directory", state_dir(), directory=True))
    return StateLock(targets)


def make_store(settings: StorageSettings, *, auto_migrate: bool = True) -> RunStore:
    """The configured backend, not yet connected (PostgreSQL when a DSN is set, else SQLite)."""
    dsn = resolve_dsn(settings)
    if dsn is None:
        return SQLiteStore(sqlite_path(settings), auto_migrate=auto_migrate)
    return PostgresStore(
        dsn,
        pool_size=settings.pool_size,
        timeout_s=settings.write_timeout,
        auto_migrate=auto_migrate,
        retention_s=settings.retention,
        compress_after_s=settings.compress_after,
        use_timescale=settings.timescale,
    )


async def connect_store(settings: StorageSettings, *, auto_migrate: bool = True) -> RunStore:
    """The configured backend with its connections started, neither migrated nor checked yet."""
    store = make_store(settings, auto_migrate=auto_migrate)
    if isinstance(store, PostgresStore):
        await store.open()  # a pool that starts without waiting for the database (retried in the background)
    return store


async def open_store(settings: StorageSettings, *, instance: str, auto_migrate: bool = True) -> RunStore:
    """Open the configured store and migrate it when reachable.

    Raises SchemaTooNewError (a StorageError) when the database was migrated by a newer tokwatch. A
    PostgreSQL server that is down is not an error here: the writer keeps runs in the outbox until it is up.
    """
    store = await connect_store(settings, auto_migrate=auto_migrate)
    store.instance = instance
    try:
        await store.ensure_ready()
    except StoreUnavailableError:
        return store  # down now: the writer retries and keeps runs in the outbox meanwhile
    except BaseException:
        await store.close()
        raise
    return store


def bench_store(store: RunStore) -> BenchStore:
    """The bench runs of `store`'s database, over its connection: open, migrate and close `store` itself."""
    if isinstance(store, PostgresStore):
        return PostgresBenchStore(store)
    if isinstance(store, SQLiteStore):
        return SQLiteBenchStore(store)
    raise TypeError(f"no bench store for {type(store).__name__}")


def make_writer(
    store: RunStore, settings: StorageSettings, *, instance: str, interval_s: float | None = None
) -> RunWriter:
    """A RunWriter with the settings' queue size, outbox path, write timeout and retention.

    With the probe interval, writes resume within min(30 s, interval) of the database's return (the
    writer's back-off and idle check follow it); without, within 30 s.
    """
    return RunWriter(
        store,
        outbox_path=outbox_path(settings),
        queue_size=settings.queue_size,
        write_timeout_s=settings.write_timeout,
        resume_within_s=RESUME_WITHIN_S if interval_s is None else resume_bound(interval_s),
        retention_s=settings.retention,
        instance=instance or store.instance,
    )
