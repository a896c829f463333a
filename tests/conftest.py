"""Fixtures shared across the suite: a local aiohttp server, one throwaway PostgreSQL per session, a store of
each backend."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.postgres import LocalPostgres, find_bindir
from tokwatch.storage.base import Store
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.sqlite import SQLiteStore

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test (and every process it starts) keeps default store files in its own directory: the default
    is `./tokwatch-state`, where one test's outbox would be replayed into the next test's store."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Start a real aiohttp server on 127.0.0.1 with the given routes (over TLS with `ssl_context`); returns
    its base URL."""
    runners: list[web.AppRunner] = []

    async def start(routes: dict[str, Handler], ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_route("*", path, handler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        scheme = "https" if ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"

    try:
        yield start
    finally:
        for r in runners:
            await r.cleanup()


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
    """A fresh database for one test."""
    return pg_server.new_database()


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function returning a loopback port that was free a moment ago (for servers a test starts)."""

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return pick


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated, empty store of each backend in turn (SQLite, then PostgreSQL): one behaviour, one test."""
    if request.param == "sqlite":
        s: Store = SQLiteStore(tmp_path / "tw.db")
    else:
        pg = PostgresStore(request.getfixturevalue("pg_dsn"), timeout_s=3.0)
        await pg.open()
        s = pg
    await s.ensure_ready()
    try:
        yield s
    finally:
        await s.close()
