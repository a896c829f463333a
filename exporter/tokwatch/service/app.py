"""The exporter application: wiring and lifecycle. It loads and reloads the config, builds the parts, and
starts and stops them; what each part does lives in its own module:

- `ProbeService` (probe_service.py): probing an endpoint and recording its run to every sink;
- `ServerWatchers` (counters/watchers.py): server-counter scrapers and Ollama pollers;
- `Keys` (keys.py): API keys and key-file rotation; `FleetDuty` (shard.py): which replica exports the
  fleet-wide figures; `WindowRule` (window_rule.py): which runs the window figures take;
- the collectors (metrics/, counters/collector.py, storage/collector.py) on one `Exposition`.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import inspect
import logging
import socket
import time
from collections.abc import Callable, Collection
from pathlib import Path

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

from tokwatch.counters import ServerCollector
from tokwatch.counters.power_watch import PowerWatches
from tokwatch.counters.watchers import ServerWatchers
from tokwatch.figures.result import Trigger
from tokwatch.figures.wording import counted
from tokwatch.metrics.cost import CostBook
from tokwatch.metrics.exporter import ExporterCollector, ExporterStatus, SchedulerStats
from tokwatch.metrics.exposition import Exposition
from tokwatch.metrics.probe import ProbeMetrics, SeriesOptions
from tokwatch.metrics.window import WindowCollector
from tokwatch.probes.keys import Keys
from tokwatch.service.price_sources import PriceSources, SourceState
from tokwatch.service.probe_service import ProbeService
from tokwatch.service.runner import ProbeOutcome
from tokwatch.service.scheduler import ProbeSlots, RoundPlan, Scheduler
from tokwatch.service.shard import FleetDuty, Shard
from tokwatch.settings.config import Config, EndpointSettings, load_config, server_key
from tokwatch.settings.pricing import PriceSource, Pricing
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.storage import (
    RunStore,
    RunWriter,
    StorageCollector,
    WindowCache,
    make_writer,
    open_store,
)
from tokwatch.storage.cost_figures import capacity_of
from tokwatch.storage.errors import StorageError
from tokwatch.storage.factory import resolve_dsn, state_lock
from tokwatch.storage.state_lock import StateLock
from tokwatch.storage.writer import resume_bound
from tokwatch.windows.window import MemoryWindows, WindowSnapshot, window_label
from tokwatch.windows.window_rule import WindowRule

log = logging.getLogger("tokwatch")
PRERENDER_INTERVAL_S = 1.0  # changed /metrics parts are rendered this often in the background
FLEET_DUTY_CHECK_S = 30.0  # a sharded replica checks this often which replica exports the fleet figures
CAPACITY_READ_S = 300.0  # how often the latest stored capacity searches are read (a search takes minutes)
# A schedule: the main one (None), or a workload's own (interval, offset).
ScheduleKey = tuple[float, float] | None


class App:
    """One tokwatch exporter process. Tests build one per test, each with a fresh registry."""

    def __init__(
        self,
        config: Config,
        config_path: str | None = None,
        *,
        instance: str | None = None,
        shard: Shard | None = None,
    ) -> None:
        self.shard = shard or Shard()
        self.full_config = config  # every endpoint of the fleet; `config` holds this replica's share
        config = self.shard_config(config)
        self.config = config
        self.config_path = config_path
        self._config_digest = _digest_file(config_path) if config_path else None
        self.keys = Keys(config)
        self.instance = instance or config.instance or socket.gethostname()
        # The one registry: /metrics is built from per-endpoint pieces rendered once per change.
        self.exposition = Exposition()
        self.probe_metrics = ProbeMetrics()
        self.windows = MemoryWindows()
        self.server_collector = ServerCollector()
        self.watchers = ServerWatchers(
            self.server_collector, lambda name: self.keys.headers(name), lambda: self.keys.redactor
        )
        # Cost and energy (docs/methodology.md, "Cost and energy"): the price sources, the power sources
        # sampled on this loop, the per-series figures.
        self.prices = PriceSources()
        self.power = PowerWatches()
        self.cost_book = CostBook()
        self.probes = ProbeService(
            config,
            self.keys,
            metrics=self.probe_metrics,
            windows=self.windows,
            watchers=self.watchers,
            instance=self.instance,
            power=self.power,
            prices=self.prices,
            cost_book=self.cost_book,
        )
        self.status = ExporterStatus(reload_ok=True, reload_success_ts=time.time())
        # Fleet-wide figures: one replica exports them (docs/scaling.md, "Sharding").
        self.fleet_duty = FleetDuty(self.shard, self._fleet_owners().values())
        self._window_snapshot: Callable[[], WindowSnapshot] = self.windows.snapshot
        self.exposition.register(self.probe_metrics)
        self.exposition.register(
            ExporterCollector(self.status, lambda: self.probes.in_flight, lambda: self.scheduler_stats)
        )
        # process_* and python_* as every Prometheus client exports them: each registers itself.
        ProcessCollector(registry=self.exposition)
        PlatformCollector(registry=self.exposition)
        GCCollector(registry=self.exposition)
        self.window_collector = WindowCollector(
            lambda: self._window_snapshot(), export_fleet=lambda: self.fleet_duty.exports
        )
        self.exposition.register(self.window_collector)
        self.exposition.register(self.server_collector)
        self.exposition.register(self.cost_book)
        self.store: RunStore | None = None
        self.writer: RunWriter | None = None
        self._state_lock: StateLock | None = None
        self._window_cache: WindowCache | None = None
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduler: Scheduler | None = None
        # Workloads with their own interval run on schedulers of their own, sharing the probe slots.
        self._schedulers: dict[tuple[float, float], tuple[Scheduler, asyncio.Task[None]]] = {}
        self._slots = ProbeSlots(config.schedule.parallelism, config.schedule.per_server)
        self.after_round: Callable[[], None] | None = None  # e.g. the demo's table printer
        self._apply(config, self.prices.load(config.pricing))

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self, *, schedule: bool = True, storage: bool = True) -> None:
        """Open the store, the measurement loop and the server watchers, then start the scheduler.

        Raises StorageError (e.g. a schema newer than this version knows) before anything is probed.
        """
        if storage and self.config.storage.enabled:
            await self._open_storage()
        await self.probes.start()
        await self.watchers.start(self.config.enabled_endpoints)
        await self.power.sync(self.config.enabled_endpoints)
        await self.prices.start()
        # Everything loaded so far (modules, config, clients) lives as long as the process: moving it out
        # of the collector's sight makes full collections scan only newer objects. A full collection
        # stops every thread, the measurement thread included (tens of ms with all of it in view).
        gc.collect()
        gc.freeze()
        self._started = True
        self.fleet_duty.restart_clock()
        # Changed /metrics parts rendered in the background, so a scrape joins ready bytes
        # (docs/methodology.md, "Measurement isolation"); a part that failed is rendered by the scrape.
        self._every(PRERENDER_INTERVAL_S, self.exposition.prerender, "pre-rendering /metrics")
        if self.shard.count > 1 and self._shared_store:  # also checked after each round
            what = f"shard {self.shard.label}: fleet duty check"
            self._every(FLEET_DUTY_CHECK_S, self._check_fleet_duty, what)
        if schedule:
            await self._start_scheduler()

    async def _start_scheduler(self) -> None:
        """Start the supervised scheduler (once), and one per workload schedule of its own; `start()` does
        this unless told not to."""
        if self._scheduler is not None:
            return
        self._scheduler = Scheduler(
            self._schedule_settings,
            self.probes.probe_target,
            self._on_round,
            run_on_start=self.config.schedule.run_on_start,
            after_round=self._after_round,
            slots=self._slots,
        )
        self._tasks.add(asyncio.create_task(self._scheduler.supervise(), name="tokwatch-scheduler"))
        self._sync_schedulers()

    def _sync_schedulers(self) -> None:
        """One scheduler per workload schedule of its own in the config now: new ones started, those no
        workload uses any more stopped (the main scheduler follows the config each round)."""
        if self._scheduler is None:
            return
        wanted = {k for k in self._plans() if k is not None}
        for key in [k for k in self._schedulers if k not in wanted]:
            _, task = self._schedulers.pop(key)
            task.cancel()
            self._tasks.discard(task)
        for key in wanted - self._schedulers.keys():
            sched = Scheduler(
                functools.partial(self._own_schedule_settings, key),
                self.probes.probe_target,
                lambda *_: None,
                run_on_start=self.config.schedule.run_on_start,
                after_round=self._after_round,
                slots=self._slots,
            )
            task = asyncio.create_task(sched.supervise(), name=f"tokwatch-scheduler-{key[0]:g}s")
            self._schedulers[key] = (sched, task)
            self._tasks.add(task)

    def _every(self, seconds: float, work: Callable[[], object], what: str) -> None:
        """Run `work` (a function or a coroutine function) every `seconds` until stop; a failure is logged
        and the next turn tries again."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(seconds)
                try:
                    result = work()
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("%s failed", what)

        self._tasks.add(asyncio.create_task(loop(), name=f"tokwatch-{what}"))

    @property
    def ready(self) -> bool:
        """Started, and the scheduler (when there is one) running rather than restarting after a crash."""
        return self._started and (self._scheduler is None or self._scheduler.stats.running)

    async def _open_storage(self) -> None:
        settings = self.config.storage
        # One owner per state: a second exporter on this outbox or SQLite file refuses to start here.
        self._state_lock = state_lock(settings)
        self._state_lock.acquire()
        try:
            self.store = await open_store(settings, instance=self.instance)
        except BaseException:
            self._state_lock.release()
            raise
        self.writer = make_writer(
            self.store, settings, instance=self.instance, interval_s=self.config.schedule.interval
        )
        self.writer.sync_endpoints(self.config.endpoints)
        await self.writer.start()
        self.probes.writer = self.writer  # runs go to the store from now on, not to the memory window
        self.exposition.register(StorageCollector(self.writer))
        self._window_cache = WindowCache(
            self.store,
            rule=_window_rule(self.config),
            window_s=self.config.schedule.window,
            windows_s=self.config.schedule.windows,
        )
        self._window_cache.configure(
            self.config.endpoints, fleet=self.full_config.endpoints, site=self.config.site_name
        )
        await self._window_cache.start()
        self._window_snapshot = self._window_cache.snapshot
        # Self-hosted $/Mtok at capacity: the latest stored capacity search of each such endpoint.
        try:
            await self.read_capacities()
        except StorageError as exc:
            log.warning("reading capacity searches failed (tried again in %.0fs): %s", CAPACITY_READ_S, exc)
        self._every(CAPACITY_READ_S, self.read_capacities, "reading capacity searches")

    async def stop(self) -> None:
        """Cancel the scheduler and the probes in flight, then close every part (SIGTERM path)."""
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.probes.stop()
        await self.watchers.close()
        await self.power.close()
        await self.prices.close()
        if self._window_cache is not None:
            await self._window_cache.close()
        if self.writer is not None:
            await self.writer.close()  # unwritten runs go to the durable outbox
        if self.store is not None:
            await self.store.close()
        if self._state_lock is not None:
            self._state_lock.release()  # after the outbox's last write and the store's close

    # --- config ------------------------------------------------------------------------------------

    def shard_config(self, config: Config) -> Config:
        """`config` restricted to the endpoints this replica owns (all of them when not sharded)."""
        if self.shard.count == 1:
            return config
        owned = tuple(e for e in config.endpoints if self.shard.owns(e.name))
        return config.model_copy(update={"endpoints": owned})

    def owner_of(self, name: str) -> int | None:
        """The replica that probes a configured endpoint (None when the fleet has no such endpoint)."""
        return self.shard.owner(name) if self.full_config.endpoint(name) is not None else None

    def _apply(self, config: Config, price_states: dict[str, SourceState]) -> None:
        self.prices.apply(config.pricing, price_states)
        self.probes.configure(config, self.keys)
        self.config = config
        self._slots.configure(config.schedule.parallelism, config.schedule.per_server)
        options = SeriesOptions(config.metrics.histograms, config.metrics.diagnostics)
        self.probe_metrics.set_endpoints(config.endpoints, _workload_names(config), config.site_name, options)
        self.window_collector.select(
            [window_label(s) for s in config.exported_windows], config.metrics.diagnostics
        )
        self.server_collector.site = config.site_name
        rule = _window_rule(config)
        schedule = config.schedule
        workloads = _workload_names(config)
        self.windows.configure(
            config.endpoints, schedule.window, rule, workloads, config.site_name, schedule.windows
        )
        if self.writer is not None:
            self.writer.sync_endpoints(config.endpoints)
            self.writer.resume_within(resume_bound(config.schedule.interval))
        if self._window_cache is not None:
            self._window_cache.configure(
                config.endpoints,
                fleet=self.full_config.endpoints,
                rule=rule,
                site=config.site_name,
                window_s=schedule.window,
                windows_s=schedule.windows,
            )
        self.status.interval_s = config.schedule.interval
        self._configure_costs(config)

    async def read_capacities(self) -> None:
        """The latest stored capacity search of each self-hosted priced endpoint, for the capacity basis
        (a store that fails is logged by the loop that calls this; the figures read before stay)."""
        if self.store is None:
            return
        found = {}
        for ep in self.config.endpoints:
            priced = self.probes.pricing(ep.name)
            if priced is None or priced[0].token_price() is not None or priced[0].hourly is None:
                continue
            if (capacity := await capacity_of(self.store, ep.name)) is not None:
                found[ep.name] = capacity
        self.cost_book.set_capacities(found)

    def fleet_pricing(self, name: str) -> tuple[Pricing, PriceSource] | None:
        """Any endpoint of the fleet's prices and where they came from (the status API shows every
        endpoint, this replica's or not)."""
        ep = self.full_config.endpoint(name)
        return None if ep is None else self.prices.pricing(ep, self.full_config)

    def _configure_costs(self, config: Config) -> None:
        """Each endpoint's prices now (a refreshed list may have changed them) for the cost figures."""
        self.cost_book.configure(
            config.endpoints,
            _workload_names(config),
            self.probes.pricing,
            [ep.name for ep in config.endpoints if _priceable(ep, config)],
            blend=config.pricing.blend_parts,
            window_s=config.schedule.window,
            site=config.site_name,
            idle_watts=lambda name: w.idle_watts if (w := self.power.for_endpoint(name)) else None,
            sources=lambda: {k: (s.last_refresh, s.failures) for k, s in self.prices.states.items()},
        )

    async def reload(self) -> tuple[bool, str]:
        """Re-read the config file (SIGHUP, POST /-/reload); keeps the old config on error. (ok, message)."""
        if self.config_path is None:
            return True, "no config file to reload"
        digest = _digest_file(self.config_path)
        if digest == self._config_digest:
            # The file is the running config again (e.g. a bad edit reverted): that is a good state.
            self.status.reload_ok = True
            return True, "config unchanged"
        try:
            # Off the event loop: a large or hostile file parses without holding /metrics and the probes.
            full = await asyncio.to_thread(load_config, self.config_path)
            config = self.shard_config(full)
            keys = Keys(config)
            self.probes.check(config)  # endpoints' tokenizer.json files load
            price_states = self.prices.load(config.pricing)  # the price table and list files read
        except ConfigError as exc:
            self.status.reload_ok = False
            log.error("config reload failed, keeping the previous config:\n%s", exc)
            return False, str(exc)
        if config.listen != self.config.listen:
            log.warning("listen address changes take effect on restart only")
        if config.storage != self.config.storage:
            log.warning("storage settings change on restart only")
        if config.otlp != self.config.otlp:
            log.warning("otlp settings change on restart only")
        self.keys = keys
        self._config_digest = digest
        self.full_config = full
        self._apply(config, price_states)
        await self.watchers.sync(config.enabled_endpoints)
        await self.power.sync(config.enabled_endpoints)
        self.status.reload_ok = True
        self.status.reload_success_ts = time.time()
        if self._scheduler is not None:
            self._scheduler.reschedule()
        self._sync_schedulers()
        for sched, _ in self._schedulers.values():
            sched.reschedule()
        log.info("config reloaded: %s", counted(len(config.endpoints), "endpoint"))
        return True, "config reloaded"

    # --- the schedule ------------------------------------------------------------------------------

    @property
    def rounds_completed(self) -> int:
        """Scheduled rounds finished so far."""
        return self._scheduler.rounds if self._scheduler else 0

    @property
    def scheduler_stats(self) -> SchedulerStats | None:
        """The schedulers' figures, summed over the main one and the workloads' own (None without a
        schedule)."""
        if self._scheduler is None:
            return None
        every = [self._scheduler.stats, *(sched.stats for sched, _ in self._schedulers.values())]
        return SchedulerStats(
            rounds=sum(s.rounds for s in every),
            skipped_slots=sum(s.skipped_slots for s in every),
            crashes=sum(s.crashes for s in every),
            running=all(s.running for s in every),
            last_error=next((s.last_error for s in every if s.last_error), None),
        )

    def _plans(self) -> dict[ScheduleKey, RoundPlan]:
        """Each schedule's round: (endpoint, workload) targets by server; None: the main schedule."""
        s = self.config.schedule
        main = self.config.round_schedule()
        groups: dict[ScheduleKey, dict[str, list[tuple[str, str]]]] = {}
        for ep in self.config.enabled_endpoints:
            for w in self.config.workloads_for(ep):
                own = self.config.round_schedule(w)
                key = None if own == main else own
                groups.setdefault(key, {}).setdefault(server_key(ep.base_url), []).append((ep.name, w.name))
        return {k: RoundPlan(g, s.parallelism, s.per_server) for k, g in groups.items()}

    def _schedule_settings(self) -> tuple[float, float, RoundPlan]:
        s = self.config.schedule
        interval, offset = self.config.round_schedule()
        return interval, offset, self._plans().get(None, RoundPlan({}, s.parallelism, s.per_server))

    def _own_schedule_settings(self, key: tuple[float, float]) -> tuple[float, float, RoundPlan]:
        s = self.config.schedule
        return key[0], key[1], self._plans().get(key, RoundPlan({}, s.parallelism, s.per_server))

    def _on_round(self, planned: float, started: float, following: float) -> None:
        self.status.lag_s = max(0.0, started - planned)
        self.status.last_round_ts = started
        self.status.next_round_ts = following

    def _after_round(self) -> None:
        self.probes.tally.flush(self.rounds_completed)
        if self._window_cache is not None and self.writer is not None:
            # Fresh window figures right after a round instead of up to 30 s later.
            task = asyncio.create_task(self.refresh_windows())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.after_round is not None:
            self.after_round()

    async def refresh_windows(self) -> None:
        """Write the runs still queued, then read the store-backed window figures and the fleet duty anew
        (what follows every round; without a store, the in-memory figures are always current)."""
        if self.writer is not None and self._window_cache is not None:
            await self.writer.flush(timeout_s=5.0)
            await self._window_cache.refresh()
            await self._check_fleet_duty()

    # --- probing -----------------------------------------------------------------------------------

    async def probe(
        self, name: str, trigger: Trigger = "scheduled", workload: str | None = None
    ) -> ProbeOutcome:
        """Probe a configured endpoint with one of its workloads (its first when None) now (joins a run
        already in flight) and record the result."""
        return await self.probes.probe(name, trigger, workload)

    async def probe_on_demand(
        self, name: str, wait_s: float | None, workload: str | None = None
    ) -> ProbeOutcome | None:
        """/probe: see `ProbeService.probe_on_demand`."""
        return await self.probes.probe_on_demand(name, wait_s, workload)

    # --- fleet-wide figures of a sharded fleet -----------------------------------------------------

    @property
    def _shared_store(self) -> bool:
        """Runs go to PostgreSQL, which sharded replicas share (each SQLite file is a replica's own)."""
        return self.store is not None and resolve_dsn(self.config.storage) is not None

    def _fleet_owners(self) -> dict[str, int]:
        """The replica that probes each enabled endpoint of the fleet."""
        return {e.name: self.shard.owner(e.name) for e in self.full_config.enabled_endpoints}

    async def _check_fleet_duty(self) -> None:
        recent = self._written_since if self._shared_store else None
        await self.fleet_duty.check(self._fleet_owners(), self.config.schedule.interval, recent)

    async def _written_since(self, t: float) -> Collection[str]:
        """The endpoints with a run from this exporter's site in the shared store since unix time `t` (the
        replicas of another site probe the same endpoints for themselves: docs/scaling.md)."""
        assert self.store is not None
        return {key.endpoint for key in await self.store.last_runs(t, site=self.config.site_name)}


def _priceable(ep: EndpointSettings, config: Config) -> bool:
    """Whether an endpoint can have prices: its own, a per-model default, or a price source to look in."""
    return ep.pricing is not None or ep.model in config.pricing.models or bool(config.pricing.sources)


def _workload_names(config: Config) -> dict[str, list[str]]:
    return {ep.name: [w.name for w in config.workloads_for(ep)] for ep in config.endpoints}


def _window_rule(config: Config) -> WindowRule:
    return WindowRule.of(config.schedule.window_includes)


def _digest_file(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
