"""The exporter application: owns config, Prometheus registry, HTTP client, scheduler and sinks."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import inspect
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

from tokwatch.config import Config, ConfigError, EndpointSettings, load_config, server_key
from tokwatch.counters import OllamaSignals, ServerCollector, ServerCounters
from tokwatch.exposition import Exposition
from tokwatch.http import HttpClient
from tokwatch.measurement import MeasurementLoop, on_loop
from tokwatch.metrics.exporter import ExporterCollector, ExporterStatus
from tokwatch.metrics.probe import ProbeMetrics
from tokwatch.metrics.window import WindowCollector
from tokwatch.probes import get_probe
from tokwatch.probes.base import CounterMeasurement, CounterWindow, ProbeContext, ProbeLog, run_probe
from tokwatch.redact import Redactor
from tokwatch.result import RunResult, Trigger
from tokwatch.runner import ProbeOutcome, ProbeRunner
from tokwatch.scheduler import RoundPlan, Scheduler, SchedulerStats
from tokwatch.shard import Shard, takeover_after
from tokwatch.storage import RunWriter, StorageCollector, Store, WindowCache, make_writer, open_store
from tokwatch.storage.factory import resolve_dsn
from tokwatch.storage.writer import resume_bound
from tokwatch.window import MemoryWindows, WindowSnapshot
from tokwatch.window_rule import WindowRule

log = logging.getLogger("tokwatch")
PRERENDER_INTERVAL_S = 1.0  # changed /metrics parts are rendered this often in the background
FLEET_DUTY_CHECK_S = 30.0  # a sharded replica checks this often which replica exports the fleet figures
W = TypeVar("W", ServerCounters, OllamaSignals)


class Keys:
    """API keys resolved at (re)load time, so a missing env var is a config error, not a failed probe.

    An `api_key_file` is re-read when the file changes (a rotated key needs no restart or reload); while a
    rotation leaves it unreadable, the last key read is used. Every key ever read stays in the redactor.
    """

    def __init__(self, config: Config) -> None:
        self._keys: dict[str, str | None] = {}
        self._files: dict[str, tuple[EndpointSettings, tuple[int, int, int] | None]] = {}
        problems = []
        for ep in config.endpoints:
            try:
                if ep.api_key_file is not None:
                    self._files[ep.name] = (ep, _file_version(ep.api_key_file))
                self._keys[ep.name] = ep.resolve_api_key()
            except ConfigError as exc:
                if ep.enabled:
                    problems.append(str(exc))
                self._keys[ep.name] = None
        if problems:
            raise ConfigError("\n".join(problems))
        self.redactor = Redactor(self._keys.values())

    def get(self, name: str) -> str | None:
        """Key for one endpoint (None when it needs none); re-reads a changed `api_key_file`."""
        if name in self._files:
            self._refresh(name)
        return self._keys.get(name)

    def _refresh(self, name: str) -> None:
        ep, seen = self._files[name]
        assert ep.api_key_file is not None
        version = _file_version(ep.api_key_file)
        if version == seen or version is None:
            if version is None and seen is not None:
                log.warning("endpoint %s: api_key_file %s is unreadable; using the last key read",
                            name, ep.api_key_file)  # fmt: skip
            return
        try:
            key = ep.resolve_api_key()
        except ConfigError as exc:
            log.warning("%s; using the last key read", exc)
            return
        self._files[name] = (ep, version)
        if key != self._keys.get(name):
            self._keys[name] = key
            self.redactor = self.redactor.with_secret(key)
            log.info("endpoint %s: api_key_file %s changed; the new key is used", name, ep.api_key_file)


def _file_version(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (inode, size, mtime), None when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
        self.runner = ProbeRunner(self._start_probe)
        # The one registry: /metrics is built from per-endpoint pieces rendered once per change.
        self.exposition = Exposition()
        self.probe_metrics = ProbeMetrics()
        self.status = ExporterStatus(reload_ok=True, reload_success_ts=time.time())
        self.windows = MemoryWindows()
        self.exposition.register(self.probe_metrics)
        self.exposition.register(
            ExporterCollector(self.status, lambda: self.runner.in_flight, lambda: self.scheduler_stats)
        )
        self._window_snapshot: Callable[[], WindowSnapshot] = self.windows.snapshot
        # process_* and python_* as every Prometheus client exports them, on the app's own registry.
        ProcessCollector(registry=self.exposition)
        PlatformCollector(registry=self.exposition)
        GCCollector(registry=self.exposition)
        # Fleet-wide figures: one replica exports them (docs/scaling.md, "Sharding"); `_update_fleet_duty`
        # moves them to the next live replica while the lower ones are down.
        self._fleet_duty = self.shard.exports_fleet(self._fleet_owners().values())
        self._started_at = time.time()
        self.exposition.register(
            WindowCollector(lambda: self._window_snapshot(), export_fleet=lambda: self._fleet_duty)
        )
        self.store: Store | None = None
        self.writer: RunWriter | None = None
        self._window_cache: WindowCache | None = None
        self.server_collector = ServerCollector()
        self.exposition.register(self.server_collector)
        self._counters: dict[str, ServerCounters] = {}
        self._ollama: dict[str, OllamaSignals] = {}
        self.http: HttpClient | None = None  # main loop: server-counter and Ollama watchers
        # Probes run on their own loop and thread, so nothing else the exporter does shifts their stamps.
        self.measurement = MeasurementLoop()
        self._probe_http: HttpClient | None = None
        self._started = False
        self._last_outcome: dict[str, ProbeOutcome] = {}  # for /probe's minimum interval
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduler: Scheduler | None = None
        self.after_round: Callable[[], None] | None = None  # e.g. the demo's table printer
        self._apply(config)

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self, *, schedule: bool = True, storage: bool = True) -> None:
        """Open the store, the HTTP client and the server watchers, then start the scheduler.

        Raises StorageError (e.g. a schema newer than this version knows) before anything is probed.
        """
        if storage and self.config.storage.enabled:
            await self._open_storage()
        self.http = HttpClient()
        await self.http.__aenter__()
        self.measurement.start()
        self._probe_http = await self.measurement.call(_open_client())
        await self._sync_server_watchers()
        # Everything loaded so far (modules, config, clients) lives as long as the process: moving it out
        # of the collector's sight makes full collections scan only newer objects. A full collection
        # stops every thread, the measurement thread included (tens of ms with all of it in view).
        gc.collect()
        gc.freeze()
        self._started = True
        self._started_at = time.time()
        # Changed /metrics parts rendered in the background, so a scrape joins ready bytes
        # (docs/methodology.md, "Measurement isolation"); a part that failed is rendered by the scrape.
        self._every(PRERENDER_INTERVAL_S, self.exposition.prerender, "pre-rendering /metrics")
        if self.shard.count > 1 and self._shared_store:  # also checked after each round
            what = f"shard {self.shard.label}: fleet duty check"
            self._every(FLEET_DUTY_CHECK_S, self._update_fleet_duty, what)
        if schedule:
            await self._start_scheduler()

    async def _start_scheduler(self) -> None:
        """Start the supervised scheduler (once); `start()` does this unless told not to."""
        if self._scheduler is not None:
            return
        self._scheduler = Scheduler(
            self._schedule_settings,
            self.probe,
            self._on_round,
            run_on_start=self.config.schedule.run_on_start,
            after_round=self._after_round,
        )
        self._tasks.add(asyncio.create_task(self._scheduler.supervise(), name="tokwatch-scheduler"))

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
        self.store = await open_store(settings, instance=self.instance)
        self.writer = make_writer(
            self.store, settings, instance=self.instance, interval_s=self.config.schedule.interval
        )
        self.writer.sync_endpoints(self.config.endpoints)
        await self.writer.start()
        self.exposition.register(StorageCollector(self.writer))
        self._window_cache = WindowCache(
            self.store, rule=self._window_rule(self.config), window_s=self.config.schedule.window
        )
        self._window_cache.configure(self.config.endpoints, fleet=self.full_config.endpoints)
        await self._window_cache.start()
        self._window_snapshot = self._window_cache.snapshot

    async def stop(self) -> None:
        """Cancel in-flight probes and the scheduler, then close the client (SIGTERM path)."""
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        await self.runner.cancel_all()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for counters in self._counters.values():
            await counters.close()
        for signals in self._ollama.values():
            await signals.close()
        self._counters.clear()
        self._ollama.clear()
        if self._window_cache is not None:
            await self._window_cache.close()
        if self.writer is not None:
            await self.writer.close()  # unwritten runs go to the durable outbox
        if self.store is not None:
            await self.store.close()
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self._probe_http is not None and self.measurement.running:
            await self.measurement.call(self._probe_http.close())
        self._probe_http = None
        self.measurement.stop()

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

    def _apply(self, config: Config) -> None:
        self.config = config
        self.probe_metrics.set_endpoints(config.endpoints)
        rule = self._window_rule(config)
        self.windows.configure(config.endpoints, config.schedule.window, rule)
        if self.writer is not None:
            self.writer.sync_endpoints(config.endpoints)
            self.writer.resume_within(resume_bound(config.schedule.interval))
        if self._window_cache is not None:
            self._window_cache.configure(config.endpoints, fleet=self.full_config.endpoints, rule=rule)
        self.status.interval_s = config.schedule.interval

    async def _sync_server_watchers(self) -> None:
        """Server-counter scrapers and Ollama pollers for the endpoints; unchanged ones keep running."""
        http = self.http
        if http is None:
            return
        wanted = {ep.name: ep for ep in self.config.enabled_endpoints}
        await self._sync(
            self._counters,
            wanted,
            lambda ep: ep.effective_metrics_url is not None,
            lambda ep: ServerCounters(ep, http),
        )
        await self._sync(
            self._ollama, wanted, lambda ep: ep.kind == "ollama", lambda ep: OllamaSignals(ep, http)
        )

    async def _sync(
        self,
        watchers: dict[str, W],
        wanted: dict[str, EndpointSettings],
        applies: Callable[[EndpointSettings], bool],
        make: Callable[[EndpointSettings], W],
    ) -> None:
        for name, watcher in list(watchers.items()):
            if wanted.get(name) != watcher.endpoint:
                await watcher.close()
                self.server_collector.remove(name)
                del watchers[name]
        for name, ep in wanted.items():
            if applies(ep) and name not in watchers:
                watchers[name] = watcher = make(ep)
                self.server_collector.add(watcher.state)
                await watcher.start()

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
            full = load_config(self.config_path)
            config = self.shard_config(full)
            keys = Keys(config)
        except ConfigError as exc:
            self.status.reload_ok = False
            log.error("config reload failed, keeping the previous config:\n%s", exc)
            return False, str(exc)
        if config.listen != self.config.listen:
            log.warning("listen address changes take effect on restart only")
        if config.storage != self.config.storage:
            log.warning("storage settings change on restart only")
        self.keys = keys
        self._config_digest = digest
        self.full_config = full
        self._apply(config)
        await self._sync_server_watchers()
        self.status.reload_ok = True
        self.status.reload_success_ts = time.time()
        if self._scheduler is not None:
            self._scheduler.reschedule()
        log.info("config reloaded: %d endpoints", len(config.endpoints))
        return True, "config reloaded"

    @property
    def rounds_completed(self) -> int:
        """Scheduled rounds finished so far."""
        return self._scheduler.rounds if self._scheduler else 0

    def _after_round(self) -> None:
        if self._window_cache is not None and self.writer is not None:
            # Fresh window figures right after a round instead of up to 30 s later.
            task = asyncio.create_task(self._refresh_windows())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.after_round is not None:
            self.after_round()

    async def _refresh_windows(self) -> None:
        if self.writer is not None and self._window_cache is not None:
            await self.writer.flush(timeout_s=5.0)
            await self._window_cache.refresh()
            await self._update_fleet_duty()

    # --- fleet-wide figures of a sharded fleet -----------------------------------------------------

    @property
    def exports_fleet(self) -> bool:
        """Whether this replica exports the fleet-wide figures now."""
        return self._fleet_duty

    @property
    def _shared_store(self) -> bool:
        """Runs go to PostgreSQL, which sharded replicas share (each SQLite file is a replica's own)."""
        return self.store is not None and resolve_dsn(self.config.storage) is not None

    def _fleet_owners(self) -> dict[str, int]:
        """The replica that probes each enabled endpoint of the fleet."""
        return {e.name: self.shard.owner(e.name) for e in self.full_config.enabled_endpoints}

    async def _update_fleet_duty(self) -> None:
        """Export the fleet-wide figures when no lower-numbered replica that probes something is live, i.e.
        has a run in the shared store from the last `takeover_after(interval)`; hand them back when one
        writes runs again. Until this replica has run that long, or without a shared store, the lower
        replicas are presumed live (so replica 0, or the lowest one that probes something, exports)."""
        if self.shard.count == 1:
            return
        owners = self._fleet_owners()
        live: set[int] | None = None
        after = takeover_after(self.config.schedule.interval)
        now = time.time()
        lower = any(i < self.shard.index for i in owners.values())
        if lower and self.store is not None and self._shared_store and now - self._started_at >= after:
            try:
                recent = await self.store.last_runs(now - after)
            except Exception as exc:  # keep the current duty; the next check tries again
                log.warning("shard %s: cannot tell which replicas are live: %s", self.shard.label, exc)
                return
            live = {owners[name] for name in recent if name in owners}
        duty = self.shard.exports_fleet(owners.values(), live)
        if duty != self._fleet_duty and duty:
            log.warning(
                "shard %s: no lower replica has written a run for %.0fs: exporting the fleet-wide figures",
                self.shard.label,
                after,
            )
        elif duty != self._fleet_duty:
            log.warning(
                "shard %s: a lower replica is live again: fleet-wide figures left to it", self.shard.label
            )
        self._fleet_duty = duty


    def _schedule_settings(self) -> tuple[float, float, RoundPlan]:
        s = self.config.schedule
        servers: dict[str, list[str]] = {}
        for ep in self.config.enabled_endpoints:
            servers.setdefault(server_key(ep.base_url), []).append(ep.name)
        return s.interval, s.offset, RoundPlan(servers, s.parallelism, s.per_server)

    @staticmethod
    def _window_rule(config: Config) -> WindowRule:
        return WindowRule.of(config.schedule.window_includes)

    @property
    def scheduler_stats(self) -> SchedulerStats | None:
        """The scheduler's own figures (None without a schedule)."""
        return self._scheduler.stats if self._scheduler is not None else None

    def _on_round(self, planned: float, started: float, following: float) -> None:
        self.status.lag_s = max(0.0, started - planned)
        self.status.last_round_ts = started
        self.status.next_round_ts = following

    # --- probing -----------------------------------------------------------------------------------

    async def probe(self, name: str, trigger: Trigger = "scheduled") -> ProbeOutcome:
        """Probe a configured endpoint now (joins a run already in flight) and record the result."""
        return await self.runner.run(name, trigger)

    async def probe_on_demand(self, name: str, wait_s: float | None) -> ProbeOutcome | None:
        """/probe: the endpoint's last run if it started within `on_demand_min_interval`, else a new run.

        Waits at most `wait_s` (the scraper's own timeout); a run still going then is not cut short (its
        timeout stays the endpoint's own) and is recorded when it ends; None is returned meanwhile.
        """
        last = self._last_outcome.get(name)
        min_interval = self.config.schedule.on_demand_min_interval
        if last is not None and time.time() - last.result.started_at < min_interval:
            return last
        run = asyncio.ensure_future(self.probe(name, "on_demand"))
        try:
            return await asyncio.wait_for(asyncio.shield(run), timeout=wait_s)
        except TimeoutError:
            return None

    def _start_probe(self, name: str, trigger: Trigger) -> asyncio.Future[ProbeOutcome]:
        return asyncio.ensure_future(self._probe_and_record(name, trigger))

    async def _probe_and_record(self, name: str, trigger: Trigger) -> ProbeOutcome:
        ep = self.config.endpoint(name)
        if ep is None or self._probe_http is None:
            raise KeyError(name)
        settings = self.config.probe_for(ep)
        plog = ProbeLog(self.keys.redactor)
        counters = self._counters.get(name)
        ctx = ProbeContext(
            endpoint=ep,
            settings=settings,
            http=self._probe_http,
            api_key=self.keys.get(name),
            log=plog,
            instance=self.instance,
            # Scraping and parsing the server's /metrics stays on this (main) loop.
            counters=_CountersOnLoop(counters.window, asyncio.get_running_loop()) if counters else None,
            stalls=self.measurement.monitor,
        )
        result = await self.measurement.call(_measured(ctx))
        result.trigger = trigger
        self.record(result)
        outcome = ProbeOutcome(result, plog)
        self._last_outcome[name] = outcome
        return outcome

    def record(self, result: RunResult) -> None:
        """Feed one timed run to every sink (metrics, window, store) and log it when it was not ok."""
        if not result.ok:
            log.info(
                "endpoint %s: %s%s%s",
                result.endpoint,
                result.status.value,
                f" ({result.error_class})" if result.error_class else "",
                f": {result.error_message}" if result.error_message else "",  # redacted by the probe
            )
        if result.timing_disturbed:
            log.info(
                "endpoint %s: timing disturbed (measurement loop stalled %.1f ms)",
                result.endpoint,
                (result.max_stall_s or 0.0) * 1e3,
            )
        self.probe_metrics.record(result)
        if self.writer is not None:
            self.writer.submit(result)  # never waits on the database
        else:
            self.windows.add(result)
        if (signals := self._ollama.get(result.endpoint)) is not None:
            signals.observe(result)


async def _open_client() -> HttpClient:
    client = HttpClient()
    await client.__aenter__()
    return client


async def _measured(ctx: ProbeContext) -> RunResult:
    """Warm-up and timed run on the measurement loop, with its stall monitor running throughout."""
    assert ctx.stalls is not None
    with ctx.stalls.watching():
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


def _digest_file(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
