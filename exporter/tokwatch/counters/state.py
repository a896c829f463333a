"""Per-endpoint in-memory server figures: updated by the scrape loop, read by the collector (no I/O).

The exported view is an immutable `ServerView` replaced whole on every scrape, so a collector running
between two updates never sees half of one. Counters that tokwatch exports as `_total` are
`MonotonicTotal`s: they add the server's positive deltas and, after a server restart, the server's new
value, so they only ever grow and `increase()` works across restarts.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tokwatch.counters.parse import MetricsSnapshot
from tokwatch.counters.reading import CounterReading, created_name, delta, reset_between
from tokwatch.settings.redact import redact

log = logging.getLogger("tokwatch.counters")

# The prefix-cache hit ratio is cached / queried prompt tokens over this window (a Prometheus rate ratio).
PREFIX_WINDOW_S = 300.0


class MonotonicTotal:
    """A tokwatch-side counter that accumulates a server counter's growth across server restarts."""

    def __init__(self) -> None:
        self.total = 0.0
        self._last: float | None = None
        self._created: float | None = None

    def observe(self, value: float, created: float | None = None, *, reset: bool = False) -> None:
        """Feed the server's current value; the first value only sets the baseline."""
        if self._last is not None:
            moved = created is not None and self._created is not None and created != self._created
            restarted = reset or moved or value < self._last
            # After a restart the server counted `value` from zero.
            self.total += value if restarted else value - self._last
        self._last = value
        self._created = created

    @property
    def has_baseline(self) -> bool:
        """True once a first value has been observed."""
        return self._last is not None


@dataclass(frozen=True, slots=True)
class ServerView:
    """What the collector exports for one endpoint right now."""

    up: bool = False
    scrape_duration_s: float | None = None
    decode_tps: float | None = None
    prefill_tps: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_hit_ratio: float | None = None
    mirrored: Mapping[str, float] = field(default_factory=dict)
    vram_ratio: float | None = None


def _mirror_lookup(snap: MetricsSnapshot, name: str) -> tuple[str, bool] | None:
    """The sample name a configured mirror name refers to, and whether it is a counter."""
    for sample in (name, f"{name}_total"):
        if snap.has(sample):
            is_counter = snap.kind_of(sample) == "counter" or sample.endswith("_total")
            return sample, is_counter
    return None


class ServerState:
    """Everything tokwatch knows about one endpoint's server; mutated only from the event loop."""

    def __init__(
        self,
        endpoint: str,
        labels: Mapping[str, str] | None = None,
        *,
        mirror: tuple[str, ...] = (),
        ollama: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.labels: Mapping[str, str] = MappingProxyType(dict(labels or {}))
        self.mirror = mirror
        self.ollama = ollama
        self.view = ServerView()
        self.scrape_errors = 0
        self.scraped = False  # at least one scrape was attempted (up is only exported after that)
        self.preemptions = MonotonicTotal()
        self.has_preemptions = False
        self.mirrored_totals: dict[str, MonotonicTotal] = {}
        self.model_reloads = 0
        self._last: tuple[CounterReading, float] | None = None
        # Prefix-cache (at, hits, queries) deltas over the last PREFIX_WINDOW_S: one llama.cpp request is
        # all-hit or all-miss, so a per-scrape ratio flips between 0 and 1 and then sticks while idle.
        self._prefix_deltas: deque[tuple[float, float, float]] = deque()
        self._last_error: str | None = None
        self._last_problem: str | None = None
        self._absent_mirrors: set[str] = set()
        self.revision = 0  # bumped by every record_* call: /metrics re-renders this endpoint's part then

    def _prefix_ratio(self, now: float) -> float | None:
        """Cached / queried prompt tokens over the last PREFIX_WINDOW_S; None when nothing was queried."""
        while self._prefix_deltas and self._prefix_deltas[0][0] < now - PREFIX_WINDOW_S:
            self._prefix_deltas.popleft()
        queries = sum(q for _, _, q in self._prefix_deltas)
        if queries <= 0:
            return None
        return min(max(sum(h for _, h, _ in self._prefix_deltas) / queries, 0.0), 1.0)

    def record_error(self, duration_s: float | None, message: str) -> None:
        """A failed scrape: count it, log it with the endpoint name, drop every gauge (up 0)."""
        self.revision += 1
        self.scrape_errors += 1
        self.scraped = True
        message = redact(message)
        # The first failure and every change of cause at WARNING; an unchanged repeat at DEBUG only.
        level = logging.DEBUG if message == self._last_error else logging.WARNING
        log.log(level, "endpoint %s: server metrics scrape failed: %s", self.endpoint, message)
        self._last_error = message
        self._last = None
        self._prefix_deltas.clear()
        self._absent_mirrors = set()
        self.view = ServerView(up=False, scrape_duration_s=duration_s)

    def record(
        self, reading: CounterReading | None, snap: MetricsSnapshot | None, at: float, duration_s: float
    ) -> None:
        """A successful scrape at monotonic time `at`: update rates, totals, mirrored series and gauges."""
        self.revision += 1
        self.scraped = True
        self._last_error = None
        decode_tps = prefill_tps = None
        ratio: float | None = None
        reset: str | None = None
        if reading is not None:
            if reading.problem and reading.problem != self._last_problem:
                log.warning("endpoint %s: %s", self.endpoint, reading.problem)
            self._last_problem = reading.problem
            if self._last is not None:
                prev, prev_at = self._last
                reset = reset_between(prev, reading)
                elapsed = at - prev_at
                if reset is None and elapsed > 0:
                    decode_tps = _rate(prev.generation_tokens, reading.generation_tokens, elapsed)
                    prefill_tps = _rate(prev.prompt_tokens, reading.prompt_tokens, elapsed)
                    queries = delta(prev.prefix_queries, reading.prefix_queries)
                    hits = delta(prev.prefix_hits, reading.prefix_hits)
                    if queries is not None and hits is not None and queries > 0:
                        self._prefix_deltas.append((at, hits, queries))
            # Servers without hit/query counters publish a ratio gauge of their own.
            ratio = self._prefix_ratio(at) if reading.prefix_queries is not None else reading.prefix_hit_ratio
            if reading.preemptions is not None:
                self.has_preemptions = True
                if not self.preemptions.has_baseline and self._last is not None:
                    # The family appeared since the last good scrape: it was created at 0 in between.
                    self.preemptions.observe(0.0)
                self.preemptions.observe(reading.preemptions, reset=reset is not None)
            self._last = (reading, at)
        self.view = ServerView(
            up=True,
            scrape_duration_s=duration_s,
            decode_tps=decode_tps,
            prefill_tps=prefill_tps,
            running=reading.running if reading else None,
            waiting=reading.waiting if reading else None,
            kv_cache_usage=reading.kv_cache_usage if reading else None,
            prefix_hit_ratio=ratio,
            mirrored=MappingProxyType(self._mirror(snap, reset is not None) if snap is not None else {}),
        )

    def _mirror(self, snap: MetricsSnapshot, reset: bool) -> dict[str, float]:
        gauges: dict[str, float] = {}
        absent: set[str] = set()
        for name in self.mirror:
            found = _mirror_lookup(snap, name)
            if found is None:
                absent.add(name)
                continue
            sample, is_counter = found
            value = snap.total(sample)
            if value is None:
                continue
            if is_counter:
                stamp = min((s.value for s in snap.select(created_name(sample))), default=None)
                # One `metric` label whether the config names the counter with or without `_total`.
                total = self.mirrored_totals.setdefault(name.removesuffix("_total"), MonotonicTotal())
                if not total.has_baseline and name in self._absent_mirrors:
                    # Labelled counters appear on their first increment: count that one too.
                    total.observe(0.0, stamp)
                total.observe(value, stamp, reset=reset)
            else:
                gauges[name] = value
        self._absent_mirrors = absent
        return gauges

    def record_ollama(self, vram_ratio: float | None, duration_s: float) -> None:
        """A successful Ollama /api/ps poll; `vram_ratio` None when the model is not loaded."""
        self.revision += 1
        self.scraped = True
        self._last_error = None
        self.view = ServerView(up=True, scrape_duration_s=duration_s, vram_ratio=vram_ratio)

    def record_reload(self) -> None:
        """One Ollama cold load (the model had been evicted and was loaded again)."""
        self.revision += 1
        self.model_reloads += 1


def _rate(before: float | None, after: float | None, elapsed: float) -> float | None:
    d = delta(before, after)
    return None if d is None or d < 0 else d / elapsed
