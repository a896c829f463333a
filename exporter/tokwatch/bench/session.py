"""One whole benchmark session: plan the run (`plan.py`), run it with the live view, write every output."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from tokwatch.bench.client import Target
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.costing import BenchPricing, bench_pricing
from tokwatch.bench.live import LiveStats, make_progress, serve_live_metrics
from tokwatch.bench.outcome import BenchOutcome
from tokwatch.bench.outputs import default_output_dir, write_run
from tokwatch.bench.plan import Resolved, build_workload, local_options, resolve_target
from tokwatch.bench.power_watch import PowerSourceError, PowerWatch, power_url
from tokwatch.bench.prompt_salt import run_salt
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.runner import BenchRunner, RequestSource, RunState
from tokwatch.bench.server_watch import ServerWatch, stop_task, watch_during
from tokwatch.bench.slo import Slo
from tokwatch.bench.stamping import bench_http_client, receive_stamps
from tokwatch.bench.wallclock import check_start, perf_at, wall_minus_perf
from tokwatch.bench.workers import LiveTotals, effective_workers, run_workers
from tokwatch.bench.workload import Conversation, RequestSpec
from tokwatch.settings.redact import Redactor
from tokwatch.settings.setting_values import parse_listen
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport import precise_timer
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import FREEZE_EVERY_S, loop_name


def echo_options(opts: BenchOptions, target: Target) -> dict[str, Any]:
    """Options for summary.json: no secret, the target's URL without credentials."""
    redact = target.redactor
    data = {k: redact(v) if isinstance(v, str) else v for k, v in opts.model_dump(mode="json").items()}
    data["slos"] = [s.name for s in opts.parsed_slos()]
    data.update(
        target=redact(target.base_url),
        kind=target.kind,
        model=target.model,
        load=opts.load_description(),
    )
    return data


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the run is, settled before anything is sent."""

    opts: BenchOptions  # with the run id and its prompt salt
    run_id: str
    resolved: Resolved
    slos: list[Slo]
    requests: RequestSource | None
    conversations: Sequence[Conversation] | None
    out_dir: Path
    pricing: BenchPricing | None = None  # the prices the run is costed at (tokwatch.bench.costing)
    power_url: str | None = None  # where the devices' power is read (tokwatch.bench.power_watch)

    @property
    def target(self) -> Target:
        """The endpoint the requests go to."""
        return self.resolved.target


@dataclass(frozen=True, slots=True)
class _Measured:
    """What the requests left behind, once they have stopped."""

    state: RunState
    started_unix: float  # the wall-clock instant of the run's t0
    interrupted: bool
    watch: ServerWatch | None
    worker_cpu: list[float]  # CPU seconds of each --workers process, in worker order
    setup: dict[str, Any]  # what ran beside the requests (_client_setup)
    power: PowerWatch | None = None  # the devices' power around the run (--power-metrics-url)
    monotonic_minus_perf: float = 0.0  # time.monotonic() - time.perf_counter(): the power trace's clock


class _LiveView:
    """The progress bar, the periodic live line and the optional live /metrics server, fed by the run."""

    def __init__(self, console: Console, plan: _Plan) -> None:
        self.stats = LiveStats()
        self._console = console
        self._interval = plan.opts.live_interval
        self._line: Callable[[], str] | None = self.stats.line
        evaluator = plan.opts.performance
        if evaluator is not None:  # seed 002's evaluator: its own line, only with stream_metrics
            self._interval = evaluator.stream_metrics_interval
            self._line = self.stats.seed_line if evaluator.stream_metrics else None
        self.progress = make_progress(console)
        total = plan.opts.effective_number if plan.conversations is None else None
        self._task_id = self.progress.add_task("bench", total=total, status="")
        self._server = None
        if plan.opts.listen:
            host, port = parse_listen(plan.opts.listen)
            self._server, _ = serve_live_metrics(self.stats, host, port)

    def on_start(self, _r: RequestRecord) -> None:
        """A request was sent (in this process)."""
        self.stats.in_flight += 1

    def on_record(self, r: RequestRecord) -> None:
        """A request finished (in this process)."""
        self.stats.in_flight = max(0, self.stats.in_flight - 1)
        self.stats.add(r)
        if not r.warmup:
            errors = self.stats.completed - self.stats.by_status.get("ok", 0)
            self.progress.update(self._task_id, advance=1, status=f"errors {errors}")

    def on_progress(self, totals: LiveTotals) -> None:
        """The --workers processes' running counts."""
        self.stats.absorb(totals.by_status, totals.in_flight, totals.tokens)
        errors = totals.completed - totals.by_status.get("ok", 0)
        self.progress.update(self._task_id, completed=totals.completed, status=f"errors {errors}")

    def live_lines(self, t0: float) -> asyncio.Task[None]:
        """Print the live line every --live-interval from the run's t0 on, until the task is stopped."""
        self.stats.started = t0
        if self._line is None:
            return asyncio.create_task(asyncio.sleep(0), name="bench-live")  # stream_metrics: false
        return asyncio.create_task(_live_lines(self._line, self._console, self._interval), name="bench-live")

    def close(self) -> None:
        """Stop the live /metrics server."""
        if self._server is not None:
            self._server.shutdown()


async def run_bench(
    opts: BenchOptions,
    *,
    console: Console | None = None,
    out_dir: Path | None = None,
    requests: list[RequestSpec] | None = None,
) -> tuple[BenchOutcome, Path]:
    """Run the benchmark and write its directory; a cancelled run still writes, marked incomplete.

    `requests`: the requests to send instead of the options' workload (request i has request_id i), e.g.
    the items of an accuracy task (tokwatch.bench.lmeval_run). Raises ConfigError/WorkloadError/SloError
    before anything is sent when an input is bad.
    """
    console = console or Console(stderr=True)
    plan = _plan(opts, out_dir, requests)
    view = _LiveView(console, plan)
    async with bench_http_client(plan.opts) as http:
        measured = await _measure(plan, view, http)
    outcome = _outcome(plan, measured)
    write_run(outcome, plan.out_dir, plots_enabled=plan.opts.plots)
    return outcome, plan.out_dir


def _plan(opts: BenchOptions, out_dir: Path | None, given: list[RequestSpec] | None = None) -> _Plan:
    """The run's id, target, SLOs, workload and directory; raises on bad input before anything is sent."""
    # One id from the start: every --workers process (and every --segment process) runs under it, and its
    # prompt salt is the run's, so all of them build the one run's prompts.
    run_id = opts.run_id or uuid.uuid4().hex
    opts = opts.model_copy(update={"run_id": run_id, "prompt_salt": run_salt(run_id, opts.repeat_prompts)})
    resolved = resolve_target(opts)
    slos = opts.parsed_slos()
    requests: RequestSource | None
    requests, conversations = (given, None) if given is not None else build_workload(opts)
    model = resolved.target.model
    out_dir = out_dir or (Path(opts.output_dir) if opts.output_dir else default_output_dir(model))
    pricing = bench_pricing(opts, model)
    return _Plan(opts, run_id, resolved, slos, requests, conversations, out_dir, pricing, power_url(opts))


async def _measure(plan: _Plan, view: _LiveView, http: HttpClient) -> _Measured:
    """Send the run's requests, here or in --workers processes, with the live view and the server's counters
    around them; returns once every request has stopped."""
    opts, target = plan.opts, plan.target
    power = await _power_before_load(plan.power_url, opts, target.redactor)
    watch: ServerWatch | None = None
    if opts.server_metrics and target.metrics_url:
        url, headers = target.metrics_request(target.metrics_url)
        watch = ServerWatch(
            http, url, target.kind, target.model, plan.resolved.mirror_metrics,
            headers=headers, redact=target.redactor, reach=target.reach,
        )  # fmt: skip
        await watch.start()
    n_workers = effective_workers(opts)
    # Start-up objects (modules, options, workload) out of the collector's view: a full collection
    # stops the loop that stamps every stream, for tens of ms with all of them in view.
    gc.collect()
    gc.freeze()
    segment = opts.segment_part
    # --start-at: the measured phase starts at that wall-clock instant (after the warm-up).
    start_perf = perf_at(opts.start_at) if opts.start_at is not None else None
    runner = BenchRunner(
        local_options(opts, segment),
        target,
        http,
        requests=plan.requests,
        conversations=plan.conversations,
        on_record=view.on_record,
        on_start=view.on_start,
        segment=segment,
        sync_start=partial(_common_start, start_perf) if start_perf is not None else None,
    )
    state = runner.state
    # The wall-clock instant of t0 itself: stored send times (`started_at_unix` + `sent_at_s`) of split
    # runs are compared across machines, so not the time.time() of an earlier line.
    started_unix = state.t0 + wall_minus_perf()
    helpers = [view.live_lines(state.t0)]
    if watch is not None:
        helpers.append(await watch_during(watch))
    worker_cpu: list[float] = []
    run: Coroutine[Any, Any, object] = (
        runner.run()
        if n_workers == 1
        else _run_in_workers(opts, state, n_workers, view.on_progress, worker_cpu, start_perf)
    )
    run_task = asyncio.create_task(run, name="bench-run")
    view.progress.start()
    try:
        interrupted = await _until_stopped(run_task, state, target.redactor)
    finally:
        view.progress.stop()
        for h in helpers:
            await stop_task(h)
        if watch is not None:
            await asyncio.shield(watch.finish())
        if power is not None:
            await asyncio.shield(power.finish())
    view.close()
    return _Measured(
        state, started_unix, interrupted, watch, worker_cpu, _client_setup(runner, http),
        power, time.monotonic() - time.perf_counter(),
    )  # fmt: skip


async def _power_before_load(url: str | None, opts: BenchOptions, redact: Redactor) -> PowerWatch | None:
    """With a power URL: start sampling the devices' power and measure their idle baseline, before any
    request is sent; a URL that gives no power reading is a usage error."""
    if url is None:
        return None
    power = PowerWatch(url, opts.power_interval, opts.idle_baseline, shown_url=redact(url))
    try:
        await power.start()
    except PowerSourceError as exc:
        raise ConfigError(str(exc)) from None
    except BaseException:  # interrupted during the idle baseline: stop the sampler, close its connection
        await asyncio.shield(power.finish())
        raise
    return power


async def _common_start(start_perf: float) -> float:
    """The measured phase's common start (--start-at), or StartMissed when this process is too late for it."""
    return check_start(start_perf)


async def _until_stopped(run_task: asyncio.Task[object], state: RunState, redact: Redactor) -> bool:
    """Wait for the run; True when it was interrupted (Ctrl-C or a cancelled caller). Either way, and when the
    client itself fails (`client_error`), what was measured is kept."""
    try:
        await asyncio.shield(run_task)
    except asyncio.CancelledError:
        # Stop the requests, keep what was measured.
        run_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run_task
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        return True
    except Exception as exc:  # a client-side bug must not lose what was measured
        state.stop_reason = "client_error"
        state.message = redact(f"the benchmark client failed: {type(exc).__name__}: {exc}")
    return False


def _outcome(plan: _Plan, measured: _Measured) -> BenchOutcome:
    """The run's outcome from what it measured, with the client's own figures."""
    opts, target, state, interrupted = plan.opts, plan.target, measured.state, measured.interrupted
    if state.end_s is None:
        state.end_s = time.perf_counter() - state.t0
    reason = "interrupted" if interrupted else (state.stop_reason or "finished")
    message = state.message
    if interrupted:
        message = "interrupted: in-flight requests were cancelled and are not counted"
    watch = measured.watch
    outcome = BenchOutcome(
        options=echo_options(opts, target),
        records=state.records,
        started_at_unix=measured.started_unix,
        wall_s=state.end_s,
        complete=not interrupted and state.stop_reason is None,
        stop_reason=reason,
        message=message,
        slos=plan.slos,
        requested_rate=opts.rate,
        server=watch.figures() if watch else {},
        metrics_before=watch.before_text if watch else None,
        metrics_after=watch.after_text if watch else None,
        perf_t0=state.t0,
        max_error_rate=opts.max_error_rate,
        run_id=plan.run_id,
    )
    outcome.client = _client_figures(measured, receive_stamps(opts, target.base_url))
    outcome.measure_start_s = state.measure_start
    outcome.pricing = plan.pricing
    if measured.power is not None:
        # The whole run, warm-up included: its requests' output tokens are in the figure's denominator.
        start = state.t0 + measured.monotonic_minus_perf
        outcome.energy = measured.power.measure(start, start + state.end_s)
    return outcome


def _client_figures(measured: _Measured, stamps: str) -> dict[str, Any]:
    """summary.json `client`: the CPU of every process of the run, and what ran beside the requests."""
    parent = time.process_time() - measured.state.cpu_start
    figures = _cpu_figures(parent + sum(measured.worker_cpu), measured.state, stamps)
    if measured.worker_cpu:
        # Where it went: the parent only waits while the workers measure (tokwatch.bench.workers).
        figures["cpu_s_parent"], figures["cpu_s_workers"] = parent, list(measured.worker_cpu)
    return {**figures, **measured.setup}


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


async def _live_lines(line: Callable[[], str], console: Console, interval: float) -> None:
    """Print the periodic live line every `interval` seconds."""
    while True:
        await asyncio.sleep(interval)
        console.print(line(), highlight=False)
