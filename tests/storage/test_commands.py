"""`tokwatch db migrate|status` and `tokwatch report` as a user runs them."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.support.postgres import PASSWORD
from tokwatch.commands.store_commands import add_commands
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import known_version
from tokwatch.storage.sqlite import SQLiteStore


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tokwatch")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _config(tmp_path: Path, storage: str) -> str:
    path = tmp_path / "tokwatch.yml"
    path.write_text(f"storage:\n{storage}\n")
    return str(path)


def test_sqlite_migrate_status_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state" / "tw.db"
    cfg = _config(tmp_path, f"  sqlite_path: {db}\n  outbox_path: {tmp_path / 'o.jsonl'}")
    assert _run(["report", "-c", cfg]) == 2  # nothing stored yet (e.g. only `tokwatch probe` was run)
    err = capsys.readouterr().err
    assert "holds no tokwatch data yet" in err and "`tokwatch probe` only prints them" in err
    assert "Traceback" not in err
    assert _run(["db", "status", "-c", cfg]) == 1  # not migrated yet
    assert "pending migrations 1, 2, 3, 4" in capsys.readouterr().out
    assert _run(["db", "migrate", "-c", cfg]) == 0
    assert "applied 1, 2" in capsys.readouterr().out
    assert _run(["db", "migrate", "-c", cfg]) == 0
    assert "up to date" in capsys.readouterr().out
    assert _run(["db", "status", "-c", cfg]) == 0
    out = capsys.readouterr().out
    assert f"schema:   version {known_version('sqlite')}" in out and "runs:     0" in out

    async def seed() -> None:
        store = SQLiteStore(db)
        now = time.time()
        await store.write_runs(
            [
                RunRow(run_id=f"{e}{i}", time=now - i * 60, endpoint=e, status="ok", tokens_per_second=v + i)
                for e, v in (("x", 20.0), ("y", 40.0))
                for i in range(3)
            ]
        )
        await store.close()

    asyncio.run(seed())
    assert _run(["report", "-c", cfg, "--format", "json", "--since", "2d"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["since"] == "48h" and data["comparison"]["fastest"] == "y"
    assert _run(["report", "-c", cfg]) == 0
    assert "y is " in capsys.readouterr().out


def test_bad_input_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["report", "--since", "soon", "-c", _config(tmp_path, "  sqlite_path: x.db")]) == 2
    assert "--since" in capsys.readouterr().err
    cfg = _config(tmp_path, "  sqlite_pth: x.db")
    assert _run(["db", "status", "-c", cfg]) == 2
    err = capsys.readouterr().err
    assert "tokwatch.yml:2: storage.sqlite_pth: unknown setting" in err


def test_postgres_commands_never_print_the_password(
    pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, f"  dsn: {pg_dsn}\n  outbox_path: {tmp_path / 'o.jsonl'}")
    assert _run(["db", "migrate", "-c", cfg]) == 0
    assert _run(["db", "status", "-c", cfg]) == 0
    assert _run(["report", "-c", cfg, "--format", "markdown"]) == 0
    out = capsys.readouterr()
    assert "partitions:" in out.out and "postgres" in out.out
    assert PASSWORD not in out.out + out.err
    wrong = _config(tmp_path, f"  dsn: {pg_dsn.replace(PASSWORD, 'Nope-Nope-1234')}\n  write_timeout: 1s")
    assert _run(["db", "status", "-c", wrong]) == 2
    out = capsys.readouterr()
    assert "Nope-Nope-1234" not in out.out + out.err and "tokwatch:" in out.err
