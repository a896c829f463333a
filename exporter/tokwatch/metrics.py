"""Prometheus collectors for probe results: in-memory state, read (never computed with I/O) at scrape time.

Names, types and labels are the contract in docs/metrics.md.
"""

from __future__ import annotations

import bisect
import platform
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tokwatch import __version__
from tokwatch.result import CLIENT_SOURCES, RunResult, Status

if TYPE_CHECKING:
    from tokwatch.config import EndpointSettings
    from tokwatch.scheduler import SchedulerStats
    from tokwatch.window import WindowFigures, WindowSnapshot

_FLEET = "__fleet__"  # the window collector's part that is not an endpoint

# Buckets suited to LLM serving: TTFT spans ~10 ms (warm, local) to a minute (cold, overloaded); per-token
# gaps span a few ms (fast batched decode) to a second (stalls, preemption). 10-12 buckets each, dense where
# the figures usually fall (ITL 10-30 ms): every bucket is one series per endpoint, and at 1000 endpoints
# the exposition size is what a scrape costs (docs/performance.md).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)
E2E_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

HISTOGRAMS: dict[str, tuple[tuple[float, ...], str]] = {
    "tokwatch_ttft_seconds": (LATENCY_BUCKETS, "Time to first token of streamed probe runs."),
    "tokwatch_inter_token_latency_seconds": (
        TOKEN_GAP_BUCKETS,
        "Gap before each token after the first; a chunk of k tokens adds its gap and k-1 zeros.",
    ),
    "tokwatch_output_inter_token_latency_seconds": (
        TOKEN_GAP_BUCKETS,
        "Inter-token latency within the output phase (after reasoning) only.",
    ),
    "tokwatch_time_per_output_token_seconds": (TOKEN_GAP_BUCKETS, "(E2E - TTFT) / (tokens - 1) per run."),
    "tokwatch_e2e_latency_seconds": (E2E_BUCKETS, "End-to-end latency of completed probe runs."),
    "tokwatch_ttot_seconds": (
        LATENCY_BUCKETS,
        "Time from the last reasoning token to the first output token.",
    ),
}

EAGER_HISTOGRAMS = (
    "tokwatch_ttft_seconds",
    "tokwatch_inter_token_latency_seconds",
    "tokwatch_time_per_output_token_seconds",
    "tokwatch_e2e_latency_seconds",
)


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass
class EndpointState:
    """What the collectors know about one endpoint."""

    settings: EndpointSettings
    runs: dict[Status, int] = field(default_factory=lambda: dict.fromkeys(Status, 0))
    disturbed: int = 0  # timed runs flagged timing_disturbed
    last: RunResult | None = None
    last_ok: RunResult | None = None
    # The reasoning-phase histograms appear on first observation: for a model that does not reason they
    # would be 30 series of zeros per endpoint. The others exist from the start, so `increase()` sees the
    # first run after a restart.
    hist: dict[str, _Histogram] = field(
        default_factory=lambda: {n: _Histogram(HISTOGRAMS[n][0]) for n in EAGER_HISTOGRAMS}
    )
    revision: int = 0  # bumped on every change, so /metrics re-renders only this endpoint's part


class LabelSet:
    """`endpoint` plus the union of static label names over all endpoints (missing ones are empty)."""

    def __init__(self, endpoints: Sequence[EndpointSettings]) -> None:
        self.static = sorted({k for ep in endpoints for k in ep.labels})
        self.names = ["endpoint", *self.static]

    def values(self, ep: EndpointSettings) -> list[str]:
        """Label values for one endpoint, in `names` order."""
        return [ep.name, *(ep.labels.get(k, "") for k in self.static)]


class ProbeMetrics(Collector):
    """Probe results per endpoint; `record()` is called after every scheduled run."""

    def __init__(self) -> None:
        self._states: dict[str, EndpointState] = {}
        self._labels = LabelSet(())
        self._generation = 0  # bumped on reload: label names and settings may have changed

    def set_endpoints(self, endpoints: Sequence[EndpointSettings]) -> None:
        """Apply a (re)loaded config: keep history of endpoints that stay, drop removed ones."""
        states: dict[str, EndpointState] = {}
        for ep in endpoints:
            state = self._states.get(ep.name) or EndpointState(ep)
            state.settings = ep
            states[ep.name] = state
        self._states = states
        self._labels = LabelSet(endpoints)
        self._generation += 1

    def state(self, name: str) -> EndpointState | None:
        """Current state of one endpoint."""
        return self._states.get(name)

    def record(self, result: RunResult) -> None:
        """Account one timed run."""
        state = self._states.get(result.endpoint)
        if state is None:  # endpoint removed by a reload while its probe ran
            return
        state.revision += 1
        state.runs[result.status] += 1
        state.last = result
        if result.timing_disturbed:
            state.disturbed += 1
        # A disturbed run's client-side figures are off by the stall: they feed no histogram, and its tok/s
        # becomes the exported "last ok" figure only when it came from the server (docs/methodology.md).
        if result.ok and not (result.timing_disturbed and result.source in CLIENT_SOURCES):
            state.last_ok = result
        if result.status in (Status.OK, Status.DEGRADED) and not result.timing_disturbed:
            _observe(state, result)

    def describe(self) -> Iterable[Metric]:
        """No up-front description: families depend on config (see prometheus_client custom collectors)."""
        return []

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint (see tokwatch.exposition)."""
        gen = self._generation
        for name, state in self._states.items():
            yield name, (gen, state.revision)

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One endpoint's families."""
        state = self._states.get(str(key))
        return self._collect([state] if state is not None else [])

    def collect(self) -> Iterator[Metric]:
        """Families built from the in-memory snapshot."""
        return self._collect(list(self._states.values()))

    def _collect(self, states: Sequence[EndpointState]) -> Iterator[Metric]:
        names = self._labels.names
        fams = _Families(names)
        for state in states:
            lv = self._labels.values(state.settings)
            ep = state.settings
            fams.gauge(
                "tokwatch_endpoint_info",
                "What each endpoint is; always 1.",
                lv,
                1.0,
                extra={"kind": ep.kind, "model": ep.model},
            )
            for status, n in state.runs.items():
                fams.counter(
                    "tokwatch_probe_runs_total",
                    "Timed probe runs by status.",
                    lv,
                    n,
                    extra={"status": status.value},
                )
            fams.counter(
                "tokwatch_probe_timing_disturbed_total",
                "Timed runs whose timing the exporter's own lateness could have shifted (timing_disturbed).",
                lv,
                state.disturbed,
            )
            if state.last is not None:
                last_run_families(fams, lv, state.last, include_tps=False)
                fams.gauge(
                    "tokwatch_probe_last_run_timestamp_seconds",
                    "Unix time the last timed run started.",
                    lv,
                    state.last.started_at,
                )
            if state.last_ok is not None:
                ok = state.last_ok
                fams.gauge(
                    "tokwatch_probe_last_ok_timestamp_seconds",
                    "Unix time the last ok run started.",
                    lv,
                    ok.started_at,
                )
                if ok.tokens_per_second is not None and ok.source is not None:
                    fams.gauge(
                        "tokwatch_probe_decode_tokens_per_second",
                        "Decode tokens per second of the last ok run, by timing source.",
                        lv,
                        ok.tokens_per_second,
                        extra={"source": ok.source.value},
                    )
                fams.gauge(
                    "tokwatch_probe_server_shared",
                    "1 if the last ok run's server-counter window saw other requests.",
                    lv,
                    float(ok.server_shared),
                )
            for hname, (_, doc) in HISTOGRAMS.items():
                if (hist := state.hist.get(hname)) is not None:
                    fams.histogram(hname, doc, lv, hist)
        yield from fams.all()


def _observe(state: EndpointState, r: RunResult) -> None:
    def feed(name: str, values: Iterable[float]) -> None:
        hist = state.hist.get(name)
        for v in values:
            if hist is None:
                hist = state.hist[name] = _Histogram(HISTOGRAMS[name][0])
            hist.observe(v)

    feed("tokwatch_ttft_seconds", () if r.ttft_s is None else (r.ttft_s,))
    feed("tokwatch_inter_token_latency_seconds", r.itl_s)
    feed("tokwatch_output_inter_token_latency_seconds", r.output_itl_s)
    feed("tokwatch_time_per_output_token_seconds", () if r.tpot_s is None else (r.tpot_s,))
    feed("tokwatch_e2e_latency_seconds", () if r.e2e_s is None else (r.e2e_s,))
    feed("tokwatch_ttot_seconds", () if r.ttot_s is None else (r.ttot_s,))


class _Families:
    """Builds metric families with a shared base label set, one family per name."""

    def __init__(self, base_names: Sequence[str]) -> None:
        self._base = list(base_names)
        self._fams: dict[str, Metric] = {}

    def _family(self, cls: type, name: str, doc: str, extra: Sequence[str]) -> Metric:
        fam = self._fams.get(name)
        if fam is None:
            fam = cls(name, doc, labels=[*self._base, *extra])
            self._fams[name] = fam
        return fam

    def gauge(
        self, name: str, doc: str, lv: Sequence[str], value: float, extra: dict[str, str] | None = None
    ) -> None:
        extra = extra or {}
        fam = self._family(GaugeMetricFamily, name, doc, list(extra))
        fam.add_metric([*lv, *extra.values()], value)  # type: ignore[attr-defined]

    def counter(
        self, name: str, doc: str, lv: Sequence[str], value: float, extra: dict[str, str] | None = None
    ) -> None:
        extra = extra or {}
        fam = self._family(CounterMetricFamily, name.removesuffix("_total"), doc, list(extra))
        fam.add_metric([*lv, *extra.values()], value)  # type: ignore[attr-defined]

    def histogram(self, name: str, doc: str, lv: Sequence[str], h: _Histogram) -> None:
        fam = self._family(HistogramMetricFamily, name, doc, [])
        fam.add_metric(list(lv), h.buckets(), h.sum)  # type: ignore[attr-defined]

    def all(self) -> Iterator[Metric]:
        yield from self._fams.values()


def last_run_families(fams: _Families, lv: Sequence[str], r: RunResult, *, include_tps: bool) -> None:
    """Gauges describing one run; shared by /metrics (last run) and /probe (this run)."""
    fams.gauge("tokwatch_probe_success", "1 if the run was ok, else 0.", lv, float(r.ok))
    for status in Status:
        fams.gauge(
            "tokwatch_probe_status",
            "1 for the run's status, 0 for the others.",
            lv,
            float(r.status is status),
            extra={"status": status.value},
        )
    if r.duration_s is not None:
        fams.gauge("tokwatch_probe_duration_seconds", "Wall time of the timed run.", lv, r.duration_s)
    if r.e2e_s is not None:
        fams.gauge("tokwatch_probe_e2e_seconds", "End-to-end latency of the run.", lv, r.e2e_s)
    if r.ttft_s is not None:
        fams.gauge("tokwatch_probe_ttft_seconds", "Time to first token of the run.", lv, r.ttft_s)
    if r.ttot_s is not None:
        fams.gauge("tokwatch_probe_ttot_seconds", "Reasoning-to-output gap (TTOT) of the run.", lv, r.ttot_s)
    if r.output_tokens is not None:
        fams.gauge("tokwatch_probe_output_tokens", "Output tokens of the run.", lv, float(r.output_tokens))
    if r.think_tokens is not None:
        fams.gauge("tokwatch_probe_think_tokens", "Reasoning tokens of the run.", lv, float(r.think_tokens))
    if r.max_stall_s is not None:
        fams.gauge(
            "tokwatch_probe_max_stall_seconds",
            "Largest measurement-loop stall while the run streamed (timing_disturbed at the threshold).",
            lv,
            r.max_stall_s,
        )

    if include_tps and r.tokens_per_second is not None and r.source is not None:
        fams.gauge(
            "tokwatch_probe_decode_tokens_per_second",
            "Decode tokens per second, by timing source.",
            lv,
            r.tokens_per_second,
            extra={"source": r.source.value},
        )


def probe_result_families(result: RunResult, ep: EndpointSettings) -> list[Metric]:
    """The metrics `/probe?target=` returns for one run (blackbox-exporter style)."""
    labels = LabelSet([ep])
    fams = _Families(labels.names)
    last_run_families(fams, labels.values(ep), result, include_tps=True)
    out = list(fams.all())
    # trigger="on_demand" on every sample: Prometheus scraping both /metrics and /probe for one endpoint
    # keeps two distinct series, and the shipped rules read only the scheduled ones (`trigger=""`).
    for fam in out:
        fam.samples = [s._replace(labels={**s.labels, "trigger": "on_demand"}) for s in fam.samples]
    return out


_WINDOW_FAMILIES = (
    ("tokwatch_window_decode_tokens_per_second_median", "Median tok/s of ok runs in the window.", "median"),
    ("tokwatch_window_decode_tokens_per_second_stddev", "Sample stddev of ok-run tok/s.", "stddev"),
    ("tokwatch_window_decode_tokens_per_second_cv_ratio", "Coefficient of variation (stddev / mean).", "cv"),
    ("tokwatch_window_uptime_ratio", "ok runs / all runs in the window.", "uptime"),
    ("tokwatch_window_runs", "Runs in the window.", "runs"),
    ("tokwatch_window_ok_runs", "ok runs in the window.", "ok_runs"),
)


class WindowCollector(Collector):
    """`tokwatch_window_*` per endpoint and the fleet ratio, from the store cache or the memory window."""

    def __init__(
        self, snapshot: Callable[[], WindowSnapshot], *, export_fleet: bool | Callable[[], bool] = True
    ) -> None:
        self._snapshot = snapshot
        # One replica of a sharded fleet exports the fleet figures, the others do not; which one can change
        # while running (a replica takes over while a lower one is down), hence a callable.
        if callable(export_fleet):
            self._export_fleet = export_fleet
        else:
            always = bool(export_fleet)
            self._export_fleet = lambda: always
        self._parts_snapshot: WindowSnapshot | None = None  # the one `parts()` saw, for `collect_part`
        self._parts_static: tuple[str, ...] | None = None

    def describe(self) -> Iterable[Metric]:
        """Families depend on config; nothing up front."""
        return []

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint, revised when its figures change, and one for the fleet comparison."""
        snap = self._parts_snapshot = self._snapshot()
        static = self._parts_static = _static_names(snap)
        for name, fig in snap.figures.items():
            yield name, (fig, static, tuple(sorted(snap.static_labels.get(name, {}).items())))
        if self._export_fleet():
            yield _FLEET, (snap.fleet, snap.ranking)

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One endpoint's window figures, or the fleet comparison (from the snapshot `parts()` saw)."""
        snap = self._parts_snapshot or self._snapshot()
        if key == _FLEET:
            yield from self._fleet(snap)
            return
        fig = snap.figures.get(str(key))
        yield from self._figures(snap, [fig] if fig is not None else [], self._parts_static)

    def collect(self) -> Iterator[Metric]:
        """Yield the latest figures; a figure that is undefined (e.g. CV of one run) is left out."""
        snap = self._snapshot()
        yield from self._figures(snap, list(snap.figures.values()))
        if self._export_fleet():
            yield from self._fleet(snap)

    def _figures(
        self, snap: WindowSnapshot, figures: Sequence[WindowFigures], static: Sequence[str] | None = None
    ) -> Iterator[Metric]:
        static_names = list(static) if static is not None else _static_names(snap)
        label_names = ["endpoint", *static_names, "window"]
        for name, doc, attr in _WINDOW_FAMILIES:
            family = GaugeMetricFamily(name, doc, labels=label_names)
            for fig in figures:
                value = getattr(fig, attr)
                if value is None:
                    continue
                own = snap.static_labels.get(fig.endpoint, {})
                values = [fig.endpoint, *(own.get(k, "") for k in static_names), fig.window]
                family.add_metric(values, value)
            yield family

    @staticmethod
    def _fleet(snap: WindowSnapshot) -> Iterator[Metric]:
        fleet = GaugeMetricFamily(
            "tokwatch_fleet_fastest_vs_slowest_ratio",
            "Median tok/s of the fastest endpoint over that of the slowest (ok runs).",
            labels=["fastest", "slowest", "window"],
        )
        if snap.fleet is not None:
            fleet.add_metric([snap.fleet.fastest, snap.fleet.slowest, snap.fleet.window], snap.fleet.ratio)
        yield fleet
        medians = GaugeMetricFamily(
            "tokwatch_fleet_median_tokens_per_second",
            "Median tok/s of ok runs over the comparison window, per ranked endpoint.",
            labels=["endpoint", "window"],
        )
        rank = GaugeMetricFamily(
            "tokwatch_fleet_rank",
            "Place in the comparison ranking by median tok/s (1 = fastest).",
            labels=["endpoint", "window"],
        )
        faster = GaugeMetricFamily(
            "tokwatch_fleet_faster_than_next_ratio",
            "Median tok/s of an endpoint over that of the next slower one in the ranking.",
            labels=["endpoint", "next", "window"],
        )
        if snap.ranking is not None:
            window = snap.ranking.window
            for i, (name, median) in enumerate(snap.ranking.ranked, start=1):
                medians.add_metric([name, window], median)
                rank.add_metric([name, window], float(i))
            for pair in snap.ranking.neighbours():
                faster.add_metric([pair.fastest, pair.slowest, window], pair.ratio)
        yield from (medians, rank, faster)


def _static_names(snap: WindowSnapshot) -> tuple[str, ...]:
    return tuple(sorted({k for labels in snap.static_labels.values() for k in labels}))


@dataclass
class ExporterStatus:
    """The exporter's own health figures, updated by the app and scheduler."""

    interval_s: float = 0.0
    reload_ok: bool = False
    reload_success_ts: float = 0.0
    lag_s: float = 0.0
    last_round_ts: float = 0.0
    next_round_ts: float = 0.0


class ExporterCollector(Collector):
    """Self-metrics: build info, config reload, scheduler lag, probes in flight."""

    def __init__(
        self,
        status: ExporterStatus,
        in_flight: Callable[[], int],
        scheduler: Callable[[], SchedulerStats | None] = lambda: None,
    ) -> None:
        self._s = status
        self._in_flight = in_flight
        self._scheduler = scheduler

    def describe(self) -> Iterable[Metric]:
        """Static set, but described lazily like the others."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Families from the status object."""
        s = self._s
        info = GaugeMetricFamily(
            "tokwatch_build_info", "Build information; always 1.", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1.0)
        yield info
        yield GaugeMetricFamily(
            "tokwatch_config_last_reload_successful",
            "1 if the last configuration (re)load succeeded.",
            value=float(s.reload_ok),
        )
        yield GaugeMetricFamily(
            "tokwatch_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully.",
            value=s.reload_success_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_interval_seconds", "Configured probe interval.", value=s.interval_s
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_lag_seconds",
            "How late the last round started against its planned time.",
            value=s.lag_s,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_last_round_timestamp_seconds",
            "When the last round started.",
            value=s.last_round_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_scheduler_next_round_timestamp_seconds",
            "When the next round is planned.",
            value=s.next_round_ts,
        )
        yield GaugeMetricFamily(
            "tokwatch_probes_in_flight", "Probes running now.", value=float(self._in_flight())
        )
        stats = self._scheduler()
        if stats is not None:
            yield CounterMetricFamily(
                "tokwatch_scheduler_rounds", "Scheduled rounds completed.", value=stats.rounds
            )
            yield CounterMetricFamily(
                "tokwatch_scheduler_skipped_rounds",
                "Planned rounds not run because the previous round overran them.",
                value=stats.skipped_slots,
            )
            yield CounterMetricFamily(
                "tokwatch_scheduler_crashes",
                "Times the scheduler loop failed and was restarted.",
                value=stats.crashes,
            )
            yield GaugeMetricFamily(
                "tokwatch_scheduler_up",
                "1 while the scheduler runs, 0 while it restarts after a crash (/-/ready answers 503).",
                value=float(stats.running),
            )
