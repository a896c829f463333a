"""RunWriter: probes hand runs over without waiting; a background task makes them durable, then stores them.

Every run goes to the durable outbox (fsync'd, off the event loop) as soon as the writer task sees it, and
only then is the database tried: a kill -9 at any moment loses at most runs handed over in the last few
milliseconds, never runs held while the database is slow or down. Runs are written to the database from
the outbox in order; the store ignores run ids it already holds, so a replay after a crash never stores a
run twice. When the outbox cannot be written (disk full), runs wait in memory (bounded by `queue_size`)
and go to the outbox as soon as it takes them again (tried every UNSAVED_RETRY_S) or straight to the database
when it answers, whichever comes first; beyond the bound they are dropped and counted.
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

from tokwatch.figures.result import RunResult
from tokwatch.figures.wording import counted
from tokwatch.logs.log_throttle import BurstLog
from tokwatch.settings.config import EndpointSettings
from tokwatch.settings.redact import Redactor
from tokwatch.storage.base import EndpointSpec, RunStore
from tokwatch.storage.errors import SchemaTooNewError, StorageError
from tokwatch.storage.outbox import Outbox, OutboxWriteError, Pending
from tokwatch.storage.rows import RunRow
from tokwatch.transport.event_wait import wait_event

log = logging.getLogger(__name__)


# How often an idle writer checks that the database still answers, so `tokwatch_storage_up` is measured.
CHECK_INTERVAL_S = 15.0
# Once the database answers again, writes resume within this long (issue 9: "within 30 s, or one probe
# interval, whichever is shorter"; the exporter passes `resume_bound(interval)`).
RESUME_WITHIN_S = 30.0
RETRY_MIN_S, RETRY_MAX_S = 1.0, 10.0  # back-off after a failed attempt: doubling from min to max
# While runs wait in memory because the outbox could not take them, the outbox is tried again this often: once
# the disk has room, they are on it within this long (issue 37: they used to stay in memory until the
# database took them, and a kill -9 meanwhile lost them).
UNSAVED_RETRY_S = 0.5
# Dropped runs are logged once per burst with their count, this long after the burst's last drop.
DROP_BURST_QUIET_S = 1.0


def resume_bound(interval_s: float) -> float:
    """How soon writes must resume after the database returns for a probe interval: min(30 s, interval)."""
    return min(RESUME_WITHIN_S, interval_s)


@dataclass(frozen=True, slots=True)
class RetryTimings:
    """When the writer tries the database again, derived from how soon writes must resume."""

    retry_min_s: float
    retry_max_s: float  # the longest wait between two attempts while the database is down
    check_interval_s: float  # an idle writer's `SELECT 1`

    @classmethod
    def for_resume_within(cls, seconds: float) -> RetryTimings:
        """Back-off capped at a third of `seconds` (10 s for 30 s), so that the next attempt after the
        database's return, plus the store's reconnect, fits in `seconds` with room to spare; the idle check
        at most every `seconds`, so an outage is also noticed within the bound."""
        retry_max = min(RETRY_MAX_S, seconds / 3)
        return cls(min(RETRY_MIN_S, retry_max), retry_max, min(CHECK_INTERVAL_S, seconds))


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
    """Queue -> outbox -> store, with replay and retry. `close()` does not close the store."""

    def __init__(
        self,
        store: RunStore,
        *,
        outbox_path: Path,
        queue_size: int = 10000,
        batch_size: int = 500,
        write_timeout_s: float = 5.0,
        resume_within_s: float = RESUME_WITHIN_S,
        retry_min_s: float | None = None,
        retry_max_s: float | None = None,
        check_interval_s: float | None = None,
        retention_s: float = 400 * 86400.0,
        maintenance_interval_s: float = 3600.0,
        instance: str = "",
        redactor: Redactor | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._outbox = Outbox(outbox_path)
        self._queue: deque[Pending] = deque()  # handed over, not yet on disk
        self._unsaved: list[Pending] = []  # the outbox could not take them (disk full): memory only
        self._appending = 0  # runs on their way from the queue to the outbox
        # Held by whoever removes runs from the front of `_unsaved` (the outbox retry, the database task).
        self._unsaved_lock = asyncio.Lock()
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._write_timeout = write_timeout_s
        # Derived from `resume_within_s` unless given one by one (tests).
        timings = RetryTimings.for_resume_within(resume_within_s)
        self._retry_min = timings.retry_min_s if retry_min_s is None else retry_min_s
        self._retry_max = timings.retry_max_s if retry_max_s is None else retry_max_s
        self._backoff = self._retry_min
        self._retry_at = 0.0  # monotonic time before which the database is not tried again
        self._check_interval = timings.check_interval_s if check_interval_s is None else check_interval_s
        self._next_check = 0.0  # monotonic; when an idle writer pings the database next
        self._retention_s = retention_s
        self._maintenance_interval = maintenance_interval_s
        self._next_maintenance = 0.0  # monotonic; 0 = at the first opportunity
        self._instance = instance
        self._redact = redactor or Redactor()
        self._clock = clock
        self._wake = asyncio.Event()  # wakes the database task
        self._queued = asyncio.Event()  # wakes the outbox task
        self._task: asyncio.Task[None] | None = None
        self._durable_task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._endpoints: list[EndpointSpec] | None = None
        self._endpoints_dirty = False
        self._writes = 0
        self._errors = 0
        self._dropped = 0
        self._up = False
        self._failing = False
        self._outbox_failing = False
        self._outbox_error = ""
        self._drops = BurstLog(log, logging.ERROR, self._dropped_line, quiet_s=DROP_BURST_QUIET_S)

    def _dropped_line(self, count: int, seconds: float) -> str:
        return (
            f"storage: {counted(count, 'run')} dropped in {seconds:.1f}s: the outbox cannot be written "
            f"({self._outbox_error}) and {counted(self._queue_size, 'run')} (queue_size) already wait in "
            "memory; counted in tokwatch_storage_dropped_runs"
        )

    @property
    def backend(self) -> str:
        """The store's backend name (known after the first successful connection for PostgreSQL)."""
        return self._store.backend

    @property
    def outbox(self) -> Outbox:
        """The durable outbox (for status output and tests)."""
        return self._outbox

    @property
    def timings(self) -> RetryTimings:
        """The back-off and idle-check timings in use."""
        return RetryTimings(self._retry_min, self._retry_max, self._check_interval)

    def resume_within(self, seconds: float) -> None:
        """Derive the retry and idle-check timings from a new bound (the probe interval changed on reload)."""
        timings = RetryTimings.for_resume_within(seconds)
        self._retry_min, self._retry_max = timings.retry_min_s, timings.retry_max_s
        self._check_interval = timings.check_interval_s
        now = time.monotonic()
        self._backoff = min(self._backoff, self._retry_max)
        self._retry_at = min(self._retry_at, now + self._retry_max)
        self._next_check = min(self._next_check, now + self._check_interval)
        self._wake.set()

    # --- producer side (event loop, never awaits the database) ----------------------------------------

    def submit(self, result: RunResult) -> None:
        """Hand a run over; returns at once (the writer task makes it durable off the event loop)."""
        self.submit_row(RunRow.from_result(result, redactor=self._redact, instance=self._instance))

    def submit_row(self, row: RunRow) -> None:
        """`submit` for an already-mapped row."""
        item = Pending(self._clock(), row)
        if self._closed or len(self._queue) >= self._queue_size:
            # No writer task to take them (closed, or not keeping up): make them durable right here.
            spill = [*self._queue, item]
            self._queue.clear()
            self._make_durable_sync(spill)
            self._wake.set()
        else:
            self._queue.append(item)
            self._queued.set()

    def sync_endpoints(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Record the configured endpoints; the writer gives them ids (renames keep theirs) before writing."""
        self._endpoints = [EndpointSpec(e.name, tuple(e.renamed_from)) for e in endpoints]
        self._endpoints_dirty = True
        self._wake.set()

    def stats(self) -> WriterStats:
        """Current figures; no I/O."""
        heads = [p.queued_at for p in (self._unsaved[:1] + list(self._queue)[:1])]
        if self._outbox.oldest_queued_at is not None:
            heads.append(self._outbox.oldest_queued_at)
        age = max(0.0, self._clock() - min(heads)) if heads else 0.0
        return WriterStats(
            queue_depth=len(self._queue) + self._appending + len(self._unsaved),
            outbox_runs=self._outbox.pending,
            writes_total=self._writes,
            write_errors_total=self._errors,
            dropped_total=self._dropped + self._outbox.lost_records,
            oldest_unwritten_age_seconds=age,
            up=self._up,
        )

    # --- durability -----------------------------------------------------------------------------------

    def _make_durable_sync(self, items: list[Pending]) -> None:
        """Append to the outbox (producer side, when no task can); see `_keep_unsaved` for what fails."""
        try:
            self._outbox.append(items)
        except OutboxWriteError as exc:
            self._keep_unsaved(items[exc.stored :], exc)
        else:
            self._outbox_ok()

    def _keep_unsaved(self, rest: list[Pending], exc: StorageError) -> None:
        # Memory is the only place left: keep up to queue_size runs for the database, drop the newest beyond
        # (the front of the list is what the database task is writing, so it must not move).
        room = max(0, self._queue_size - len(self._unsaved))
        keep, lost = rest[:room], len(rest) - min(room, len(rest))
        self._unsaved.extend(keep)
        self._dropped += lost
        self._outbox_error = str(exc)
        if not self._outbox_failing:
            log.error(
                "storage: %s; %s held in memory until the database takes them",
                exc,
                counted(len(self._unsaved), "run"),
            )
        self._drops.add(lost)  # one line per burst of drops, with the count
        self._outbox_failing = True
        self._wake.set()

    def _outbox_ok(self) -> None:
        if self._outbox_failing:
            log.info("storage: outbox %s writable again", self._outbox.path)
        self._outbox_failing = False

    async def _durable_loop(self) -> None:
        """Queue -> outbox, apart from the database task: a slow database never holds runs in memory."""
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._queued.clear()
                if self._unsaved:
                    await wait_event(self._queued, UNSAVED_RETRY_S)
                    if not self._queue and not self._closing:
                        await self._save_unsaved()
                else:
                    await self._queued.wait()
                continue
            items = list(self._queue)
            self._queue.clear()
            self._appending = len(items)
            try:
                await asyncio.to_thread(self._outbox.append, items)
            except OutboxWriteError as exc:
                self._keep_unsaved(items[exc.stored :], exc)
            else:
                self._outbox_ok()
            finally:
                self._appending = 0
            self._wake.set()
            if self._unsaved and not self._outbox_failing:
                await self._save_unsaved()  # the outbox takes runs again: those held in memory first

    async def _save_unsaved(self) -> None:
        """Move the runs held in memory to the outbox once it takes them again (disk space came back)."""
        async with self._unsaved_lock:
            items = list(self._unsaved)
            if not items:
                return
            try:
                await asyncio.to_thread(self._outbox.append, items)
            except OutboxWriteError as exc:
                del self._unsaved[: exc.stored]
                return
            del self._unsaved[: len(items)]
            log.info("storage: %d run(s) held in memory written to the outbox", len(items))
            self._outbox_ok()
            self._wake.set()

    # --- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background tasks (the database task replays the outbox first)."""
        if self._task is None:
            self._durable_task = asyncio.create_task(self._durable_loop(), name="tokwatch-storage-outbox")
            self._task = asyncio.create_task(self._run(), name="tokwatch-storage-writer")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush within `timeout_s`; whatever is not in the database by then stays in the outbox."""
        self._closing = True
        self._queued.set()
        self._wake.set()
        for task in (self._durable_task, self._task):
            if task is None:
                continue
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            except Exception:  # the loops never raise, but a close must not fail
                log.exception("storage writer stopped with an error")
        self._task = self._durable_task = None
        leftover = [*self._unsaved, *self._queue]
        self._unsaved = []
        self._queue.clear()
        if leftover:
            await asyncio.to_thread(self._make_durable_sync, leftover)
        self._drops.flush()
        if self._unsaved:
            self._dropped += len(self._unsaved)
            log.error(
                "storage: %s lost at shutdown: neither the outbox nor the database took them",
                counted(len(self._unsaved), "run"),
            )
            self._unsaved = []
        self._closed = True

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until queue and outbox are empty (True) or the timeout passes (False); for tests and tools."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not (self._queue or self._appending or self._unsaved or self._outbox.pending):
                return True
            self._queued.set()
            self._wake.set()
            await asyncio.sleep(0.02)
        return False

    # --- database task ------------------------------------------------------------------------------

    def _has_work(self) -> bool:
        now = time.monotonic()
        return bool(
            self._unsaved
            or self._outbox.pending
            or self._endpoints_dirty
            or now >= self._next_maintenance
            or now >= self._next_check
        )

    async def _wait(self) -> None:
        now = time.monotonic()
        if now < self._retry_at:
            if self._closing:
                return
            timeout = self._retry_at - now
        elif self._has_work() or self._closing:
            return
        else:
            timeout = max(0.0, min(self._next_maintenance, self._next_check) - now)
        self._wake.clear()
        await wait_event(self._wake, timeout)

    async def _run(self) -> None:
        while True:
            await self._wait()
            if self._closing:
                if self._durable_task is not None and not self._durable_task.done():
                    await asyncio.sleep(0.01)  # let the last queued runs reach the outbox first
                    continue
                if (not self._unsaved and not self._outbox.pending) or time.monotonic() < self._retry_at:
                    return
            if time.monotonic() < self._retry_at:
                continue
            try:
                await self._step()
            except Exception as exc:
                self._on_failure(exc)
            else:
                if self._failing:
                    log.info("storage: database %s answers again; outbox replayed", self._store.location)
                self._failing = False
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
            if isinstance(exc, TimeoutError):
                detail = f"no answer within {self._write_timeout:g}s"
            log.warning("storage: database unavailable, runs wait in the outbox: %s", self._redact(detail))
        self._failing = True

    async def _write(self, rows: list[RunRow]) -> None:
        await asyncio.wait_for(self._store.write_runs(rows), self._write_timeout)
        self._writes += len(rows)
        self._mark_up()

    def _mark_up(self) -> None:
        # Only ever after a statement the database answered: `up` is measured, not assumed.
        self._up = True
        self._next_check = time.monotonic() + self._check_interval

    async def _step(self) -> None:
        await asyncio.wait_for(self._store.ensure_ready(), self._write_timeout)
        if time.monotonic() >= self._next_check:
            # Also the first thing after a failure. Room for the store's own connect timeout and its direct
            # diagnosis attempt, which is what replaces a pool stuck in its reconnect backoff.
            await asyncio.wait_for(self._store.ping(), 2 * self._write_timeout + 1.0)
            self._mark_up()
        if self._endpoints_dirty and self._endpoints is not None:
            await asyncio.wait_for(self._store.sync_endpoints(self._endpoints), self._write_timeout)
            self._endpoints_dirty = False
        if time.monotonic() >= self._next_maintenance:
            await self._store.maintain(self._clock(), self._retention_s)
            self._next_maintenance = time.monotonic() + self._maintenance_interval
        while self._outbox.pending:
            start = self._outbox.offset
            items, end = await asyncio.to_thread(self._outbox.peek, self._batch_size)
            if items:
                await self._write([p.row for p in items])
            await asyncio.to_thread(self._outbox.commit, end, len(items))
            if not items and end == start:
                break  # only a torn record at the end is left; it is counted, and cut off at the next open
        async with self._unsaved_lock:
            while self._unsaved:
                batch = self._unsaved[: self._batch_size]
                await self._write([p.row for p in batch])
                del self._unsaved[: len(batch)]
