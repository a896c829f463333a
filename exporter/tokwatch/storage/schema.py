"""Versioned SQL migrations shipped as package data: `migrations/<family>/NNNN_name[.flavor].sql`.

A family is `sqlite` or `postgres`. Within `postgres`, a version may have one file per flavor
(`.postgres.sql` for plain PostgreSQL, `.timescale.sql` for TimescaleDB) or one shared file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Literal

Flavor = Literal["sqlite", "postgres", "timescale"]

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)(?:\.(postgres|timescale))?\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version's SQL for one flavor."""

    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """What `tokwatch db status` reports about a database's schema."""

    backend: str
    location: str
    current: int
    known: int
    applied: tuple[int, ...]

    @property
    def pending(self) -> tuple[int, ...]:
        """Versions this tokwatch would apply."""
        return tuple(v for v in range(self.current + 1, self.known + 1))

    @property
    def too_new(self) -> bool:
        """The database was migrated by a newer tokwatch."""
        return self.current > self.known


def migrations_for(flavor: Flavor) -> list[Migration]:
    """Every migration for a flavor, ordered by version; a flavor-specific file wins over a shared one."""
    family = "sqlite" if flavor == "sqlite" else "postgres"
    root = resources.files("tokwatch.storage").joinpath("migrations").joinpath(family)
    files = [(e.name, e.read_text(encoding="utf-8")) for e in root.iterdir() if _FILE_RE.match(e.name)]
    return select_migrations(files, flavor)


def select_migrations(files: Iterable[tuple[str, str]], flavor: Flavor) -> list[Migration]:
    """The migrations of `flavor` among (file name, SQL) pairs; raises unless numbered 1..N, one per version.

    Two files for one version (two branches that each added "the next" migration) would otherwise apply
    only one of them, silently."""
    chosen: dict[int, tuple[bool, Migration]] = {}
    for file_name, sql in sorted(files):
        m = _FILE_RE.match(file_name)
        if not m:
            continue
        version, name, file_flavor = int(m.group(1)), m.group(2), m.group(3)
        if file_flavor is not None and file_flavor != flavor:
            continue
        specific = file_flavor is not None
        if version in chosen and chosen[version][0] != specific:
            if specific:  # the flavor's own file wins over the shared one
                chosen[version] = (True, Migration(version, name, sql))
            continue
        if version in chosen:
            raise RuntimeError(
                f"storage migrations for {flavor}: version {version} has two files "
                f"({chosen[version][1].name}, {name})"
            )
        chosen[version] = (specific, Migration(version, name, sql))
    migrations = [chosen[v][1] for v in sorted(chosen)]
    expected = list(range(1, len(migrations) + 1))
    if [m.version for m in migrations] != expected:
        raise RuntimeError(f"storage migrations for {flavor} are not numbered 1..N: {sorted(chosen)}")
    return migrations


def known_version(flavor: Flavor) -> int:
    """Highest schema version this tokwatch can migrate to."""
    return len(migrations_for(flavor))


def too_new_message(current: int, known: int, location: str) -> str:
    """The refusal text when the database schema is newer than this tokwatch."""
    return (
        f"database {location} has schema version {current}, newer than this tokwatch knows ({known}); "
        "upgrade tokwatch or point storage at another database"
    )


def not_ready_message(current: int, location: str) -> str:
    """The refusal text of a read-only command when the database is not at the current schema."""
    if current == 0:
        return (
            f"database {location} holds no tokwatch data yet: `tokwatch serve` and `tokwatch demo` store "
            "runs (`tokwatch probe` only prints them); `tokwatch db migrate` creates the schema"
        )
    return f"database {location} needs migrating (schema version {current}): run `tokwatch db migrate`"

