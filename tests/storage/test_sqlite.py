"""SQLite only: the database file. What every store does is in test_store_contract.py."""

from __future__ import annotations

from pathlib import Path

from tokwatch.storage.sqlite import SQLiteStore


async def test_creates_its_file_and_directory_on_first_migration(tmp_path: Path) -> None:
    path = tmp_path / "db" / "tw.db"
    store = SQLiteStore(path)
    try:
        assert await store.migrate() == [1, 2, 3, 4, 5, 6]
    finally:
        await store.close()
    assert path.is_file()
