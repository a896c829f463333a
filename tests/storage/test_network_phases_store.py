"""Network phases in the store (SQLite and real PostgreSQL): written by both write paths, read back as
written, NULL for runs that measured none and for runs stored before the migration; one file per version."""

from __future__ import annotations

import pytest

from tokwatch.storage.schema import select_migrations


def test_two_files_for_one_version_are_refused() -> None:
    files = [("0001_init.sql", "a"), ("0002_runs.sql", "b"), ("0002_network_phases.sql", "c")]
    with pytest.raises(RuntimeError, match="version 2 has two files"):
        select_migrations(files, "sqlite")
    # A flavor's own file for a version is not a second file: it wins over the shared one, whichever the
    # names put first.
    for own, shared in (("0002_a.timescale.sql", "0002_b.sql"), ("0002_b.timescale.sql", "0002_a.sql")):
        files = [("0001_init.sql", "a"), (own, "own"), (shared, "shared")]
        assert [m.sql for m in select_migrations(files, "timescale")] == ["a", "own"]
        assert [m.sql for m in select_migrations(files, "postgres")] == ["a", "shared"]
    with pytest.raises(RuntimeError, match=r"not numbered 1\.\.N"):
        select_migrations([("0001_init.sql", "a"), ("0003_x.sql", "c")], "sqlite")
