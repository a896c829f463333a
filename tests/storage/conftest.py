"""Storage fixtures; the PostgreSQL server and `pg_dsn` come from tests/conftest.py."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator

import pytest

from tokwatch.figures.result import RunResult, Status, TimingSource


def _make_run(
    endpoint: str,
    t: float,
    tps: float | None = 50.0,
    status: Status = Status.OK,
    **kw: object,
) -> RunResult:
    """A RunResult as a probe would produce it."""
    r = RunResult(endpoint=endpoint, started_at=t, status=status, tokens_per_second=tps, **kw)  # type: ignore[arg-type]
    if status is Status.OK and r.source is None:
        r.source = TimingSource.CLIENT_STREAM
    return r


@pytest.fixture
def make_run() -> object:
    """Factory for RunResults: make_run(endpoint, t, tps=50.0, status=Status.OK, **fields)."""
    return _make_run


class FileSizeLimit:
    """While `active()`: this process may not grow a file past `limit` bytes (EFBIG instead of SIGXFSZ),
    like a full disk. Only around the writes under test: the limit is process-wide, so pytest's own
    report (a CI log file far past 4 KiB) must not be written while it holds."""

    limit = 4096

    @contextlib.contextmanager
    def active(self) -> Iterator[int]:
        """Apply the limit for the block; restored on exit."""
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, hard))
        try:
            yield self.limit
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)


@pytest.fixture
def disk_full() -> FileSizeLimit:
    """A full disk for this process, applied with `with disk_full.active():` around the writes only."""
    return FileSizeLimit()
