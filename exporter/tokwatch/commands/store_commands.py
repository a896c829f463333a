"""CLI subcommands `tokwatch db migrate`, `tokwatch db status` and `tokwatch report`: the command-line face of
the store (the store itself, its queries and the report it builds live in tokwatch.storage)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from tokwatch.bench.stored_report import BENCH_RENDERERS
from tokwatch.figures.wording import counted
from tokwatch.settings.config import Config, load_config
from tokwatch.settings.setting_values import MAX_HORIZON_S, parse_duration
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.storage.base import RunStore
from tokwatch.storage.errors import StorageError
from tokwatch.storage.factory import bench_store, connect_store, outbox_path
from tokwatch.storage.outbox import count_pending
from tokwatch.storage.postgres import PostgresStore
from tokwatch.storage.report import RENDERERS, build_report
from tokwatch.windows.window import window_label, window_lengths
from tokwatch.windows.window_rule import WindowRule

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `db migrate`, `db status` and `report` on the main parser's subcommands."""
    db = subparsers.add_parser("db", help="database schema: migrate, status")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    p = db_sub.add_parser("migrate", help="apply pending schema migrations (idempotent)")
    _config_arg(p)
    p.set_defaults(func=cmd_db_migrate)
    p = db_sub.add_parser("status", help="schema version, pending migrations, rows, outbox")
    _config_arg(p)
    p.set_defaults(func=cmd_db_status)

    p = subparsers.add_parser("report", help="per-endpoint tok/s, CV, uptime and the fleet comparison")
    _config_arg(p)
    p.add_argument("--since", default="7d", help="window for last run, medians and comparison (default 7d)")
    p.add_argument(
        "--bench", action="store_true", help="list the `tokwatch bench` runs stored in the --since window"
    )
    p.add_argument("--format", choices=sorted(RENDERERS), default="table")
    p.set_defaults(func=cmd_report)


def _config_arg(p: argparse.ArgumentParser) -> None:
    # SUPPRESS keeps a --config given to a parent parser; without any, the defaults apply.
    p.add_argument(
        "--config", "-c", default=argparse.SUPPRESS, help="tokwatch.yml (default: built-in defaults)"
    )


def _load(args: argparse.Namespace) -> Config:
    path = getattr(args, "config", None)
    return load_config(path) if path else Config()


def _run(
    args: argparse.Namespace, body: Callable[[Config, RunStore], Awaitable[int]], *, migrate: bool
) -> int:
    try:
        config = _load(args)
    except ConfigError as exc:
        print(f"tokwatch: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> int:
        store = await connect_store(config.storage, auto_migrate=migrate)
        try:
            return await body(config, store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except StorageError as exc:
        print(f"tokwatch: {exc}", file=sys.stderr)
        return EXIT_USAGE


def cmd_db_migrate(args: argparse.Namespace) -> int:
    """Apply pending migrations; print what was applied."""

    async def body(config: Config, store: RunStore) -> int:
        applied = await store.migrate()
        st = await store.schema_status()
        if applied:
            versions = ", ".join(map(str, applied))
            print(f"{store.backend} {store.location}: applied {versions}; now at {st.current}")
        else:
            print(f"{store.backend} {store.location}: up to date (schema version {st.current})")
        return EXIT_OK

    return _run(args, body, migrate=True)


def cmd_db_status(args: argparse.Namespace) -> int:
    """Print schema version, pending migrations, row counts and the outbox; exit 1 if not current."""

    async def body(config: Config, store: RunStore) -> int:
        st = await store.schema_status()
        print(f"backend:  {st.backend}")
        print(f"database: {st.location}")
        print(f"schema:   version {st.current} (this tokwatch knows {st.known})")
        if st.too_new:
            print("status:   schema is NEWER than this tokwatch: upgrade tokwatch")
        elif st.pending:
            print(
                f"status:   pending migrations {', '.join(map(str, st.pending))}: run `tokwatch db migrate`"
            )
        else:
            print("status:   up to date")
            print(f"runs:     {await store.count_runs()}")
            if isinstance(store, PostgresStore) and store.backend == "postgres":
                parts = await store.partitions()
                print(f"partitions: {len(parts)} ({parts[0]} .. {parts[-1]})" if parts else "partitions: 0")
        path = outbox_path(config.storage)
        if path.exists():
            print(f"outbox:   {path}: {counted(count_pending(path), 'run')} waiting")
        else:
            print(f"outbox:   {path}: empty")
        return EXIT_OK if not st.pending and not st.too_new else EXIT_FAIL

    return _run(args, body, migrate=False)


def cmd_report(args: argparse.Namespace) -> int:
    """Print the report in the chosen format."""
    try:
        since_s = parse_duration(args.since, MAX_HORIZON_S)
    except ValueError as exc:
        print(f"tokwatch: --since: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if since_s <= 0:
        print("tokwatch: --since must be positive", file=sys.stderr)
        return EXIT_USAGE

    async def body(config: Config, store: RunStore) -> int:
        if getattr(args, "bench", False):
            runs = await bench_store(store).bench_runs(time.time() - since_s)
            sys.stdout.write(BENCH_RENDERERS[args.format](runs, window_label(since_s)))
            return EXIT_OK
        rule = WindowRule.of(config.schedule.window_includes)
        windows = window_lengths(config.schedule.window, config.schedule.windows)
        report = await build_report(store, time.time(), since_s, rule=rule, windows_s=windows)
        sys.stdout.write(RENDERERS[args.format](report))
        return EXIT_OK

    return _run(args, body, migrate=False)
