"""Probing a configured endpoint and recording its run: the one path from a name to every sink.

    probe(name, workload) -> ProbeRunner (joins a run already in flight) -> ProbeContext (endpoint,
    settings, workload, site, key, server counters, prompt sizer, stall monitor) -> the measurement loop
    (warm-up and timed run) -> record(result) -> per-run metrics, the store (or the in-memory window
    without one), Ollama's reload signals.

The run itself happens on the measurement loop (tokwatch.transport.measurement), so nothing else the exporter
does
shifts its stamps; the result comes back to the main loop, where every sink takes it without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from tokwatch.counters.power_watch import PowerWatches
from tokwatch.counters.watchers import ServerWatchers
from tokwatch.figures.result import RunResult, Trigger
from tokwatch.figures.tokens import WorkloadError
from tokwatch.logs.round_log import RoundTally
from tokwatch.metrics.cost import CostBook
from tokwatch.metrics.probe import ProbeMetrics
from tokwatch.probes import get_probe, probe_class
from tokwatch.probes.base import (
    CounterMeasurement,
    CounterWindow,
    ProbeContext,
    ProbeLog,
    prompt_sizer,
    run_probe,
)
from tokwatch.probes.keys import Keys
from tokwatch.probes.prompts import PromptSizer, RecentStarts
from tokwatch.service.costing import measure_energy, price_run
from tokwatch.service.price_sources import PriceSources
from tokwatch.service.runner import ProbeOutcome, ProbeRunner
from tokwatch.settings.config import Config, ConfigError, EndpointSettings
from tokwatch.settings.pricing import PriceSource, Pricing
from tokwatch.settings.reach import Reach, warn_insecure
from tokwatch.settings.workloads import Workload
from tokwatch.storage.writer import RunWriter
from tokwatch.tracing.context import RequestTrace, new_ids
from tokwatch.tracing.otlp import SpanSink
from tokwatch.tracing.spans import Peer, RequestSpan, probe_span
from tokwatch.transport.http import HttpClient
from tokwatch.transport.measurement import MeasurementLoop, StampLateness, ThreadHeartbeat, on_loop
from tokwatch.windows.window import MemoryWindows

# One probe target: an endpoint and one of its workloads.
Target = tuple[str, str]

log = logging.getLogger("tokwatch")


class ProbeService:
    """Runs probes on the measurement loop and hands each result to the sinks (`start` before probing)."""

    def __init__(
        self,
        config: Config,
        keys: Keys,
        *,
        metrics: ProbeMetrics,
        windows: MemoryWindows,
        watchers: ServerWatchers,
        instance: str,
        power: PowerWatches | None = None,
        prices: PriceSources | None = None,
        cost_book: CostBook | None = None,
    ) -> None:
        self._config, self._keys = config, keys
        self._power, self._prices, self._cost_book = power, prices, cost_book
        self._metrics = metrics
        self._windows = windows
        self._watchers = watchers
        self._instance = instance
        # Probes run on their own loop and thread, so nothing else the exporter does shifts their stamps.
        self.measurement = MeasurementLoop()
        self._http: HttpClient | None = None  # lives on the measurement loop
        # How late its stamps can be: the loop's heartbeat, and the receive watcher's own lateness when the
        # client stamps arrivals from that thread (so a stall of the loop delays the reading, not the stamp).
        self.stamps = StampLateness(self.measurement.monitor)
        self._runner = ProbeRunner()
        self.tally = RoundTally()  # failed runs and figures set aside, logged once per round
        self._last: dict[Target, ProbeOutcome] = {}  # for /probe's minimum interval
        self.writer: RunWriter | None = None  # when set, runs go to the store instead of the memory window
        # Each sized workload's prompt sizer, which learns from the server's counts run after run.
        self._sizers = prompt_sizers(config)
        # Each endpoint's latest prompt starts, which a fresh prompt avoids (no prefix shared by chance).
        self._starts: dict[str, RecentStarts] = {}
        # Each endpoint's proxy and TLS settings, rebuilt at every (re)load: files and environment re-read.
        self._reaches: dict[str, Reach] = {}
        self._spans: SpanSink | None = None  # `otlp.endpoint`: the timed runs' spans (opened by `start`)

    def check(self, config: Config) -> None:
        """Raise ConfigError naming every enabled endpoint whose tokenizer.json cannot be loaded."""
        prompt_sizers(config, self._sizers)

    def configure(self, config: Config, keys: Keys) -> None:
        """Apply a (re)loaded config and its keys (`check`ed first: a tokenizer that cannot load raises
        ConfigError and nothing is applied); runs already in flight finish with the old ones."""
        sizers = prompt_sizers(config, self._sizers)
        reaches = {ep.name: Reach(ep.name, ep) for ep in config.endpoints}  # `keys` built them once already
        warn_insecure({ep.name: ep for ep in config.enabled_endpoints})
        self._config, self._keys = config, keys
        self._sizers = sizers
        self._reaches = reaches
        self._starts = {name: st for name, st in self._starts.items() if config.endpoint(name) is not None}

    def target(self, name: str, workload: str | None = None) -> tuple[EndpointSettings, Workload]:
        """The configured endpoint and its workload (its first one when None); KeyError naming what is
        unknown."""
        ep = self._config.endpoint(name)
        if ep is None:
            raise KeyError(name)
        workloads = self._config.workloads_for(ep)
        if workload is None:
            return ep, workloads[0]
        w = self._config.workload_for(ep, workload)
        if w is None:
            raise KeyError(f"{name} has no workload {workload}")
        return ep, w

    @property
    def in_flight(self) -> int:
        """Probes running now."""
        return self._runner.in_flight

    @property
    def last_outcomes(self) -> Mapping[Target, ProbeOutcome]:
        """The latest finished run of each endpoint and workload probed so far."""
        return self._last

    async def start(self) -> None:
        """Start the measurement loop and open its HTTP client."""
        self.measurement.start()
        self._http = await self.measurement.call(_open_client())
        watcher = ThreadHeartbeat() if self._http.watcher is not None else None
        self.stamps = StampLateness(self.measurement.monitor, watcher)
        otlp = self._config.otlp
        if otlp.endpoint is not None:
            self._spans = SpanSink(otlp.endpoint, otlp.service_name)

    async def stop(self) -> None:
        """Cancel the probes in flight, close the client and stop the measurement loop."""
        await self._runner.cancel_all()
        if self._http is not None and self.measurement.running:
            await self.measurement.call(self._http.close())
        self._http = None
        self.measurement.stop()
        if self._spans is not None:
            self._spans.close()
            self._spans = None

    async def probe(
        self, name: str, trigger: Trigger = "scheduled", workload: str | None = None
    ) -> ProbeOutcome:
        """Probe a configured endpoint with one of its workloads (its first when None) now (joins a run
        already in flight) and record the result."""
        _, w = self.target(name, workload)
        key = (name, w.name)
        return await self._runner.run(key, lambda: self._probe_and_record(key, trigger))

    async def probe_target(self, target: Target) -> ProbeOutcome:
        """A scheduled run of one (endpoint, workload) target."""
        return await self.probe(target[0], "scheduled", target[1])

    async def probe_on_demand(
        self, name: str, wait_s: float | None, workload: str | None = None
    ) -> ProbeOutcome | None:
        """/probe: the endpoint's last run of the workload if it started within `on_demand_min_interval`,
        else a new run.

        Waits at most `wait_s` (the scraper's own timeout); a run still going then is not cut short (its
        timeout stays the endpoint's own) and is recorded when it ends; None is returned meanwhile.
        """
        _, w = self.target(name, workload)
        last = self._last.get((name, w.name))
        min_interval = self._config.schedule.on_demand_min_interval
        if last is not None and time.time() - last.result.started_at < min_interval:
            return last
        run = asyncio.ensure_future(self.probe(name, "on_demand", w.name))
        try:
            return await asyncio.wait_for(asyncio.shield(run), timeout=wait_s)
        except TimeoutError:
            return None

    def pricing(self, name: str) -> tuple[Pricing, PriceSource] | None:
        """An endpoint's prices now and where they came from; None when nothing prices it."""
        ep = self._config.endpoint(name)
        if ep is None or self._prices is None:
            return None
        return self._prices.pricing(ep, self._config)

    async def _probe_and_record(self, key: Target, trigger: Trigger) -> ProbeOutcome:
        ctx = self._context(*key)
        watch = self._power.for_endpoint(key[0]) if self._power is not None else None
        # The power source's readings while a probe runs are not idle; the run's energy is read from the
        # readings around it once the next one is in, here on the main loop, after the run.
        with watch.busy() if watch is not None else contextlib.nullcontext():
            result = await self.measurement.call(_measured(ctx))
            if watch is not None:
                await measure_energy(result, watch)
        result.trigger = trigger
        if (priced := self.pricing(key[0])) is not None:
            price_run(result, priced[0], self._config.pricing.blend_parts)
        if self._spans is not None and ctx.trace is not None:  # built here, off the measurement loop
            self._spans.emit(_span(ctx, ctx.trace, result, self._spans))
        self.record(result)
        outcome = ProbeOutcome(result, ctx.log)
        self._last[key] = outcome
        return outcome

    def _context(self, name: str, workload: str) -> ProbeContext:
        """Everything one run needs, taken from the config and keys in force now."""
        ep, w = self.target(name, workload)
        if self._http is None:
            raise KeyError(name)
        counters = self._watchers.counters.get(name)
        return ProbeContext(
            endpoint=ep,
            settings=self._config.probe_for(ep),
            http=self._http,
            api_key=self._keys.get(name),
            headers=self._keys.headers(name),
            log=ProbeLog(self._keys.redactor),
            instance=self._instance,
            # Scraping and parsing the server's /metrics stays on this (main) loop.
            counters=_CountersOnLoop(counters.window, asyncio.get_running_loop()) if counters else None,
            stalls=self.measurement.monitor,
            stamps=self.stamps,
            workload=w,
            site=self._config.site_name,
            prompts=self._sizers.get((name, w.name)),
            starts=self._starts.setdefault(name, RecentStarts()),
            reach=self._reaches.get(name),
            trace=RequestTrace(new_ids()) if self._spans is not None else None,
        )

    def record(self, result: RunResult) -> None:
        """Feed one timed run to every sink (metrics, store or window, Ollama signals) and to the round's
        log summary (`tally`)."""
        self.tally.add(result)
        self._metrics.record(result)
        if self._cost_book is not None:
            self._cost_book.record(result)
        if self.writer is not None:
            self.writer.submit(result)  # never waits on the database
        else:
            self._windows.add(result)
        if (signals := self._watchers.ollama.get(result.endpoint)) is not None:
            signals.observe(result)


def prompt_sizers(
    config: Config, keep: Mapping[Target, PromptSizer] | None = None
) -> dict[Target, PromptSizer]:
    """A sizer per sized workload of the config; one in `keep` that sizes the same way stays, with what it
    learned. Raises ConfigError naming every enabled endpoint whose tokenizer.json cannot be loaded."""
    keep = keep or {}
    out: dict[Target, PromptSizer] = {}
    problems = []
    for ep in config.endpoints:
        for w in config.workloads_for(ep):
            if not w.sized:
                continue
            try:
                fresh = prompt_sizer(ep, w)
            except WorkloadError as exc:
                if ep.enabled:
                    problems.append(f"endpoint {ep.name}: tokenizer: {exc}")
                continue
            old = keep.get((ep.name, w.name))
            same = old is not None and (old.target, old.counter) == (fresh.target, fresh.counter)
            out[(ep.name, w.name)] = old if same and old is not None else fresh
    if problems:
        raise ConfigError("\n".join(problems))
    return out


async def _open_client() -> HttpClient:
    # Receive stamps from the watcher thread where the platform has one: a few streams at a time cost little
    # (docs/performance.md, "Receive stamps"), and another probe's parsing no longer moves a stamp.
    client = HttpClient(watch_receives=True)
    await client.__aenter__()
    return client


async def _measured(ctx: ProbeContext) -> RunResult:
    """Warm-up and timed run on the measurement loop, with its heartbeats running throughout."""
    assert ctx.stamps is not None
    with ctx.stamps.watching():
        return await run_probe(get_probe(ctx.endpoint.kind), ctx)


class _CountersOnLoop:
    """A CounterWindow whose snapshots run on another loop (the one that owns the counters' HTTP client)."""

    def __init__(self, inner: CounterWindow, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    async def snapshot(self) -> object | None:
        """The inner snapshot, scraped and parsed on the owning loop."""
        return await on_loop(self._loop, self._inner.snapshot)

    def measure(self, before: object | None, after: object | None) -> CounterMeasurement | None:
        """Pure arithmetic: runs wherever it is called."""
        return self._inner.measure(before, after)


def _span(ctx: ProbeContext, trace: RequestTrace, result: RunResult, sink: SpanSink) -> RequestSpan:
    """The timed run's span, from the stamps it recorded (docs/tracing.md)."""
    ep = ctx.endpoint
    peer = Peer(ep.kind, ep.model, probe_class(ep.kind).endpoint_url(ep))
    return probe_span(trace, result, peer, sink.clock, max_tokens=ctx.max_tokens, now=time.perf_counter())

