"""One whole benchmark session: plan the run (`plan.py`), run it with the live view, write every output."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console

from tokwatch import precise_timer
from tokwatch.bench.client import Target
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.live import LiveStats, make_progress, serve_live_metrics
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.outputs import default_output_dir, write_run
from tokwatch.bench.plan import build_workload, local_options, resolve_target
from tokwatch.bench.prompt_salt import run_salt
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.runner import BenchRunner, RunState
from tokwatch.bench.server_watch import ServerWatch, stop_task, watch_during
from tokwatch.bench.stamping import bench_http_client, receive_stamps
from tokwatch.bench.wallclock import check_start, perf_at, wall_minus_perf
from tokwatch.bench.workers import LiveTotals, effective_workers, run_workers
from tokwatch.http import HttpClient
from tokwatch.measurement import FREEZE_EVERY_S, loop_name
from tokwatch.redact import Redactor
from tokwatch.setting_values import parse_listen


def echo_options(opts: BenchOptions, target: Target) -> dict[str, Any]:
    """Options for summary.json: no secret, the target's URL without credentials."""
    redact = Redactor(target.secrets)
    data = {k: redact(v) if isinstance(v, str) else v for k, v in opts.model_dump(mode="json").items()}
    data["slos"] = [s.name for s in opts.parsed_slos()]
    data.update(
        target=redact(target.base_url),
        kind=target.kind,
        model=target.model,
        load=opts.load_description(),
    )
    return data


async def run_bench(
    opts: BenchOptions,
    *,
    console: Console | None = None,
    out_dir: Path | None = None,
) -> tuple[BenchOutcome, Path]:
    """Run the benchmark and write its directory; a cancelled run still writes, marked incomplete.

    Raises ConfigError/WorkloadError/SloError before anything is sent when an input is bad.
    """
    console = console or Console(stderr=True)
    # One id from the start: every --workers process (and every --segment process) runs under it, and its
    # prompt salt is the run's, so all of them build the one run's prompts.
    run_id = opts.run_id or uuid.uuid4().hex
    opts = opts.model_copy(update={"run_id": run_id, "prompt_salt": run_salt(run_id, opts.repeat_prompts)})
    resolved = resolve_target(opts)
    target = resolved.target
    slos = opts.parsed_slos()
    requests, conversations = build_workload(opts)
    out_dir = out_dir or (Path(opts.output_dir) if opts.output_dir else default_output_dir(target.model))
    stats = LiveStats()
    progress = make_progress(console)
    total = opts.effective_number if conversations is None else None
    task_id = progress.add_task("bench", total=total, status="")
    live_server = None
    if opts.listen:
        host, port = parse_listen(opts.listen)
        live_server, _ = serve_live_metrics(stats, host, port)

    def on_start(_r: RequestRecord) -> None:
        stats.in_flight += 1

    def on_record(r: RequestRecord) -> None:
        stats.in_flight = max(0, stats.in_flight - 1)
        stats.add(r)
        if not r.warmup:
            errors = stats.completed - stats.by_status.get("ok", 0)
            progress.update(task_id, advance=1, status=f"errors {errors}")

    interrupted = False
    async with bench_http_client(opts) as http:
        watch: ServerWatch | None = None
        if opts.server_metrics and target.metrics_url:
            watch = ServerWatch(
                http,
                target.metrics_url,
                target.kind,
                target.model,
                resolved.mirror_metrics,
                reach=target.reach,
            )
            await watch.start()
        n_workers = effective_workers(opts)
        # Start-up objects (modules, options, workload) out of the collector's view: a full collection
        # stops the loop that stamps every stream, for tens of ms with all of them in view.
        gc.collect()
        gc.freeze()
        segment = opts.segment_part
        # --start-at: the measured phase starts at that wall-clock instant (after the warm-up).
        start_perf = perf_at(opts.start_at) if opts.start_at is not None else None

        async def at_start() -> float:
            assert start_perf is not None
            return check_start(start_perf)

        runner = BenchRunner(
            local_options(opts, segment),
            target,
            http,
            requests=requests,
            conversations=conversations,
            on_record=on_record,
            on_start=on_start,
            segment=segment,
            sync_start=at_start if start_perf is not None else None,
        )
        state = runner.state
        # The wall-clock instant of t0 itself: stored send times (`started_at_unix` + `sent_at_s`) of split
        # runs are compared across machines, so not the time.time() of an earlier line.
        started_unix = state.t0 + wall_minus_perf()
        stats.started = state.t0
        helpers = [asyncio.create_task(_live_lines(stats, console, opts.live_interval), name="bench-live")]
        if watch is not None:
            helpers.append(await watch_during(watch))
        worker_cpu: list[float] = []

        def on_progress(totals: LiveTotals) -> None:
            stats.absorb(totals.by_status, totals.in_flight, totals.tokens)
            errors = totals.completed - totals.by_status.get("ok", 0)
            progress.update(task_id, completed=totals.completed, status=f"errors {errors}")

        run: Coroutine[Any, Any, object] = (
            runner.run()
            if n_workers == 1
            else _run_in_workers(opts, state, n_workers, on_progress, worker_cpu, start_perf)
        )
        run_task = asyncio.create_task(run, name="bench-run")
        progress.start()
        try:
            await asyncio.shield(run_task)
        except asyncio.CancelledError:
            # Ctrl-C or a cancelled caller: stop the requests, keep what was measured.
            interrupted = True
            run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run_task
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except Exception as exc:  # a client-side bug must not lose what was measured
            state.stop_reason = "client_error"
            state.message = Redactor(target.secrets)(
                f"the benchmark client failed: {type(exc).__name__}: {exc}"
            )
        finally:
            progress.stop()
            for h in helpers:
                await stop_task(h)
            if watch is not None:
                await asyncio.shield(watch.finish())
        if live_server is not None:
            live_server.shutdown()
        setup = _client_setup(runner, http)
    if state.end_s is None:
        state.end_s = time.perf_counter() - state.t0
    outcome = _outcome(opts, target, slos, state, started_unix, interrupted, watch, run_id)
    if worker_cpu:
        parent = outcome.client["cpu_s"]
        outcome.client = _cpu_figures(parent + sum(worker_cpu), state, receive_stamps(opts, target.base_url))
        # Where it went: the parent only waits while the workers measure (tokwatch.bench.workers).
        outcome.client["cpu_s_parent"], outcome.client["cpu_s_workers"] = parent, list(worker_cpu)
    outcome.client.update(setup)
    write_run(outcome, out_dir, plots_enabled=opts.plots)
    return outcome, out_dir


def _outcome(
    opts: BenchOptions,
    target: Target,
    slos: list[Any],
    state: RunState,
    started_unix: float,
    interrupted: bool,
    watch: ServerWatch | None,
    run_id: str,
) -> BenchOutcome:
    wall = state.end_s if state.end_s is not None else time.perf_counter() - state.t0
    reason = "interrupted" if interrupted else (state.stop_reason or "finished")
    message = state.message
    if interrupted:
        message = "interrupted: in-flight requests were cancelled and are not counted"
    outcome = BenchOutcome(
        options=echo_options(opts, target),
        records=state.records,
        started_at_unix=started_unix,
        wall_s=wall,
        complete=not interrupted and state.stop_reason is None,
        stop_reason=reason,
        message=message,
        slos=slos,
        requested_rate=opts.rate,
        server=watch.figures() if watch else {},
        metrics_before=watch.before_text if watch else None,
        metrics_after=watch.after_text if watch else None,
        perf_t0=state.t0,
        max_error_rate=opts.max_error_rate,
        run_id=run_id,
    )
    cpu = time.process_time() - state.cpu_start
    outcome.client = _cpu_figures(cpu, state, receive_stamps(opts, target.base_url))
    outcome.measure_start_s = state.measure_start
    return outcome


def _cpu_figures(cpu: float, state: RunState, stamps: str) -> dict[str, Any]:
    """The client's own CPU seconds (all its processes), per request and per token, and how it stamped."""
    tokens = sum(r.generated_tokens for r in state.records)
    return {
        "cpu_s": cpu,
        "cpu_per_request_s": cpu / len(state.records) if state.records else None,
        "event_loop": loop_name(asyncio.get_running_loop()),
        "receive_stamps": stamps,
        "cpu_per_token_s": cpu / tokens if tokens else None,
    }


def _client_setup(runner: BenchRunner, http: HttpClient) -> dict[str, Any]:
    """What ran beside the requests to keep the stamps honest (summary.json `client`; docs/bench.md)."""
    watcher = http.watcher
    return {
        "stall_heartbeat_s": runner.stalls.period_s,
        "send_timer": _send_timer(runner),
        "receive_watcher_nice": watcher.nice if watcher is not None else None,
        # the watcher's stamps are bounded by a heartbeat thread of their own (methodology "Disturbance")
        "watcher_heartbeat_s": runner.stamps.watcher.period_s if runner.stamps.watcher is not None else None,
        "gc_freeze_every_s": FREEZE_EVERY_S,
    }


def _send_timer(runner: BenchRunner) -> str | None:
    """What paced the open loop's sends (methodology "Arrivals"); with --workers the workers' platform's."""
    if runner.send_timer is not None:
        return runner.send_timer
    if runner.options.rate is None:
        return None
    return "timerfd" if precise_timer.available() else "event_loop"


async def _run_in_workers(
    opts: BenchOptions,
    state: RunState,
    n: int,
    on_progress: Callable[[LiveTotals], None],
    worker_cpu: list[float],
    start_perf: float | None,
) -> None:
    """The run spread over n processes; the first worker that stopped early gives the stop reason."""
    try:
        done = await run_workers(opts, state, n, on_progress, start_perf=start_perf)
    finally:
        state.end_s = time.perf_counter() - state.t0
    worker_cpu.extend(d.cpu_s for d in sorted(done, key=lambda d: d.index))
    if len(done) < n:
        state.stop_reason, state.message = "worker_failed", f"{n - len(done)} worker process(es) died"
    for d in sorted(done, key=lambda d: d.index):
        if d.stop_reason is not None and state.stop_reason is None:
            state.stop_reason, state.message = d.stop_reason, d.message


async def _live_lines(stats: LiveStats, console: Console, interval: float) -> None:
    """Print seed 002's periodic line every `interval` seconds."""
    while True:
        await asyncio.sleep(interval)
        console.print(stats.line(), highlight=False)
