"""`--workers N`: the load split over N client processes, so one event loop's CPU never delays receive stamps.

Every process stamps with `time.perf_counter()` (CLOCK_MONOTONIC, shared by all processes on the host)
against one common run start, so their records merge into one timeline. Worker k of n gets an n-th of the
concurrency, rate, request count and warm-up, and its own seed; a constant-rate schedule is phase-shifted
by k/rate so the merged arrivals are exactly the requested constant rate (independent Poisson streams merge
into a Poisson stream; merged gamma streams are burstier-or-equal, see docs/bench.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing as mp
import queue as queue_mod
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from typing import Any

from tokwatch.bench.config import BenchOptions
from tokwatch.bench.plan import build_workload, resolve_target
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.runner import BenchRunner, RunState
from tokwatch.http import HttpClient
from tokwatch.measurement import new_loop

_START_DELAY_S = 0.05  # lead time between the barrier and the common measured start


def share(total: int, n: int, k: int) -> int:
    """Worker k's share of `total` split as evenly as possible over n workers."""
    return total // n + (1 if k < total % n else 0)


def worker_options(opts: BenchOptions, k: int, n: int) -> BenchOptions:
    """Options of worker k of n."""
    update: dict[str, Any] = {"workers": 1, "seed": opts.seed * 1009 + k, "warmup": share(opts.warmup, n, k)}
    if opts.rate is not None:
        update["rate"] = opts.rate / n
    if opts.concurrency is not None:
        update["concurrency"] = max(1, share(opts.concurrency, n, k))
    if opts.parallel is not None:
        update["parallel"] = max(1, share(opts.parallel, n, k))
    if opts.max_concurrency is not None:
        update["max_concurrency"] = max(1, share(opts.max_concurrency, n, k))
    number = opts.effective_number
    if number is not None:
        update["number"] = share(number, n, k)
    return opts.model_copy(update=update)


def effective_workers(opts: BenchOptions) -> int:
    """Workers that get at least one request (never more than the requests or concurrency)."""
    n = opts.workers
    number = opts.effective_number
    if number is not None:
        n = min(n, number)
    if opts.rate is None:
        n = min(n, opts.closed_loop_workers)
    return max(1, n)


@dataclass(frozen=True, slots=True)
class WorkerDone:
    """The last message of a worker: why it stopped, and its own CPU time."""

    index: int
    stop_reason: str | None
    message: str | None
    end_s: float | None
    cpu_s: float
    error: str | None = None


def _fix_start(start_at: Any) -> None:
    """Barrier action (runs in one worker): the common measured start, shortly after everyone is ready."""
    start_at.value = time.perf_counter() + _START_DELAY_S


def _worker_main(
    opts_data: dict[str, Any], k: int, n: int, t0: float, start_at: Any, barrier: Barrier, out: Any
) -> None:
    """Process entry point: run worker k's share, streaming records to `out`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    cpu0 = time.process_time()
    state: RunState | None = None
    error: str | None = None
    try:
        opts = BenchOptions.model_validate(opts_data)
        with asyncio.Runner(loop_factory=new_loop) as runner:
            state = runner.run(_worker_run(opts, k, n, t0, start_at, barrier, out))
    except Exception as exc:  # reported to the parent as a worker failure, never a traceback
        error = f"worker {k}: {type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            barrier.abort()
    out.put(
        WorkerDone(
            k,
            state.stop_reason if state else "worker_failed",
            state.message if state else error,
            state.end_s if state else None,
            time.process_time() - cpu0,
            error,
        )
    )


async def _worker_run(
    opts: BenchOptions, k: int, n: int, t0: float, start_at: Any, barrier: Barrier, out: Any
) -> RunState:
    mine = worker_options(opts, k, n)
    target = resolve_target(mine).target
    requests, conversations = build_workload(mine)

    async def sync_start() -> float:
        # Every worker waits here after its warm-up; one of them fixes the common start instant.
        def wait() -> None:
            barrier.wait(timeout=600)

        await asyncio.to_thread(wait)
        return float(start_at.value)

    phase = k / opts.rate if opts.rate and opts.arrivals == "constant" else 0.0
    async with HttpClient(limit=0, user_agent="tokwatch-bench", watch_receives=mine.watch_receives) as http:
        runner = BenchRunner(
            mine,
            target,
            http,
            requests=requests,
            conversations=conversations,
            on_record=out.put,
            t0=t0,
            worker=(k, n),
            phase_s=phase,
            sync_start=sync_start,
        )
        return await runner.run()


async def run_workers(
    opts: BenchOptions, state: RunState, n: int, on_record: Callable[[RequestRecord], None]
) -> list[WorkerDone]:
    """Run n worker processes, merging their records into `state`; cancellation terminates them."""
    ctx = mp.get_context("spawn")  # never fork a process that runs an event loop and threads
    out = ctx.Queue()
    start_at = ctx.Value("d", 0.0)
    barrier = ctx.Barrier(n, action=functools.partial(_fix_start, start_at))
    data = opts.model_dump(mode="python")
    procs = [
        ctx.Process(
            target=_worker_main, args=(data, k, n, state.t0, start_at, barrier, out), name=f"bench-worker-{k}"
        )
        for k in range(n)
    ]
    for p in procs:
        p.start()
    done: list[WorkerDone] = []
    loop = asyncio.get_running_loop()
    try:
        while len(done) < n:
            try:
                item = await loop.run_in_executor(None, out.get, True, 0.2)
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and out.empty():
                    break  # a worker died without reporting
                continue
            if isinstance(item, WorkerDone):
                done.append(item)
                if state.measure_start is None:
                    state.measure_start = start_at.value - state.t0 if start_at.value else None
            else:
                state.records.append(item)
                on_record(item)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
        out.close()
    return done
