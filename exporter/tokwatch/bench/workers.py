"""`--workers N`: the run split over N client processes on one host, each running a segment of one schedule.

Worker j of N takes part j/N of its parent's segment (tokwatch.bench.segments): between them the workers
send exactly the requests one process would send, at the same planned instants, with the same ids and
contents; the merged arrivals are the requested process itself (not N independent streams). Every worker
stamps `time.perf_counter()` (CLOCK_MONOTONIC, one clock for every process on the host) against the
parent's t0, and the measured phase starts for all at one instant, after every worker's warm-up.

While any worker measures, no worker and no parent does other work: records stay in their worker until every
worker has finished (pickling a record and its per-token lists takes the worker's GIL from its receive
stamps; unpickling takes a core from the other workers and the server), and the live view reads counters
in shared memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import queue as queue_mod
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from typing import Any

from tokwatch.bench.config import BenchOptions
from tokwatch.bench.plan import build_workload, local_options, resolve_target
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.runner import BenchRunner, RunState
from tokwatch.bench.segments import Segment, parse_segment
from tokwatch.bench.stamping import bench_http_client
from tokwatch.bench.wallclock import check_start
from tokwatch.figures.result import Status
from tokwatch.transport.measurement import new_loop

_START_DELAY_S = 0.05  # lead time between the barrier and the common measured start
_BARRIER_TIMEOUT_S = 600.0  # the longest warm-up a worker may take
_RECORDS_PER_MESSAGE = 2000  # records are sent in chunks after the run, never one giant pickle
_POLL_S = 0.5  # live-view refresh from the shared counters
_STATUSES = tuple(s.value for s in Status)
_IN_FLIGHT, _TOKENS = len(_STATUSES), len(_STATUSES) + 1
_FIELDS = len(_STATUSES) + 2


def effective_workers(opts: BenchOptions) -> int:
    """Workers that get at least one request (never more than the segment's requests or concurrency)."""
    n = opts.workers
    segment = opts.segment_part
    number = opts.effective_number
    if number is not None:
        n = min(n, segment.share(number))
    if opts.rate is None:
        n = min(n, segment.share(opts.closed_loop_workers))
    return max(1, n)


@dataclass(frozen=True, slots=True)
class LiveTotals:
    """What every worker has done so far (measured requests by status, in flight, tokens received)."""

    by_status: Mapping[str, int]
    in_flight: int
    tokens: int

    @property
    def completed(self) -> int:
        """Measured requests finished, any status."""
        return sum(self.by_status.values())


class LiveCounters:
    """Per-worker counters in shared memory: each worker writes its own row, the parent sums them."""

    def __init__(self, values: Any, workers: int) -> None:
        self._values = values
        self._workers = workers

    @classmethod
    def create(cls, ctx: Any, workers: int) -> LiveCounters:
        """Zeroed counters for `workers` workers (lock-free: one writer per row)."""
        return cls(ctx.RawArray("d", workers * _FIELDS), workers)

    def on_start(self, k: int) -> Callable[[RequestRecord], None]:
        """Worker k's send callback."""
        values, base = self._values, k * _FIELDS

        def started(_r: RequestRecord) -> None:
            values[base + _IN_FLIGHT] += 1

        return started

    def on_record(self, k: int) -> Callable[[RequestRecord], None]:
        """Worker k's completion callback: a few stores in shared memory, nothing pickled."""
        values, base = self._values, k * _FIELDS
        column = {s: i for i, s in enumerate(_STATUSES)}

        def finished(r: RequestRecord) -> None:
            values[base + _IN_FLIGHT] -= 1
            if not r.warmup:
                values[base + column[r.status.value]] += 1
                if r.ttft_s is not None:
                    values[base + _TOKENS] += 1 + len(r.tbt_s)

        return finished

    def totals(self) -> LiveTotals:
        """Sums over the workers."""
        rows = [self._values[k * _FIELDS : (k + 1) * _FIELDS] for k in range(self._workers)]
        by_status = {s: int(sum(row[i] for row in rows)) for i, s in enumerate(_STATUSES)}
        in_flight = int(sum(row[_IN_FLIGHT] for row in rows))
        return LiveTotals(by_status, max(0, in_flight), int(sum(row[_TOKENS] for row in rows)))


@dataclass(frozen=True, slots=True)
class WorkerDone:
    """The last message of a worker: why it stopped, and its own CPU time over the run."""

    index: int
    stop_reason: str | None
    message: str | None
    end_s: float | None
    cpu_s: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Shared:
    """What the parent hands every worker besides its options."""

    t0: float
    start_at: Any  # multiprocessing Value('d'): the common measured start (perf_counter), 0 until fixed
    ready: Barrier  # every worker warmed up: the start is fixed
    finished: Barrier  # every worker has finished: records may cross now
    out: Any  # multiprocessing Queue: record chunks, then WorkerDone
    counters: LiveCounters


def _fix_start(start_at: Any) -> None:
    """Barrier action (runs in one worker): the common measured start, unless the parent fixed it."""
    if not start_at.value:
        start_at.value = time.perf_counter() + _START_DELAY_S


def _exit_with_parent() -> None:
    """A thread that ends this worker when its parent is gone (killed, never able to collect the records):
    otherwise the worker would wait out the barriers and then block for ever handing records to nobody."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        mp_connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="bench-parent-watch", daemon=True).start()


def _worker_main(opts_data: dict[str, Any], segment_label: str, k: int, shared: _Shared) -> None:
    """Process entry point: run segment `segment_label` as worker k, then hand the records over."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _exit_with_parent()
    cpu0 = time.process_time()
    state: RunState | None = None
    error: str | None = None
    try:
        opts = BenchOptions.model_validate(opts_data)
        with asyncio.Runner(loop_factory=new_loop) as runner:
            state = runner.run(_worker_run(opts, parse_segment(segment_label), k, shared))
    except Exception as exc:  # reported to the parent as a worker failure, never a traceback
        error = f"worker {k}: {type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            shared.ready.abort()
    cpu = time.process_time() - cpu0
    # Hand records over only once no worker measures any more (or one of them is gone).
    with contextlib.suppress(threading.BrokenBarrierError):
        shared.finished.wait(timeout=_BARRIER_TIMEOUT_S)
    records = state.records if state else []
    for i in range(0, len(records), _RECORDS_PER_MESSAGE):
        shared.out.put(records[i : i + _RECORDS_PER_MESSAGE])
    shared.out.put(
        WorkerDone(
            k,
            state.stop_reason if state else "worker_failed",
            state.message if state else error,
            state.end_s if state else None,
            cpu,
            error,
        )
    )


async def _worker_run(opts: BenchOptions, segment: Segment, k: int, shared: _Shared) -> RunState:
    mine = local_options(opts, segment)
    target = resolve_target(mine).target
    requests, conversations = build_workload(mine)

    async def sync_start() -> float:
        # After its warm-up every worker waits here; the start is fixed once all are ready.
        await asyncio.to_thread(shared.ready.wait, _BARRIER_TIMEOUT_S)
        return check_start(float(shared.start_at.value))  # a start fixed by the parent may have passed

    # Start-up objects out of the collector's view, as in the one-process session (session.py).
    gc.collect()
    gc.freeze()
    async with bench_http_client(mine) as http:
        runner = BenchRunner(
            mine,
            target,
            http,
            requests=requests,
            conversations=conversations,
            on_record=shared.counters.on_record(k),
            on_start=shared.counters.on_start(k),
            t0=shared.t0,
            segment=segment,
            sync_start=sync_start,
        )
        return await runner.run()


async def run_workers(
    opts: BenchOptions,
    state: RunState,
    n: int,
    on_progress: Callable[[LiveTotals], None],
    *,
    start_perf: float | None = None,
) -> list[WorkerDone]:
    """Run n worker processes over this process's segment, their records into `state` once all have
    finished; `start_perf` fixes the measured start (perf_counter), else it follows the slowest warm-up.
    Cancellation terminates them."""
    ctx = mp.get_context("spawn")  # never fork a process that runs an event loop and threads
    start_at = ctx.Value("d", start_perf or 0.0)
    shared = _Shared(
        t0=state.t0,
        start_at=start_at,
        ready=ctx.Barrier(n, action=functools.partial(_fix_start, start_at)),
        finished=ctx.Barrier(n),
        out=ctx.Queue(),
        counters=LiveCounters.create(ctx, n),
    )
    data = opts.model_dump(mode="python")
    segment = opts.segment_part
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(data, segment.split(j, n).label, j, shared),
            name=f"bench-worker-{j}",
        )
        for j in range(n)
    ]
    for p in procs:
        p.start()
    done: list[WorkerDone] = []
    loop = asyncio.get_running_loop()
    try:
        while len(done) < n:
            try:
                item = await loop.run_in_executor(None, shared.out.get, True, _POLL_S)
            except queue_mod.Empty:
                on_progress(shared.counters.totals())
                if any(not p.is_alive() for p in procs):
                    # A worker gone without its last message: the others must not wait for it.
                    shared.ready.abort()
                    shared.finished.abort()
                    if all(not p.is_alive() for p in procs) and shared.out.empty():
                        break
                continue
            if isinstance(item, WorkerDone):
                done.append(item)
                if state.measure_start is None and start_at.value:
                    state.measure_start = start_at.value - state.t0
            else:
                state.records.extend(item)
        on_progress(shared.counters.totals())
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
        shared.out.close()
    return done
