"""The `Store` interface every backend implements, and the plain records its queries return."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import SchemaStatus
from tokwatch.window_rule import WindowRule

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A configured endpoint as the store sees it: its name and the names it had before."""

    name: str
    renamed_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Aggregates of one endpoint's runs in a time window; tok/s figures cover `ok` runs with a figure."""

    endpoint: str
    runs: int
    ok_runs: int
    tps_samples: int
    median: float | None
    mean: float | None
    stddev: float | None
    disturbed_runs: int = 0  # counted runs with a client-timed figure set aside (timing_disturbed)
    tps_set_aside: int = 0  # counted ok runs whose tok/s the rule did not take as a sample


@dataclass(frozen=True, slots=True)
class LastRun:
    """An endpoint's most recent run and most recent `ok` run."""

    endpoint: str
    time: float
    status: str
    ok_time: float | None
    ok_tokens_per_second: float | None
    ok_timing_source: str | None = None


# Columns of `runs` a RunPoint is read from, in field order.
RUN_POINT_COLUMNS = (
    "time",
    "status",
    "tokens_per_second",
    "timing_source",
    "ttft_s",
    "itl_p50_s",
    "itl_p99_s",
    "error_class",
    "error_message",
    "triggered_by",
    "timing_disturbed",
    "tps_set_aside",
    "set_aside",
)


class RunPoint(NamedTuple):
    """One stored run as the status page shows it (times in unix seconds); a tuple: pages build thousands."""

    time: float
    status: str
    tokens_per_second: float | None
    timing_source: str | None
    ttft_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    error_class: str | None
    error_message: str | None
    triggered_by: str
    timing_disturbed: bool
    tps_set_aside: bool | None = None  # None: stored before figures were judged one by one (window_rule)
    set_aside: str | None = None  # the figures set aside, comma-separated

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunPoint:
        """From values in RUN_POINT_COLUMNS order (time as unix seconds; SQLite's 0/1 flags made bools)."""
        values = list(row)
        values[_DISTURBED] = bool(values[_DISTURBED])
        if values[_TPS_SET_ASIDE] is not None:
            values[_TPS_SET_ASIDE] = bool(values[_TPS_SET_ASIDE])
        return cls._make(values)


_DISTURBED = RUN_POINT_COLUMNS.index("timing_disturbed")
_TPS_SET_ASIDE = RUN_POINT_COLUMNS.index("tps_set_aside")


@dataclass(slots=True)
class MaintenanceReport:
    """What one maintenance pass changed."""

    partitions_created: list[str] = field(default_factory=list)
    partitions_dropped: list[str] = field(default_factory=list)
    rows_deleted: int = 0


class Store(ABC):
    """One database holding every run; all methods are safe to await from the event loop."""

    backend: str  # "sqlite", "postgres" or "timescaledb"
    location: str  # where the data lives, with any password masked
    instance: str = ""  # exporter instance recorded on runs that do not name one

    @abstractmethod
    async def migrate(self) -> list[int]:
        """Apply pending migrations; returns the versions applied. Raises SchemaTooNewError."""

    @abstractmethod
    async def schema_status(self) -> SchemaStatus:
        """Current and known schema versions."""

    @abstractmethod
    async def ensure_ready(self) -> None:
        """Migrate if needed and refuse a schema newer than this tokwatch (SchemaTooNewError)."""

    @abstractmethod
    async def sync_endpoints(self, specs: Sequence[EndpointSpec]) -> dict[str, int]:
        """Give every configured endpoint a stable id (a rename keeps the old id); returns name -> id."""

    @abstractmethod
    async def write_runs(self, rows: Sequence[RunRow]) -> int:
        """Insert runs idempotently (a run id already stored is skipped) and refresh their hourly rollup.

        Returns how many rows were new.
        """

    @abstractmethod
    async def bulk_load(self, rows: Sequence[RunRow]) -> int:
        """Fast load of new rows (COPY / executemany) for benchmarks and imports, then refresh the rollup."""

    @abstractmethod
    async def window_stats(
        self, since: float, until: float, *, rule: WindowRule
    ) -> dict[str, WindowStats]:
        """Per-endpoint aggregates of the runs `rule` counts with since <= time < until, keyed by current
        endpoint name (tok/s figures over its samples)."""

    @abstractmethod
    async def last_runs(self, since: float) -> dict[str, LastRun]:
        """Per endpoint, the newest run and newest `ok` run at or after `since`."""

    @abstractmethod
    async def recent_runs(
        self,
        since: float,
        limit: int | None,
        *,
        endpoint: str | None = None,
        rule: WindowRule | None = None,
    ) -> dict[str, list[RunPoint]]:
        """Per endpoint (current name; one `endpoint` if given), its newest `limit` runs (all when None) at or
        after `since`, newest first: the runs `rule` counts (None: every run)."""

    @abstractmethod
    async def hourly(self, since: float, until: float) -> list[dict[str, object]]:
        """Rows of the hourly rollup in a time range (endpoint name, bucket start, counts, tok/s figures)."""

    @abstractmethod
    async def count_runs(self) -> int:
        """Rows in the runs table."""

    @abstractmethod
    async def ping(self) -> None:
        """One round trip to the database (`SELECT 1`); raises StorageError when it does not answer."""

    @abstractmethod
    async def write_bench(self, run: BenchRunRow, requests: Sequence[BenchRequestRow]) -> bool:
        """Store a bench run and its requests in one transaction; a run id already stored is left as is.

        Returns True when the run was new. Bench rows never go to the probe `runs` table.
        """

    @abstractmethod
    async def bench_runs(self, since: float) -> list[BenchRunRow]:
        """Bench runs started at or after `since` (unix seconds), newest first."""

    @abstractmethod
    async def bench_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Ids of stored bench runs starting with `prefix` (at most `limit`, sorted)."""

    @abstractmethod
    async def bench_run(self, run_id: str) -> tuple[BenchRunRow, list[BenchRequestRow]] | None:
        """A stored bench run and its requests in request-id order; None when no run has that id."""

    @abstractmethod
    async def maintain(self, now: float, retention_s: float) -> MaintenanceReport:
        """Partitions ahead, retention, policies: the periodic housekeeping of this backend."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""


def hour_bucket(t: float) -> float:
    """Start of the UTC hour containing unix time `t`."""
    return float(int(t // HOUR_S) * HOUR_S)
