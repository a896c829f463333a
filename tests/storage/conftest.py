"""Fixtures: one real PostgreSQL per session (initdb + pg_ctl on 127.0.0.1), a fresh database per test."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

from tokwatch.result import RunResult, Status, TimingSource
from tokwatch.storage.devserver import LocalPostgres, find_bindir

_db_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres]:
    """A throwaway PostgreSQL cluster for the whole session; skipped with the reason if unavailable."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: install postgresql")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no `postgres` system user to run initdb as")
    server = LocalPostgres(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def pg_dsn(pg_server: LocalPostgres) -> str:
    """DSN of a new, empty database on the session server (the server is (re)started if a test stopped it)."""
    if not pg_server.running:
        pg_server.start()
    return pg_server.create_database(f"t{next(_db_counter)}_{uuid.uuid4().hex[:8]}")


def _make_run(
    endpoint: str,
    t: float,
    tps: float | None = 50.0,
    status: Status = Status.OK,
    **kw: object,
) -> RunResult:
    """A RunResult as a probe would produce it."""
    r = RunResult(endpoint=endpoint, started_at=t, status=status, tokens_per_second=tps, **kw)  # type: ignore[arg-type]
    if status is Status.OK and r.source is None:
        r.source = TimingSource.CLIENT_STREAM
    return r


@pytest.fixture
def make_run() -> object:
    """Factory for RunResults: make_run(endpoint, t, tps=50.0, status=Status.OK, **fields)."""
    return _make_run
