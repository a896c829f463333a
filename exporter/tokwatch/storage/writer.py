"""RunWriter: probes hand runs over without waiting; a background task writes them to the store.

Runs wait in a bounded in-memory queue. When the database is down, slow or the queue overflows, they go
to the durable outbox (fsync'd JSONL) and are replayed in order once the database answers again; the
store ignores run ids it already holds, so a replay after a crash never stores a run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokwatch.config import EndpointSettings
from tokwatch.redact import Redactor
from tokwatch.result import RunResult
from tokwatch.storage.base import EndpointSpec, Store
from tokwatch.storage.errors import SchemaTooNewError, StorageError
from tokwatch.storage.outbox import Outbox, Pending
from tokwatch.storage.rows import RunRow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WriterStats:
    """A snapshot for the `tokwatch_storage_*` self-metrics."""

    queue_depth: int
    outbox_runs: int
    writes_total: int
    write_errors_total: int
    dropped_total: int
    oldest_unwritten_age_seconds: float
    up: bool


class RunWriter:
    """Bounded queue + outbox + replay in front of a `Store`. `close()` does not close the store."""

    def __init__(
        self,
        store: Store,
        *,
        outbox_path: Path,
        queue_size: int = 10000,
        batch_size: int = 500,
        write_timeout_s: float = 5.0,
        retry_min_s: float = 1.0,
        retry_max_s: float = 30.0,
        retention_s: float = 400 * 86400.0,
        maintenance_interval_s: float = 3600.0,
        instance: str = "",
        redactor: Redactor | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._outbox = Outbox(outbox_path)
        self._queue: deque[Pending] = deque()
        self._inflight: list[Pending] = []
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._write_timeout = write_timeout_s
        self._retry_min = retry_min_s
        self._retry_max = retry_max_s
        self._backoff = retry_min_s
        self._retry_at = 0.0  # monotonic time before which the database is not tried again
        self._retention_s = retention_s
        self._maintenance_interval = maintenance_interval_s
        self._next_maintenance = 0.0  # monotonic; 0 = at the first opportunity
        self._instance = instance
        self._redact = redactor or Redactor()
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._endpoints: list[EndpointSpec] | None = None
        self._endpoints_dirty = False
        self._writes = 0
        self._errors = 0
        self._dropped = 0
        self._up = False
        self._failing = False

    @property
    def backend(self) -> str:
        """The store's backend name (known after the first successful connection for PostgreSQL)."""
        return self._store.backend

    @property
    def outbox(self) -> Outbox:
        """The durable outbox (for status output and tests)."""
        return self._outbox

    # --- producer side (event loop, never awaits the database) ----------------------------------------

    def submit(self, result: RunResult) -> None:
        """Hand a run over; returns at once. Overflow spills the queue to the outbox (a local fsync)."""
        self.submit_row(RunRow.from_result(result, redactor=self._redact, instance=self._instance))

    def submit_row(self, row: RunRow) -> None:
        """`submit` for an already-mapped row."""
        item = Pending(self._clock(), row)
        if self._closed or len(self._queue) >= self._queue_size:
            # Keep order: the queued runs are older than this one, so they go to the outbox first.
            spill = [*self._queue, item]
            self._queue.clear()
            self._append_outbox_sync(spill)
        else:
            self._queue.append(item)
        self._wake.set()

    def _append_outbox_sync(self, items: list[Pending]) -> None:
        try:
            self._outbox.append(items)
        except StorageError as exc:
            self._dropped += len(items)
            log.error("storage: %d runs lost: %s", len(items), exc)

    def sync_endpoints(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Record the configured endpoints; the writer gives them ids (renames keep theirs) before writing."""
        self._endpoints = [EndpointSpec(e.name, tuple(e.renamed_from)) for e in endpoints]
        self._endpoints_dirty = True
        self._wake.set()

    def stats(self) -> WriterStats:
        """Current figures; no I/O."""
        heads = [p.queued_at for p in (self._inflight[:1] + list(self._queue)[:1])]
        if self._outbox.oldest_queued_at is not None:
            heads.append(self._outbox.oldest_queued_at)
        age = max(0.0, self._clock() - min(heads)) if heads else 0.0
        return WriterStats(
            queue_depth=len(self._queue) + len(self._inflight),
            outbox_runs=self._outbox.pending,
            writes_total=self._writes,
            write_errors_total=self._errors,
            dropped_total=self._dropped,
            oldest_unwritten_age_seconds=age,
            up=self._up,
        )

    # --- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background writer (it replays the outbox first)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokwatch-storage-writer")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush within `timeout_s`; whatever is not in the database by then is fsync'd to the outbox."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            except Exception:  # the loop never raises, but a close must not fail
                log.exception("storage writer stopped with an error")
            self._task = None
        leftover = [*self._inflight, *self._queue]
        self._inflight = []
        self._queue.clear()
        if leftover:
            await asyncio.to_thread(self._append_outbox_sync, leftover)
        self._closed = True

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until queue and outbox are empty (True) or the timeout passes (False); for tests and tools."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queue and not self._inflight and not self._outbox.pending:
                return True
            self._wake.set()
            await asyncio.sleep(0.02)
        return False

    # --- background loop ----------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(
            self._queue
            or self._outbox.pending
            or self._endpoints_dirty
            or time.monotonic() >= self._next_maintenance
        )

    async def _wait(self) -> None:
        now = time.monotonic()
        if now < self._retry_at:
            if self._queue or self._closing:
                return
            timeout = self._retry_at - now
        elif self._has_work() or self._closing:
            return
        else:
            timeout = max(0.0, self._next_maintenance - now)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _run(self) -> None:
        while True:
            await self._wait()
            if time.monotonic() < self._retry_at:
                # The database is known to be down: keep queued runs on disk so kill -9 cannot lose them.
                await self._spill_queue()
                if self._closing:
                    return
                continue
            if self._closing and not self._queue and not self._outbox.pending:
                return
            try:
                await self._step()
            except Exception as exc:
                self._on_failure(exc)
                if self._closing:
                    await self._spill_queue()
                    return
            else:
                if self._failing:
                    log.info("storage: database %s is back; outbox replayed", self._store.location)
                self._failing = False
                self._up = True
                self._backoff = self._retry_min

    def _on_failure(self, exc: BaseException) -> None:
        self._errors += 1
        self._up = False
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._retry_max)
        if isinstance(exc, SchemaTooNewError):
            log.error("storage: %s; runs stay in the outbox", exc)
        elif not self._failing:
            detail = str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
            log.warning("storage: write failed, runs go to the outbox: %s", self._redact(detail))
        self._failing = True

    async def _spill_queue(self) -> None:
        if not self._queue:
            return
        items = list(self._queue)
        self._queue.clear()
        await asyncio.to_thread(self._append_outbox_sync, items)

    async def _write(self, rows: list[RunRow]) -> None:
        await asyncio.wait_for(self._store.write_runs(rows), self._write_timeout)
        self._writes += len(rows)

    async def _step(self) -> None:
        await asyncio.wait_for(self._store.ensure_ready(), self._write_timeout)
        self._up = True
        if self._endpoints_dirty and self._endpoints is not None:
            await asyncio.wait_for(self._store.sync_endpoints(self._endpoints), self._write_timeout)
            self._endpoints_dirty = False
        if time.monotonic() >= self._next_maintenance:
            await self._store.maintain(self._clock(), self._retention_s)
            self._next_maintenance = time.monotonic() + self._maintenance_interval
        while self._outbox.pending:
            await self._spill_queue()  # newer than everything in the outbox: keep the order
            items, end = await asyncio.to_thread(self._outbox.peek, self._batch_size)
            if items:
                await self._write([p.row for p in items])
            await asyncio.to_thread(self._outbox.commit, end, len(items))
        while self._queue:
            n = min(self._batch_size, len(self._queue))
            self._inflight = [self._queue.popleft() for _ in range(n)]
            try:
                await self._write([p.row for p in self._inflight])
            except Exception:
                await asyncio.to_thread(self._append_outbox_sync, self._inflight)
                self._inflight = []
                raise
            self._inflight = []
