"""Measurement isolation: probes run on their own event loop in their own thread, watched for stalls.

Token arrival is stamped in the connection's `data_received`, which runs only when the loop that owns the
socket gets to it. On the exporter's main loop that could wait behind anything else the exporter does
(rendering /metrics, parsing server counters, store writes, reloads). Here the probes' sockets belong to a
loop that does nothing but probing, so that work can delay a stamp only by the time the measurement thread
waits for the interpreter lock, which `MeasurementLoop` bounds by lowering the switch interval. What is left
(another probe's parsing, CPU starvation, a lock held by a long C call) is caught by `StallMonitor`: a
heartbeat that records how late the loop ran, so a run whose timing could have been disturbed is flagged.
See docs/methodology.md, "Measurement isolation" and "Disturbance".
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# How long the measurement thread can wait for the interpreter lock while another thread runs Python code.
# The default (5 ms) would be as large as the stalls we flag; the cost of a shorter one is paid only while
# two threads compete for the lock.
SWITCH_INTERVAL_S = 0.0005


class StallMonitor:
    """A heartbeat on one event loop: every `period_s` it records how late it woke (a stall).

    Runs only while something is being measured (`watching()`), so an idle exporter does not wake up
    500 times a second. Lateness at or below `floor_s` is the timer's own granularity and is not kept.
    """

    def __init__(self, period_s: float = 0.002, floor_s: float = 0.001, keep_s: float = 900.0) -> None:
        self.period_s = period_s
        self.floor_s = floor_s
        self.keep_s = keep_s
        self._ends: deque[float] = deque()  # perf_counter when each kept stall ended, ascending
        self._sizes: deque[float] = deque()
        self._users = 0
        self._timer: asyncio.TimerHandle | None = None
        self._planned = 0.0  # perf_counter when the armed beat is due
        self.beats = 0
        self.largest_s = 0.0  # largest stall ever seen (self-metric)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep the heartbeat running for the duration of the block (call on the monitored loop)."""
        self._users += 1
        if self._timer is None:
            self._arm(asyncio.get_running_loop(), time.perf_counter())
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        # A timer callback, not a task sleeping in a loop: a beat costs one timer, no future or task step.
        self._planned = now + self.period_s
        self._timer = loop.call_later(self.period_s, self._beat, loop)

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.perf_counter()
        self.beats += 1
        self.record(now, now - self._planned)
        self._arm(loop, now)

    def record(self, ended_at: float, late_s: float) -> None:
        """Keep one observed lateness (ended at `ended_at`, perf_counter seconds) if above the floor."""
        if late_s <= self.floor_s:
            return
        self._ends.append(ended_at)
        self._sizes.append(late_s)
        self.largest_s = max(self.largest_s, late_s)
        horizon = ended_at - self.keep_s
        while self._ends and self._ends[0] < horizon:
            self._ends.popleft()
            self._sizes.popleft()

    def max_stall(self, start: float, end: float) -> float:
        """Largest stall overlapping [start, end] (perf_counter seconds), clipped to it; 0.0 when none.

        Only the part inside the window counts: a stall before the request left cannot delay its bytes.
        """
        i = bisect.bisect_left(self._ends, start)
        worst = 0.0
        for j in range(i, len(self._ends)):
            ended = self._ends[j]
            if ended - self.largest_s > end:
                break  # ends ascend: no later stall can have begun inside the window
            inside = min(ended, end) - max(ended - self._sizes[j], start)
            worst = max(worst, inside)
        return worst

    @property
    def catch_up_s(self) -> float:
        """How long after a stall's recorded end a read may still belong to its backlog: the heartbeat can
        run first in the loop iteration that ends a stall, and lateness under the floor goes unrecorded."""
        return self.period_s + self.floor_s

    def lateness(self, stamps: Sequence[float]) -> list[float]:
        """How late each stamp (perf_counter seconds) taken on this loop can be: 0 unless a stall covers it.

        A stamp taken during a stall, or within `catch_up_s` after it, waited at most since the beat before
        the stall (one period before its planned wake-up: the last time the loop was seen on time), as bytes
        that arrived before that were read then. Stalls with no on-time beat between them (the next one
        starting within `catch_up_s` of the last one's end) are one episode, timed from its first stall.
        Lateness the heartbeat cannot see (up to `catch_up_s`, the timer's granularity) is not counted
        (docs/methodology.md, "Disturbance").
        """
        out = [0.0] * len(stamps)
        if not stamps or not self._ends:
            return out
        episodes = self._episodes(min(stamps), max(stamps))
        if not episodes:
            return out  # the common case: nothing stalled near these stamps
        order = sorted(range(len(stamps)), key=stamps.__getitem__)
        k = 0
        for i in order:
            t = stamps[i]
            while k < len(episodes) and episodes[k][1] + self.catch_up_s < t:
                k += 1
            if k < len(episodes) and episodes[k][0] <= t:
                out[i] = t - episodes[k][0]
        return out

    def _episodes(self, first: float, last: float) -> list[tuple[float, float]]:
        """(start, end) of the stall episodes that can cover a stamp in [first, last], ascending."""
        gap = self.catch_up_s
        ends, sizes = self._ends, self._sizes
        j = bisect.bisect_left(ends, first - gap)
        while j > 0 and j < len(ends) and (ends[j] - sizes[j]) - ends[j - 1] <= gap:
            j -= 1  # the episode covering `first` began with an earlier stall
        episodes: list[tuple[float, float]] = []
        for k in range(j, len(ends)):
            start, end = ends[k] - sizes[k], ends[k]
            if start > last:
                break
            if episodes and start - episodes[-1][1] <= gap:
                episodes[-1] = (episodes[-1][0], end)
            else:
                episodes.append((start - self.period_s, end))
        return episodes


class ThreadHeartbeat:
    """A heartbeat in a thread of its own: how late a Python thread the kernel wakes gets to run (CPU
    starvation, the interpreter lock held elsewhere), which is the lateness of a stamp the receive watcher
    (tokwatch.transport.rxwatch) takes off the loop. Its records bound those stamps as `StallMonitor` bounds
    the loop's; it keeps the default priority, so it errs late where the watcher may have raised its own."""

    def __init__(self, period_s: float = 0.002, floor_s: float = 0.001, keep_s: float = 900.0) -> None:
        self._monitor = StallMonitor(period_s, floor_s, keep_s)
        self._lock = threading.Lock()  # the beat records from its thread; lateness is read from a loop's
        self._users = 0
        self._stop: threading.Event | None = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep the heartbeat thread running for the duration of the block (from any thread or loop)."""
        with self._lock:
            self._users += 1
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(
                    target=self._beat, args=(self._stop,), name="tokwatch-thread-heartbeat", daemon=True
                ).start()
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._stop is not None:
                    self._stop.set()
                    self._stop = None

    def _beat(self, stop: threading.Event) -> None:
        period = self._monitor.period_s
        while True:
            planned = time.perf_counter() + period
            if stop.wait(period):
                return
            now = time.perf_counter()
            with self._lock:
                self._monitor.beats += 1
                self._monitor.record(now, now - planned)

    @property
    def period_s(self) -> float:
        """The heartbeat's period (s)."""
        return self._monitor.period_s

    @property
    def beats(self) -> int:
        """Heartbeats so far (for tests and diagnostics)."""
        return self._monitor.beats

    def lateness(self, stamps: Sequence[float]) -> list[float]:
        """`StallMonitor.lateness` over this thread's records."""
        with self._lock:
            return self._monitor.lateness(stamps)


class StampLateness:
    """How late a client stamp can be. Stamps are taken on a loop (bounded by its `StallMonitor`) and, when a
    receive watcher runs, also off it: a read then keeps the earlier of the two stamps, so its lateness is at
    most the smaller of the two bounds (a loop stall delays the reading, not a watcher's stamp)."""

    def __init__(self, loop: StallMonitor, watcher: ThreadHeartbeat | None = None) -> None:
        self.loop = loop
        self.watcher = watcher

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Both heartbeats for the duration of the block (call on the monitored loop)."""
        with self.loop.watching(), self.watcher.watching() if self.watcher else contextlib.nullcontext():
            yield

    def lateness(self, stamps: Sequence[float], *, watched: bool = True) -> list[float]:
        """Per stamp (perf_counter seconds), the most it can be late; `watched=False` for a response the
        watcher did not stamp (HTTPS), which the loop's bound alone holds."""
        own = self.loop.lateness(stamps)
        if self.watcher is None or not watched:
            return own
        return [min(a, b) for a, b in zip(own, self.watcher.lateness(stamps), strict=True)]


# While a bench run measures: objects older than this are frozen out of the garbage collector's view, and the
# youngest generation is collected after this many new container objects instead of 700 (docs/methodology.md,
# "Measurement isolation").
FREEZE_EVERY_S = 1.0
YOUNG_COLLECTION_THRESHOLD = 10_000


@contextlib.contextmanager
def collector_out_of_the_way() -> Iterator[None]:
    """Keep the garbage collector's pauses short while the block runs on this event loop.

    A collection holds the interpreter lock for as long as it walks its objects, and every request a run
    keeps (its record and per-token lists) would be walked again by each full collection: tens of ms at a few
    thousand requests, during which no read is stamped, not even by the receive watcher. So every second the
    objects alive by then are frozen (`gc.freeze`, never walked again) and the youngest generation is
    collected less often; what a collection walks stays what the last second created. At the end everything
    is unfrozen (reference cycles frozen while still in use are collected after the run) and the thresholds
    restored."""
    loop = asyncio.get_running_loop()
    previous = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, previous[1], previous[2])
    gc.freeze()
    timer: asyncio.TimerHandle | None = None

    def freeze() -> None:
        nonlocal timer
        gc.freeze()
        timer = loop.call_later(FREEZE_EVERY_S, freeze)

    timer = loop.call_later(FREEZE_EVERY_S, freeze)
    try:
        yield
    finally:
        timer.cancel()
        gc.set_threshold(*previous)
        gc.unfreeze()


class MeasurementLoop:
    """A thread running its own asyncio loop for probes; coroutines are submitted from the main loop."""

    def __init__(self, name: str = "tokwatch-measure") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.monitor = StallMonitor()
        self._previous_switch: float | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The measurement loop while it runs (for callers that must schedule work on it)."""
        return self._loop

    @property
    def running(self) -> bool:
        """True between `start()` and `stop()`."""
        return self._loop is not None and self._thread is not None and self._thread.is_alive()

    def start(self, *, timeout_s: float = 10.0) -> None:
        """Start the thread and its loop; returns when the loop runs."""
        if self.running:
            return
        ready = threading.Event()
        self._previous_switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._previous_switch, SWITCH_INTERVAL_S))

        def run() -> None:
            loop = new_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                _cancel_remaining(loop)
                loop.close()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError("the measurement loop did not start")

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the measurement loop and wait for it; cancelling the caller cancels it there."""
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the measurement loop is not running")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop the loop (tasks still on it are cancelled) and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
        self._loop = self._thread = None
        if self._previous_switch is not None:
            sys.setswitchinterval(self._previous_switch)
            self._previous_switch = None


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop: uvloop's when installed (less work per read and per callback), else asyncio's.

    Safe for timing because reads are stamped by the connection protocol class itself
    (tokwatch.transport.http),
    which uvloop calls directly."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for reports that say which loop measured."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Future[T]:
    """Run `fn()` on another loop; returns a future of the calling loop (e.g. counters on the main loop)."""
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(), loop))
