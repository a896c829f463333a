"""The two contracts every backend implements, `RunStore` (the probes' runs) and `BenchStore` (bench runs,
over the same database and connection), and the plain records their queries return."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE, SeriesKey
from tokwatch.storage.bench_rows import BenchRequestRow, BenchRunRow, BenchSegmentRow, CapacityRow
from tokwatch.storage.rows import RunRow
from tokwatch.storage.schema import SchemaStatus
from tokwatch.windows.window_percentiles import NO_PERCENTILES, Percentiles
from tokwatch.windows.window_rule import WindowRule

HOUR_S = 3600.0


# A split run's figures from its stored parts: (run row, segments, requests) -> the new run row.
BenchMerge = Callable[[BenchRunRow, list[BenchSegmentRow], list[BenchRequestRow]], BenchRunRow]


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A configured endpoint as the store sees it: its name and the names it had before."""

    name: str
    renamed_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Aggregates of one series' runs in a time window; tok/s figures cover `ok` runs with a figure, the
    prefill median the window rule's prefill samples (tokwatch.windows.window_rule)."""

    endpoint: str
    runs: int
    ok_runs: int
    tps_samples: int
    median: float | None
    mean: float | None
    stddev: float | None
    disturbed_runs: int = 0  # counted runs with a client-timed figure set aside (timing_disturbed)
    tps_set_aside: int = 0  # counted ok runs whose tok/s the rule did not take as a sample
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    prefill_samples: int = 0
    prefill_median: float | None = None
    cache_assisted: int = 0  # runs counted that the prefix cache helped beyond the preamble
    prompt_size_missed: int = 0  # runs counted whose prompt missed the workload's size
    tps_percentiles: Percentiles = NO_PERCENTILES
    prefill_percentiles: Percentiles = NO_PERCENTILES
    ttft_percentiles: Percentiles = NO_PERCENTILES

    @property
    def key(self) -> SeriesKey:
        """(endpoint, workload, site)."""
        return SeriesKey(self.endpoint, self.workload, self.site)


@dataclass(frozen=True, slots=True)
class LastRun:
    """A series' most recent run and most recent `ok` run."""

    endpoint: str
    time: float
    status: str
    ok_time: float | None
    ok_tokens_per_second: float | None
    ok_timing_source: str | None = None
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE

    @property
    def key(self) -> SeriesKey:
        """(endpoint, workload, site)."""
        return SeriesKey(self.endpoint, self.workload, self.site)


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
    "workload",
    "site",
    "prompt_tokens",
    "cached_tokens",
    "cache_assisted",
    "prompt_size_missed",
    "prefill_tokens_per_second",
    "phase_resolve_s",
    "phase_connect_s",
    "phase_tls_s",
    "phase_processing_s",
    "network_rtt_s",
    "connection_reused",
    "output_tokens",
    "think_tokens",
    "cost",
    "cost_currency",
    "cost_method",
    "cost_prompt_per_mtok",
    "cost_generation_per_mtok",
    "cost_blended_per_mtok",
    "energy_j",
    "energy_net_j",
    "energy_idle_watts",
)
_RUN_POINT_FLAGS = tuple(
    RUN_POINT_COLUMNS.index(c) for c in ("timing_disturbed", "cache_assisted", "prompt_size_missed")
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
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_assisted: bool = False
    prompt_size_missed: bool = False
    prefill_tokens_per_second: float | None = None
    # The network phases (docs/methodology.md, "Network phases"): NULL where not measured (a connection kept
    # from an earlier round, runs stored before schema v9/v10, a run without a response).
    phase_resolve_s: float | None = None
    phase_connect_s: float | None = None
    phase_tls_s: float | None = None
    phase_processing_s: float | None = None
    network_rtt_s: float | None = None
    connection_reused: bool | None = None
    # Tokens and cost and energy (docs/methodology.md, "Cost and energy"): NULL for runs of endpoints without
    # prices or a power source and for runs stored before schema v11 (SQLite) / v12 (PostgreSQL).
    output_tokens: int | None = None
    think_tokens: int | None = None
    cost: float | None = None
    cost_currency: str | None = None
    cost_method: str | None = None
    cost_prompt_per_mtok: float | None = None
    cost_generation_per_mtok: float | None = None
    cost_blended_per_mtok: float | None = None
    energy_j: float | None = None
    energy_net_j: float | None = None
    energy_idle_watts: float | None = None

    @property
    def server_s(self) -> float | None:
        """The server's share of TTFT: TTFT less one network round trip, where this round measured one."""
        if self.ttft_s is None or self.network_rtt_s is None:
            return None
        return max(0.0, self.ttft_s - self.network_rtt_s)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunPoint:
        """From values in RUN_POINT_COLUMNS order (time as unix seconds; SQLite's 0/1 flags made bools)."""
        values = list(row)
        for i in _RUN_POINT_FLAGS:
            values[i] = bool(values[i])
        for i in _NULLABLE_FLAGS:
            if values[i] is not None:
                values[i] = bool(values[i])
        return cls._make(values)


_NULLABLE_FLAGS = tuple(RUN_POINT_COLUMNS.index(c) for c in ("tps_set_aside", "connection_reused"))


@dataclass(slots=True)
class MaintenanceReport:
    """What one maintenance pass changed."""

    partitions_created: list[str] = field(default_factory=list)
    partitions_dropped: list[str] = field(default_factory=list)
    rows_deleted: int = 0


class RunStore(ABC):
    """One database holding every probe run, and the database's lifecycle (schema, reachability, clock,
    housekeeping, connections); all methods are safe to await from the event loop."""

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
        self, since: float, until: float, *, rule: WindowRule, site: str | None = None
    ) -> dict[SeriesKey, WindowStats]:
        """Per-series aggregates of the runs `rule` counts with since <= time < until (of one `site` if
        given), keyed by (current endpoint name, workload, site) (tok/s figures over its samples)."""

    @abstractmethod
    async def last_runs(self, since: float, *, site: str | None = None) -> dict[SeriesKey, LastRun]:
        """Per series (of one `site` if given), the newest run and newest `ok` run at or after `since`."""

    @abstractmethod
    async def recent_runs(
        self,
        since: float,
        limit: int | None,
        *,
        endpoint: str | None = None,
        rule: WindowRule | None = None,
        workload: str | None = None,
        site: str | None = None,
    ) -> dict[SeriesKey, list[RunPoint]]:
        """Per series (current endpoint name; only those of `endpoint`, `workload`, `site` where given), its
        newest `limit` runs (all when None) at or after `since`, newest first: the runs `rule` counts
        (None: every run)."""

    @abstractmethod
    async def hourly(self, since: float, until: float) -> list[dict[str, object]]:
        """Rows of the hourly rollup in a time range (endpoint name, workload, site, bucket start, counts,
        tok/s figures)."""

    @abstractmethod
    async def count_runs(self) -> int:
        """Rows in the runs table."""

    @abstractmethod
    async def ping(self) -> None:
        """One round trip to the database (`SELECT 1`); raises StorageError when it does not answer."""

    @abstractmethod
    async def clock(self) -> float | None:
        """The database server's own clock (unix seconds); None when the store has none (a file)."""

    @abstractmethod
    async def maintain(self, now: float, retention_s: float) -> MaintenanceReport:
        """Partitions ahead, retention, policies: the periodic housekeeping of this backend."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""


class BenchStore(ABC):
    """The bench runs of a run store's database, over that store's connection: the store migrates, opens and
    closes it. A split run's segments (claim, segment, merge) are for `tokwatch bench --segment`."""

    @abstractmethod
    async def write_bench(self, run: BenchRunRow, requests: Sequence[BenchRequestRow]) -> bool:
        """Store a bench run and its requests in one transaction; a run id already stored is left as is.

        Returns True when the run was new. Bench rows never go to the probe `runs` table.
        """

    @abstractmethod
    async def write_capacity(self, row: CapacityRow) -> bool:
        """Store a capacity search's result; an id already stored is left as is. True when it was new."""

    @abstractmethod
    async def latest_capacity(self, endpoint: str) -> CapacityRow | None:
        """The newest stored capacity search of `endpoint` that found a rate; None without one."""

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
    async def claim_bench_run(self, run: BenchRunRow) -> BenchRunRow:
        """Insert `run` unless its id is stored; returns the stored row (the first claimant's, for all)."""

    @abstractmethod
    async def write_bench_segment(
        self, run: BenchRunRow, segment: BenchSegmentRow, requests: Sequence[BenchRequestRow]
    ) -> bool:
        """Store one segment of a split run and its requests in one transaction, the run row first if it is
        not stored yet; a segment already stored is left as is. Returns True when the segment was new."""

    @abstractmethod
    async def bench_segments(self, run_id: str) -> list[BenchSegmentRow]:
        """The stored segments of a run, in segment order."""

    @abstractmethod
    async def merge_bench_run(self, run_id: str, merge: BenchMerge) -> BenchRunRow | None:
        """Replace the run row by `merge(row, segments, requests)` while no other merge of this run runs
        (the last merge of a run always sees every segment committed before it); None when not stored."""


def hour_bucket(t: float) -> float:
    """Start of the UTC hour containing unix time `t`."""
    return float(int(t // HOUR_S) * HOUR_S)
