"""The load generator: closed loop, open loop (absolute-time arrivals), multi-turn conversations.

Latency starts at the actual send. Before it, an open-loop request may be late against its planned
arrival (scheduling lag: the client could not keep pace) and may wait for a `max_concurrency` slot
(queue time); both are recorded separately. Stopping: `number` and/or `duration` stop new sends and let
in-flight requests finish (soft exit): for conversations, no new conversation starts after the deadline but
those in flight run all their remaining turns (seed 003); with `drain_timeout`, requests still running that
long after the duration are abandoned and count as failed. A server that answers nothing for
`unresponsive_timeout` while requests wait stops the run (`unresponsive`), its requests in flight abandoned.
Cancellation (Ctrl-C) cancels in-flight requests, which are dropped, and the run is returned incomplete.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from tokwatch.bench.arrivals import arrival_offsets, sleep_until
from tokwatch.bench.client import Deadlines, Target, execute
from tokwatch.bench.config import BenchOptions
from tokwatch.bench.prompt_salt import SaltedPrompts
from tokwatch.bench.reasoning import apply_think_budget
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.segments import WHOLE, Segment, spec_at
from tokwatch.bench.stop_policy import Silence, check_period
from tokwatch.bench.wallclock import StartMissed
from tokwatch.bench.workload import Conversation, Message, RequestSpec, SyntheticWorkload, Turn
from tokwatch.figures.result import Status
from tokwatch.figures.tokens import count_messages, token_counter
from tokwatch.tracing.deferred import DeferredSpans
from tokwatch.tracing.spans import Peer
from tokwatch.transport.event_wait import wait_event
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import (
    StallMonitor,
    StampLateness,
    ThreadHeartbeat,
    collector_out_of_the_way,
)
from tokwatch.transport.precise_timer import PreciseTimer

RequestSource = SyntheticWorkload | SaltedPrompts | list[RequestSpec]
OnRecord = Callable[[RequestRecord], None]
_IMMEDIATE_STOP = frozenset({Status.AUTH_FAILURE, Status.UNREACHABLE})
# Pause after a connection error, doubling per consecutive one (closed loops; an open loop keeps its clock).
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0
# Why the run stopped waiting for requests in flight (their error_class) and what their message says.
ABANDONED = {
    "unresponsive": "abandoned: the server answered nothing for --unresponsive-timeout",
    "drain_timeout": "abandoned: still running --drain-timeout after the measured duration ended",
}


class _Stop(Exception):
    """Raised inside the runner to end dispatch early (fail-fast)."""


@dataclass
class RunState:
    """What the runner has done so far; read by the live view and by the outcome builder."""

    t0: float = field(default_factory=time.perf_counter)
    records: list[RequestRecord] = field(default_factory=list)
    measure_start: float | None = None  # seconds since t0 when the measured phase began
    end_s: float | None = None
    in_flight: int = 0
    stop_reason: str | None = None  # set when the run ended early
    message: str | None = None
    seen_ok: bool = False
    failures_without_ok: int = 0
    consecutive_failures: int = 0
    cpu_start: float = field(default_factory=time.process_time)


class BenchRunner:
    """Runs one benchmark against one target; `run()` is the whole run."""

    def __init__(
        self,
        options: BenchOptions,
        target: Target,
        http: HttpClient,
        *,
        requests: RequestSource | None = None,
        conversations: Sequence[Conversation] | None = None,
        on_record: OnRecord | None = None,
        on_start: OnRecord | None = None,
        t0: float | None = None,
        segment: Segment = WHOLE,
        sync_start: Callable[[], Awaitable[float]] | None = None,
    ) -> None:
        if (requests is None) == (conversations is None):
            raise ValueError("give either requests or conversations")
        self.options = options
        self.target = target
        self.http = http
        self.state = RunState() if t0 is None else RunState(t0=t0)
        # Segment k of n of the one schedule (--workers, --segment; tokwatch.bench.segments): its share of
        # the warm-up, of --number and of the arrivals, with the schedule's own ids and request contents.
        # `sync_start` returns the common measured-phase start (absolute perf_counter).
        self._segment = segment
        self._sync_start = sync_start
        self._requests = requests
        self._conversations = conversations
        self._on_record = on_record
        self._on_start = on_start
        self._redactor = target.redactor
        self._deadlines = Deadlines(
            options.fluidity_prefill_deadline, options.fluidity_decode_deadline, options.fluidity_mode
        )
        self._ids = segment.indices()  # warm-up requests and conversation turns
        self._measured_ids = segment.indices(options.warmup)  # closed loop: after the whole warm-up's ids
        self._counter = token_counter(options.tokenizer)
        self._stopping = asyncio.Event()
        self._backoff_s = 0.0  # current pause after connection errors; 0 after a success
        self._resume_at = 0.0  # perf_counter time before which closed-loop workers do not send
        self._sleeper: asyncio.Future[None] | None = None  # the open loop waiting for its next send time
        # The open loop's send instants, to the microsecond where the platform allows
        # (tokwatch.transport.precise_timer)
        self._precise: PreciseTimer | None = None
        self.send_timer: str | None = None  # what paced the open loop: "timerfd" or "event_loop"
        self.silence = Silence(time.perf_counter())
        self._abandon: str | None = None  # set when the run gives up on its requests in flight (ABANDONED)
        # The client's own lateness per request (docs/methodology.md, "Disturbance"), as in the exporter: the
        # loop's heartbeat, and with a receive watcher a thread's, since the watcher stamps off the loop.
        self.stalls = StallMonitor()
        self.stamps = StampLateness(self.stalls, ThreadHeartbeat() if http.watcher is not None else None)
        self._traces = _deferred_spans(options, target)  # --otlp-endpoint: spans built after the run

    # --- helpers -------------------------------------------------------------------------------------

    def _now_s(self) -> float:
        return time.perf_counter() - self.state.t0

    def _spec(self, index: int) -> RequestSpec:
        """Request `index` of the one schedule (warm-up first, then the measured requests)."""
        assert self._requests is not None
        return spec_at(self._requests, index)

    def _new_record(
        self, spec: RequestSpec | None, warmup: bool, category: str = "dataset", request_id: int | None = None
    ) -> RequestRecord:
        record = RequestRecord(
            request_id=next(self._ids) if request_id is None else request_id,
            category=spec.category if spec else category,
            warmup=warmup,
            prompt_tokens_target=spec.prompt_tokens_target if spec else None,
            max_tokens=spec.max_tokens if spec else None,
            # Claimed only where ignore_eos/min_tokens is actually sent, so the output-length health check
            # never blames a server that was not asked for a fixed length.
            fixed_output=self._fixed(bool(spec and spec.fixed_output)),
        )
        if spec is not None and spec.think_budget is not None:
            apply_think_budget(record, self.target.dialect, spec.think_budget)
        return record

    def _fixed(self, wanted: bool) -> bool:
        return wanted and self.target.dialect.fixed_length

    async def _send(
        self, record: RequestRecord, messages: tuple[Message, ...] | list[Message]
    ) -> RequestRecord:
        state = self.state
        state.in_flight += 1
        self.silence.sent(time.perf_counter())
        if self._on_start is not None:
            self._on_start(record)
        trace = self._traces.start() if self._traces is not None else None
        try:
            await execute(
                self.http,
                self.target,
                messages,
                record,
                run_t0=state.t0,
                deadlines=self._deadlines,
                redactor=self._redactor,
                stalls=self.stamps,
                on_answer=self.silence.answered,
                trace=trace,
            )
        except asyncio.CancelledError:
            if self._abandon is not None:  # the run gave up waiting for it: a failure, not a lost request
                self._record_abandoned(record, self._abandon)
            raise
        finally:
            if trace is not None and self._traces is not None:
                self._traces.finished(trace, record)
            state.in_flight -= 1
            self.silence.finished(record.http_status is not None)
        if record.prompt_tokens is None and record.ok:
            record.prompt_tokens = count_messages(messages, self._counter)  # the server reported none
        record.processed_at_s = self._now_s()  # its figures are computed (seed 002's result_processed_at)
        state.records.append(record)
        if self._on_record is not None:
            self._on_record(record)
        self._judge(record)
        return record

    def _judge(self, record: RequestRecord) -> None:
        """Fail fast when the target cannot work at all, stops working, or ignores max_tokens."""
        state = self.state
        if record.ok:
            state.seen_ok = True
            state.consecutive_failures = 0
            self._backoff_s = 0.0
            return
        if record.error_class == "max_tokens_ignored":
            self._stop("max_tokens_ignored", f"the server ignores max_tokens: {record.error_message}")
            return
        state.consecutive_failures += 1
        if record.status is Status.UNREACHABLE:
            # A dead server refuses in microseconds: without a pause the loop becomes a request storm.
            self._backoff_s = min(max(2 * self._backoff_s, BACKOFF_MIN_S), BACKOFF_MAX_S)
            self._resume_at = time.perf_counter() + self._backoff_s
        last = f"last: {record.status.value} ({record.error_class}): {record.error_message}"
        if not state.seen_ok:
            state.failures_without_ok += 1
            if record.status in _IMMEDIATE_STOP or state.failures_without_ok >= self.options.fail_fast:
                reason = record.status.value if record.status in _IMMEDIATE_STOP else "all_failed"
                self._stop(reason, f"no request succeeded ({state.failures_without_ok} failed); {last}")
            return
        if state.consecutive_failures >= self.options.max_consecutive_failures:
            self._stop(
                "failing",
                f"{state.consecutive_failures} requests in a row failed after earlier successes; {last}",
            )

    def _record_abandoned(self, record: RequestRecord, why: str) -> None:
        record.status = Status.TIMEOUT
        record.error_class = why
        record.error_message = ABANDONED[why]
        record.completed_at_s = record.processed_at_s = self._now_s()
        self.state.records.append(record)
        if self._on_record is not None:
            self._on_record(record)

    async def _paused(self) -> None:
        """Wait out the back-off after connection errors (at once when the run is stopped)."""
        delay = self._resume_at - time.perf_counter()
        if delay > 0 and not self._stopping.is_set():
            await self._pause(delay)

    def _stop(self, reason: str, message: str) -> None:
        if self.state.stop_reason is None:
            self.state.stop_reason = reason
            self.state.message = message
        self._stopping.set()
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)
        if self._precise is not None:
            self._precise.wake()

    async def _until(self, deadline: float) -> None:
        """Wait for the planned instant `deadline` (perf_counter), but wake at once when the run is stopped.

        One future and one timer per request (not two tasks and a wait): the open loop pays this per request.
        The timer is the run's timerfd where there is one (the loops' own timers have a millisecond grain;
        uvloop's spin below half a millisecond); the remaining time is recomputed from the clock each pass.
        Behind schedule it still yields once: a backlog of sends dispatched without a break would hold off
        every read, and its stamp, until it is cleared."""
        loop = asyncio.get_running_loop()
        if deadline <= time.perf_counter():
            await asyncio.sleep(0)
            return
        while (remaining := deadline - time.perf_counter()) > 0 and not self._stopping.is_set():
            if self._precise is not None:
                await self._precise.until(deadline)
                continue
            self._sleeper = waiter = loop.create_future()
            timer = loop.call_later(remaining, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._sleeper = None

    def _budget(self) -> tuple[int | None, float | None]:
        """(this segment's measured requests or conversations, measured duration end in s since t0)."""
        number = self.options.effective_number
        if number is not None:
            number = self._segment.share(number)
        start = self.state.measure_start or 0.0
        end = start + self.options.duration if self.options.duration is not None else None
        return number, end

    def _may_send(self, sent: int) -> bool:
        number, end = self._budget()
        if self._stopping.is_set():
            return False
        if number is not None and sent >= number:
            return False
        return not (end is not None and self._now_s() >= end)

    # --- phases --------------------------------------------------------------------------------------

    async def run(self) -> RunState:
        """Warm-up, then the measured phase; returns the state (records, stop reason). With
        --otlp-endpoint, the requests' spans are built and sent once it is over."""
        try:
            return await self._run_watched()
        finally:
            if self._traces is not None:
                self._traces.export(self.state.t0)

    async def _run_watched(self) -> RunState:
        with self.stamps.watching(), collector_out_of_the_way():
            work = asyncio.create_task(self._run(), name="bench-phases")
            watchdog = asyncio.create_task(self._watchdog(work), name="bench-watchdog")
            try:
                await asyncio.wait({work})
            except asyncio.CancelledError:  # the caller's (Ctrl-C): requests in flight are dropped
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                raise
            finally:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            if work.cancelled():  # the watchdog gave up on requests in flight; they are recorded
                return self.state
            return work.result()

    async def _watchdog(self, work: asyncio.Task[RunState]) -> None:
        """Stop the run when the server went silent; abandon requests still running past the drain limit."""
        limit = self.options.unresponsive_timeout
        while not work.done():
            await asyncio.sleep(check_period(limit))
            now = time.perf_counter()
            quiet = self.silence.silent_for(now)
            if quiet >= limit:
                self._stop(
                    "unresponsive",
                    f"the server answered nothing for {quiet:.1f} s while requests waited "
                    f"(--unresponsive-timeout {limit:g}s); requests in flight were abandoned (failed)",
                )
                self._give_up("unresponsive", work)
                return
            drain_end = self._drain_end()
            if drain_end is not None and now - self.state.t0 >= drain_end:
                self._give_up("drain_timeout", work)
                return

    def _drain_end(self) -> float | None:
        """Seconds since t0 after which requests still in flight are abandoned (with drain_timeout)."""
        _, end = self._budget()
        if end is None or self.options.drain_timeout is None or self.state.measure_start is None:
            return None
        return end + self.options.drain_timeout

    def _give_up(self, why: str, work: asyncio.Task[RunState]) -> None:
        self._abandon = why
        self._stopping.set()
        work.cancel()

    async def _run(self) -> RunState:
        try:
            if self.options.warmup:
                await self._warmup()
            if self._sync_start is not None:
                try:
                    self.state.measure_start = await self._sync_start() - self.state.t0
                except StartMissed as exc:
                    self._stop("late_start", str(exc))
                    self.state.measure_start = self._now_s()
                await sleep_until(self.state.t0 + self.state.measure_start)
            else:
                self.state.measure_start = self._now_s()
            if not self._stopping.is_set():
                if self._conversations is not None:
                    await self._closed_conversations()
                elif self.options.rate is not None:
                    await self._open_loop()
                else:
                    await self._closed_loop()
        finally:
            self.state.end_s = self._now_s()
        return self.state

    async def _warmup(self) -> None:
        n = self._segment.share(self.options.warmup)
        workers = min(n, self.options.closed_loop_workers)
        counter = itertools.count()

        async def worker() -> None:
            while next(counter) < n and not self._stopping.is_set():
                if self._conversations is not None:
                    # The last one (of an endless sequence, one no run reaches): the warm-up must not put
                    # the first measured turn into the server's prefix cache.
                    conv = self._conversations[len(self._conversations) - 1]
                    record = self._new_record(None, True, "dataset")
                    record.max_tokens = conv.turns[0].max_tokens
                    messages: tuple[Message, ...] = (
                        *_system(conv),
                        {"role": "user", "content": conv.turns[0].text},
                    )
                else:
                    index = next(self._ids)
                    spec = self._spec(index)
                    record, messages = self._new_record(spec, True, request_id=index), spec.messages
                record.dispatched_at_s = self._now_s()
                await self._send(record, messages)

        await asyncio.gather(*(worker() for _ in range(workers)))

    async def _closed_loop(self) -> None:
        sent = itertools.count()
        total = [0]

        async def worker() -> None:
            while self._may_send(total[0]):
                await self._paused()
                if not self._may_send(total[0]):
                    return
                total[0] = next(sent) + 1
                index = next(self._measured_ids)
                spec = self._spec(index)
                record = self._new_record(spec, False, request_id=index)
                record.dispatched_at_s = self._now_s()
                await self._send(record, spec.messages)

        await asyncio.gather(*(worker() for _ in range(self.options.closed_loop_workers)))

    async def _open_loop(self) -> None:
        opts = self.options
        assert opts.rate is not None
        slots = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
        tasks: set[asyncio.Task[RequestRecord]] = set()
        start_abs = self.state.t0 + (self.state.measure_start or 0.0)
        _, end = self._budget()
        number = opts.effective_number  # the whole schedule's: this segment takes its indices below it

        async def one(record: RequestRecord, spec: RequestSpec) -> RequestRecord:
            if slots is None:
                return await self._send(record, spec.messages)
            async with slots:
                return await self._send(record, spec.messages)

        self._precise = PreciseTimer.open()
        self.send_timer = "event_loop" if self._precise is None else "timerfd"
        try:
            schedule = arrival_offsets(opts.arrivals, opts.rate, opts.seed, opts.burstiness)
            for i, offset in self._segment.take(schedule):
                if number is not None and i >= number:
                    break
                intended = (self.state.measure_start or 0.0) + offset
                if end is not None and intended >= end:
                    break
                if self._stopping.is_set():
                    break
                # Built before the wait, so the send follows the planned instant without this work.
                spec = self._spec(opts.warmup + i)
                record = self._new_record(spec, False, request_id=opts.warmup + i)
                await self._until(start_abs + offset)
                if self._stopping.is_set():
                    break
                record.intended_at_s = intended
                record.dispatched_at_s = self._now_s()
                task = asyncio.create_task(one(record, spec))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            if self._precise is not None:
                self._precise.close()
                self._precise = None
            for t in tasks:
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _closed_conversations(self) -> None:
        convs = self._conversations
        assert convs
        number, _ = self._budget()
        started = itertools.count()
        k, n = self._segment.index, self._segment.count  # conversations k, k+n, ...: never two segments

        async def worker() -> None:
            while True:
                # The deadline only stops new conversations: one in flight runs all its turns (seed 003).
                if not self._may_send(0):
                    return
                i = next(started)
                if number is not None and i >= number:
                    return
                await self._paused()
                index = i * n + k
                await self._conversation(convs[index % len(convs)], index)

        await asyncio.gather(*(worker() for _ in range(self.options.closed_loop_workers)))

    async def _conversation(self, conv: Conversation, run_index: int) -> None:
        """Seed 003: each turn sends the whole history with the model's real replies; a failure ends it.

        `history_tokens` of turn n is what turn n-1 already sent plus its reply (prompt and output tokens,
        server-counted when reported): the prefix a server's cache could hold."""
        history: list[Message] = list(_system(conv))
        history_tokens = 0
        wait_before: float | None = None
        last = len(conv.turns) - 1
        for index, turn in enumerate(conv.turns):
            if self._stopping.is_set():
                return
            history.append({"role": "user", "content": turn.text})
            record = self._turn_record(conv, turn, index, run_index, history_tokens)
            record.wait_before_s = wait_before
            record.dispatched_at_s = self._now_s()
            await self._send(record, list(history))
            if not record.ok:
                return
            history.append({"role": "assistant", "content": record.reply_text})
            # Server-counted where reported (the units of cached_tokens), else the client's counts.
            reply = record.output_tokens
            if reply is None:
                reply = self._counter.count(record.reply_text)
            history_tokens = (record.prompt_tokens or record.prompt_tokens_target or 0) + reply
            wait_before = turn.wait_s if turn.wait_s > 0 and index < last else None
            if wait_before is not None:
                await self._pause(wait_before)

    def _turn_record(
        self, conv: Conversation, turn: Turn, index: int, run_index: int, history_tokens: int
    ) -> RequestRecord:
        record = self._new_record(None, False)
        record.conversation_id = run_index
        record.turn = index
        record.turns = index + 1
        record.conversation_turns = len(conv.turns)
        record.max_tokens = turn.max_tokens
        record.fixed_output = self._fixed(turn.fixed_output)
        record.history_tokens = history_tokens
        new = turn.tokens if turn.tokens is not None else self._counter.count(turn.text)
        before = history_tokens if index else count_messages(_system(conv), self._counter)
        record.prompt_tokens_target = before + new
        return record

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds` (a back-off, a trace's wait before the next turn); ends early when stopped."""
        await wait_event(self._stopping, seconds)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _system(conv: Conversation) -> tuple[Message, ...]:
    return ({"role": "system", "content": conv.system},) if conv.system else ()


def _deferred_spans(options: BenchOptions, target: Target) -> DeferredSpans | None:
    """The run's request spans when `otlp_endpoint` asks for them (docs/tracing.md)."""
    if options.otlp_endpoint is None:
        return None
    return DeferredSpans(options.otlp_endpoint, "tokwatch-bench", Peer(target.kind, target.model, target.url))
