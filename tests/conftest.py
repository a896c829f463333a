"""Fixtures shared across the suite: a local aiohttp server, the in-process simulator, one throwaway
PostgreSQL per session, a database and a store of each backend, a tiny tokenizer.json."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.cli_processes import cli_sim
from tests.support.postgres import LocalPostgres, find_bindir
from tests.support.sim import SimSource, StartSim, to_sim_config
from tests.support.stores import BACKENDS, Database
from tokwatch.sim.testing import RunningSim, run_sim
from tokwatch.storage.base import BenchStore, RunStore
from tokwatch.storage.factory import bench_store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Marks of the tests that take seconds (pyproject.toml): `make test-quick` leaves them out.
LONG_MARKS = ("slow", "e2e", "llamacpp", "timescale", "grafana_schema")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that take seconds run first (the order otherwise kept): under pytest-xdist the long ones
    start early, so no worker is left alone with one at the end of the run."""
    items.sort(key=lambda item: not any(item.get_closest_marker(mark) for mark in LONG_MARKS))


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Iterator[int]:
    """`-n auto`: one worker more than xdist's count of cores (PYTEST_XDIST_AUTO_NUM_WORKERS, when set, as
    given). The suite mostly waits on servers, timers and scrapes: with one worker per core, 2 cores were
    46 % busy and `make test` took 608 s; one worker more, 78 % and 468 s (README, "Tests")."""
    cores: int = yield
    return cores if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else cores + 1


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


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """Start the in-process simulator on 127.0.0.1: `await start_sim(yaml_text_or_SimConfig)`, or one dict per
    server (`await start_sim(server, ...)`); every simulator started is stopped after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*config: SimSource) -> RunningSim:
            return await stack.enter_async_context(run_sim(to_sim_config(config)))

        yield start


@pytest.fixture
async def sim(request: pytest.FixtureRequest, start_sim: StartSim) -> RunningSim:
    """The in-process simulator running the test module's `SIM` (YAML text); a test with another config
    calls `start_sim`."""
    config = getattr(request.module, "SIM", None)
    if not isinstance(config, str):
        pytest.fail(f"{request.module.__name__} has no SIM text for the `sim` fixture")
    return await start_sim(config)


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


@pytest.fixture
def sim_url(tmp_path: Path, free_port: Callable[[], int]) -> Iterator[str]:
    """`tokwatch sim` as a process of its own (the commands under test block the test's thread), with
    `tests.support.cli_processes.SIM`: its base URL."""
    with cli_sim(tmp_path, free_port()) as url:
        yield url


@pytest.fixture
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny byte-level BPE tokenizer.json trained here on three sentences (never downloaded): few common
    words are one token, so exact lengths need the tokenizer itself."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = ["the water is long and the way is little", "people find time to use words", "which one of them"]
    tok.train_from_iterator(corpus * 5, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """An empty database of each backend in turn (SQLite, then PostgreSQL): one behaviour, one test."""
    if request.param == "sqlite":
        return Database("sqlite", str(tmp_path / "tw.db"))
    return Database("postgres", request.getfixturevalue("pg_dsn"))


@pytest.fixture
async def store(database: Database) -> AsyncIterator[RunStore]:
    """A migrated, empty store on `database`, of each backend in turn."""
    s = await database.open()
    await s.ensure_ready()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def bench(store: RunStore) -> BenchStore:
    """The bench store of `store`'s database (same connection), of each backend in turn."""
    return bench_store(store)
