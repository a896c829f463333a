"""SQLite only: the database file. What every store does is in test_store_contract.py."""

from __future__ import annotations

import ast
import asyncio
import sys
import threading
from pathlib import Path

from tokwatch.storage.errors import StorageError
from tokwatch.storage.schema import known_version
from tokwatch.storage.sqlite import SQLiteStore


async def test_creates_its_file_and_directory_on_first_migration(tmp_path: Path) -> None:
    path = tmp_path / "db" / "tw.db"
    store = SQLiteStore(path)
    try:
        assert await store.migrate() == list(range(1, known_version("sqlite") + 1))
    finally:
        await store.close()
    assert path.is_file()


async def test_processes_migrating_one_database_at_once_apply_each_migration_once(tmp_path: Path) -> None:
    """Several `tokwatch bench --segment` processes open one fresh store together: each migration is applied
    by exactly one of them (the others wait and find it applied), none fails on a column already added."""
    path = tmp_path / "shared.db"
    script = (
        "import asyncio, sys; from pathlib import Path; from tokwatch.storage.sqlite import SQLiteStore\n"
        "async def main():\n"
        "    store = SQLiteStore(Path(sys.argv[1]))\n"
        "    try:\n"
        "        print(await store.migrate())\n"
        "    finally:\n"
        "        await store.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err.decode()[-500:] for _, err in outs]
    applied = [v for out, _ in outs for v in ast.literal_eval(out.decode().strip())]
    assert sorted(applied) == list(range(1, known_version("sqlite") + 1))  # each one once, by someone
    store = SQLiteStore(path)
    try:
        assert (await store.schema_status()).current == known_version("sqlite")
    finally:
        await store.close()


def test_connections_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    """Turning a new file to WAL from several connections at the same moment: SQLite answers "database is
    locked" to some without waiting (CI saw `tokwatch bench --segment ... --workers 2` fail so, ~1 open in 100
    with 8 at once); every open must succeed."""
    failures: list[str] = []

    def open_and_read(path: Path, gate: threading.Barrier) -> None:
        store = SQLiteStore(path)
        gate.wait(timeout=10)
        try:
            asyncio.run(store.schema_status())
        except StorageError as exc:
            failures.append(str(exc))
        finally:
            asyncio.run(store.close())

    for round_ in range(60):
        path = tmp_path / f"fresh-{round_}.db"
        gate = threading.Barrier(8)
        threads = [threading.Thread(target=open_and_read, args=(path, gate)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
    assert failures == []
