"""Storage: every run in PostgreSQL/TimescaleDB or an embedded SQLite file, with a durable outbox.

Entry points for the exporter: `open_store` (a `RunStore`; `bench_store` gives the `BenchStore` of its
database), `make_writer` (a `RunWriter`), `WindowCache` (read by `tokwatch.metrics.window.WindowCollector`)
and `StorageCollector`; the CLI commands are in tokwatch.commands.store_commands.
"""

from tokwatch.storage.base import BenchStore, EndpointSpec, LastRun, RunStore, WindowStats
from tokwatch.storage.collector import StorageCollector
from tokwatch.storage.errors import SchemaTooNewError, StorageError, StoreUnavailableError
from tokwatch.storage.factory import (
    bench_store,
    make_store,
    make_writer,
    open_store,
    outbox_path,
    sqlite_path,
)
from tokwatch.storage.rows import RunRow
from tokwatch.storage.window import WindowCache, fleet_comparison, window_figures
from tokwatch.storage.writer import RunWriter, WriterStats

__all__ = [
    "BenchStore",
    "EndpointSpec",
    "LastRun",
    "RunRow",
    "RunStore",
    "RunWriter",
    "SchemaTooNewError",
    "StorageCollector",
    "StorageError",
    "StoreUnavailableError",
    "WindowCache",
    "WindowStats",
    "WriterStats",
    "bench_store",
    "fleet_comparison",
    "make_store",
    "make_writer",
    "open_store",
    "outbox_path",
    "sqlite_path",
    "window_figures",
]
