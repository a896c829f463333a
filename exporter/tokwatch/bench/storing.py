"""Write a finished `tokwatch bench` run to the store configured in tokwatch.yml (`--config`)."""

from __future__ import annotations

import socket

from tokwatch.bench.outcome import BenchOutcome
from tokwatch.config import Config
from tokwatch.redact import Redactor
from tokwatch.storage.bench_rows import bench_rows
from tokwatch.storage.factory import open_store


def instance_name(config: Config) -> str:
    """The instance recorded on the run: the config's `instance`, else the host name (as the exporter)."""
    return config.instance or socket.gethostname()


async def store_outcome(outcome: BenchOutcome, config: Config, *, api_key: str | None = None) -> str:
    """Write the run and its measured requests in one transaction; returns a one-line confirmation.

    Raises StorageError (message already redacted) when the store cannot take the run.
    """
    instance = instance_name(config)
    run, requests = bench_rows(outcome, instance=instance, redactor=Redactor([api_key]))
    store = await open_store(config.storage, instance=instance)
    try:
        new = await store.write_bench(run, requests)
    finally:
        await store.close()
    what = "stored" if new else "already stored"
    return f"{what}: bench run {run.id} ({len(requests)} requests) in {store.backend} {store.location}"
