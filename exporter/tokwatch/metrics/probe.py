"""Per-run metrics: what each endpoint's timed probe runs measured, from memory, and `/probe`'s answer.

Names, types and labels are the contract in docs/metrics.md.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tokwatch.figures.result import RunResult, Status
from tokwatch.figures.series import DEFAULT_WORKLOAD, NO_SITE

if TYPE_CHECKING:
    from tokwatch.settings.config import EndpointSettings

# OpenTelemetry GenAI semantic conventions' advisory boundaries (gen_ai.server.time_to_first_token,
# gen_ai.server.time_per_output_token, gen_ai.server.request.duration): dense where LLM latencies fall (TTFT
# 1 ms-10 s, per-token gaps 10 ms-2.5 s), and the same buckets every GenAI dashboard reads. Off by default
# (`metrics.histograms`): the exact window percentiles (`tokwatch_window_ttft_percentile_seconds`) and the
# per-run gauges answer the same questions at a fraction of the series.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TOKEN_GAP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

HISTOGRAMS: dict[str, tuple[tuple[float, ...], str]] = {
    "tokwatch_ttft_seconds": (TTFT_BUCKETS, "Time to first token of streamed probe runs."),
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
        TTFT_BUCKETS,
        "Time from the last reasoning token to the first output token.",
    ),
}

EAGER_HISTOGRAMS = (
    "tokwatch_ttft_seconds",
    "tokwatch_inter_token_latency_seconds",
    "tokwatch_time_per_output_token_seconds",
    "tokwatch_e2e_latency_seconds",
)


@dataclass(frozen=True)
class SeriesOptions:
    """The opt-in series of /metrics (config `metrics:`; docs/metrics.md, "Series budget")."""

    histograms: bool = False
    diagnostics: bool = False


STATUS_ORDER = {status: i for i, status in enumerate(Status)}  # series in a stable order, as before


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
    """What the collectors know about one endpoint's runs of one workload."""

    settings: EndpointSettings
    workload: str = DEFAULT_WORKLOAD
    # Runs by status, a status from its first run on: seven series of zeros per series would be most of a
    # healthy endpoint's counters (issue 36).
    runs: Counter[Status] = field(default_factory=Counter)
    disturbed: int = 0  # timed runs flagged timing_disturbed
    set_aside: dict[tuple[str, str], int] = field(default_factory=dict)  # (figure, reason) -> runs
    cache_assisted: int = 0  # timed runs the prefix cache helped beyond the chat template's preamble
    prompt_size_missed: int = 0  # timed runs whose prompt the server counted off the workload's size
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
    """`endpoint` plus the union of static label names over all endpoints (missing ones are empty), and
    `site` when the exporter has one; per-run series add `workload` (`run_names`)."""

    def __init__(self, endpoints: Sequence[EndpointSettings], site: str = NO_SITE) -> None:
        self.static = sorted({k for ep in endpoints for k in ep.labels})
        self.site = site
        self.names = ["endpoint", *self.static, *(["site"] if site else [])]
        self.run_names = [*self.names, "workload"]

    def values(self, ep: EndpointSettings) -> list[str]:
        """Label values for one endpoint, in `names` order."""
        return [ep.name, *(ep.labels.get(k, "") for k in self.static), *([self.site] if self.site else [])]

    def run_values(self, ep: EndpointSettings, workload: str) -> list[str]:
        """Label values for one endpoint's runs of one workload, in `run_names` order."""
        return [*self.values(ep), workload]


class ProbeMetrics(Collector):
    """Probe results per endpoint and workload; `record()` is called after every timed run. One part per
    endpoint (all its workloads).

    Sample (`endpoint` plus the union of static labels, `site` when configured, on every family; `workload`
    on every per-run family)::

        tokwatch_endpoint_info{endpoint="a",gpu="3090",kind="openai",model="m1"} 1.0
        tokwatch_probe_tls_cert_expiry_timestamp_seconds{endpoint="a",gpu="3090"} 1.767e+09
        tokwatch_probe_tls_earliest_cert_expiry_timestamp_seconds{endpoint="a",gpu="3090"} 1.767e+09
        tokwatch_probe_runs_total{endpoint="a",gpu="3090",workload="seed000",status="ok"} 4.0
        tokwatch_probe_timing_disturbed_total{endpoint="a",gpu="3090",workload="seed000"} 1.0
        tokwatch_probe_figures_set_aside_total{endpoint="a",gpu="3090",workload="seed000",figure="itl",reason="client_stall"} 1.0  (opt-in)
        tokwatch_probe_success{endpoint="a",gpu="3090",workload="seed000"} 1.0
        tokwatch_probe_status{endpoint="a",gpu="3090",workload="seed000",status="ok"} 1.0
        tokwatch_probe_ttft_seconds{endpoint="a",gpu="3090",workload="seed000"} 0.2
        tokwatch_probe_phase_seconds{endpoint="a",gpu="3090",workload="seed000",phase="connect"} 0.021
        tokwatch_probe_last_ok_timestamp_seconds{endpoint="a",gpu="3090",workload="seed000"} 1.7000072e+09
        tokwatch_probe_decode_tokens_per_second{endpoint="a",gpu="3090",workload="short",source="engine"} 96.0
        tokwatch_probe_prefill_tokens_per_second{endpoint="a",gpu="3090",workload="long",source="engine"} 2150
        tokwatch_ttft_seconds_bucket{endpoint="a",gpu="3090",workload="seed000",le="0.25"} 3.0   (opt-in)
        tokwatch_inter_token_latency_seconds_count{endpoint="a",gpu="3090",workload="seed000"} 12.0  (opt-in)
    """  # noqa: E501

    def __init__(self) -> None:
        self._endpoints: dict[str, EndpointSettings] = {}
        self._states: dict[tuple[str, str], EndpointState] = {}
        self._workloads: dict[str, list[str]] = {}
        self._revisions: dict[str, int] = {}
        self._labels = LabelSet(())
        self._generation = 0  # bumped on reload: label names and settings may have changed
        # Per endpoint, not per workload: the certificates its last timed run's connection showed.
        self._cert_expiry: dict[str, tuple[float, float]] = {}
        # Whether the info series carry `tls_insecure_skip_verify` (only when an endpoint sets it, so the
        # series of every other configuration stay as they were).
        self._insecure_label = False
        self._options = SeriesOptions()

    def set_endpoints(
        self,
        endpoints: Sequence[EndpointSettings],
        workloads: Mapping[str, Sequence[str]] | None = None,
        site: str = NO_SITE,
        options: SeriesOptions | None = None,
    ) -> None:
        """Apply a (re)loaded config: each endpoint's workloads (seed000 alone when not given), the
        exporter's site and its opt-in series; history of endpoints and workloads that stay is kept, removed
        ones are dropped."""
        self._options = options or SeriesOptions()
        states: dict[tuple[str, str], EndpointState] = {}
        self._workloads = {
            ep.name: list(workloads.get(ep.name, ())) if workloads is not None else [DEFAULT_WORKLOAD]
            for ep in endpoints
        }
        for ep in endpoints:
            for w in self._workloads[ep.name]:
                state = self._states.get((ep.name, w)) or EndpointState(ep, w)
                state.settings = ep
                states[(ep.name, w)] = state
        self._states = states
        self._endpoints = {ep.name: ep for ep in endpoints}
        https = {ep.name for ep in endpoints if ep.base_url.lower().startswith("https://")}
        self._cert_expiry = {name: v for name, v in self._cert_expiry.items() if name in https}
        self._insecure_label = any(_insecure(ep) for ep in endpoints)
        self._labels = LabelSet(endpoints, site)
        self._generation += 1

    def state(self, name: str, workload: str | None = None) -> EndpointState | None:
        """Current state of one endpoint's runs of a workload (its first when None)."""
        names = self._workloads.get(name)
        if not names:
            return None
        return self._states.get((name, workload or names[0]))

    def record(self, result: RunResult) -> None:
        """Account one timed run."""
        state = self._states.get((result.endpoint, result.workload))
        if state is None:  # endpoint or workload removed by a reload while its probe ran
            return
        self._revisions[result.endpoint] = self._revisions.get(result.endpoint, 0) + 1
        state.revision += 1
        state.runs[result.status] += 1
        state.last = result
        if result.tls_cert_expiry_s is not None and result.tls_earliest_cert_expiry_s is not None:
            self._cert_expiry[result.endpoint] = (result.tls_cert_expiry_s, result.tls_earliest_cert_expiry_s)
        if result.timing_disturbed:
            state.disturbed += 1
        for key in result.set_aside.items():
            state.set_aside[key] = state.set_aside.get(key, 0) + 1
        # A figure a client stall could have moved beyond its tolerance feeds no histogram, and a tok/s set
        # aside does not become the exported "last ok" figure (docs/methodology.md, "Disturbance").
        state.cache_assisted += result.cache_assisted
        state.prompt_size_missed += result.prompt_size_missed
        if result.ok and not result.tps_set_aside:
            state.last_ok = result
        if self._options.histograms and result.status in (Status.OK, Status.DEGRADED):
            _observe(state, result)

    def describe(self) -> Iterable[Metric]:
        """No up-front description: families depend on config (see prometheus_client custom collectors)."""
        return []

    def parts(self) -> Iterator[tuple[Hashable, Hashable]]:
        """One part per endpoint (see tokwatch.metrics.exposition)."""
        gen = self._generation
        for name in self._endpoints:
            yield name, (gen, self._revisions.get(name, 0))

    def collect_part(self, key: Hashable) -> Iterator[Metric]:
        """One endpoint's families."""
        return self._collect([str(key)] if str(key) in self._endpoints else [])

    def collect(self) -> Iterator[Metric]:
        """Families built from the in-memory snapshot."""
        return self._collect(list(self._endpoints))

    def _collect(self, names: Sequence[str]) -> Iterator[Metric]:
        info = _Families(self._labels.names)
        fams = _Families(self._labels.run_names)
        for name in names:
            ep = self._endpoints[name]
            lv = self._labels.values(ep)
            extra = {"kind": ep.kind, "model": ep.model}
            if self._insecure_label:
                extra["tls_insecure_skip_verify"] = "true" if _insecure(ep) else "false"
            info.gauge("tokwatch_endpoint_info", "What each endpoint is; always 1.", lv, 1.0, extra=extra)
            if (expiry := self._cert_expiry.get(name)) is not None:
                info.gauge(
                    "tokwatch_probe_tls_cert_expiry_timestamp_seconds",
                    "Unix time the endpoint's TLS leaf certificate expires (notAfter), as its last timed "
                    "run's connection showed it.",
                    lv,
                    expiry[0],
                )
                info.gauge(
                    "tokwatch_probe_tls_earliest_cert_expiry_timestamp_seconds",
                    "Unix time the first of the certificates the endpoint's server sent expires.",
                    lv,
                    expiry[1],
                )
            for w in self._workloads.get(name, ()):
                self._series(fams, self._states[(name, w)])
        yield from info.all()
        yield from fams.all()

    def _series(self, fams: _Families, state: EndpointState) -> None:
        """The families of one endpoint's runs of one workload."""
        lv = self._labels.run_values(state.settings, state.workload)
        diagnostics = self._options.diagnostics
        for status, n in sorted(state.runs.items(), key=lambda kv: STATUS_ORDER[kv[0]]):
            fams.counter(
                "tokwatch_probe_runs_total",
                "Timed probe runs by status (a status from its first run on).",
                lv,
                n,
                extra={"status": status.value},
            )
        fams.counter(
            "tokwatch_probe_timing_disturbed_total",
            "Timed runs with a client-timed figure set aside (timing_disturbed).",
            lv,
            state.disturbed,
        )
        # Per figure from its first set-aside run on, and only as a diagnostic: the run counter above says
        # how often; the stored runs and the API say which figure.
        for (figure, reason), n in sorted(state.set_aside.items()) if diagnostics else ():
            fams.counter(
                "tokwatch_probe_figures_set_aside_total",
                "Client-timed figures set aside: a client stall bounds their error above the tolerance.",
                lv,
                n,
                extra={"figure": figure, "reason": reason},
            )
        if diagnostics:  # the prompt's checks: the stored runs, the API and the status page carry them
            fams.counter(
                "tokwatch_probe_cache_assisted_total",
                "Timed runs the server's prefix cache served beyond the chat template's preamble.",
                lv,
                state.cache_assisted,
            )
            fams.counter(
                "tokwatch_probe_prompt_size_missed_total",
                "Timed runs whose prompt the server counted off the workload's input size beyond tolerance.",
                lv,
                state.prompt_size_missed,
            )
        if state.last is not None:
            last_run_families(
                fams, lv, state.last, include_tps=False, diagnostics=diagnostics, statuses=state.runs.keys()
            )
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
                if diagnostics:
                    _tps_error(fams, lv, ok)
            if diagnostics:
                fams.gauge(
                    "tokwatch_probe_server_shared",
                    "1 if the last ok run's server-counter window saw other requests.",
                    lv,
                    float(ok.server_shared),
                )
            prefill_family(fams, lv, ok)
        for hname, (_, doc) in HISTOGRAMS.items() if self._options.histograms else ():
            if (hist := state.hist.get(hname)) is not None:
                fams.histogram(hname, doc, lv, hist)


def _insecure(ep: EndpointSettings) -> bool:
    return ep.tls_config is not None and ep.tls_config.insecure_skip_verify


def _observe(state: EndpointState, r: RunResult) -> None:
    """Every latency figure of the run that was not set aside."""

    def feed(name: str, figure: str, values: Iterable[float]) -> None:
        if figure in r.set_aside:
            return
        hist = state.hist.get(name)
        for v in values:
            if hist is None:
                hist = state.hist[name] = _Histogram(HISTOGRAMS[name][0])
            hist.observe(v)

    feed("tokwatch_ttft_seconds", "ttft", () if r.ttft_s is None else (r.ttft_s,))
    feed("tokwatch_inter_token_latency_seconds", "itl", r.itl_s)
    feed("tokwatch_output_inter_token_latency_seconds", "itl", r.output_itl_s)
    feed("tokwatch_time_per_output_token_seconds", "tpot", () if r.tpot_s is None else (r.tpot_s,))
    feed("tokwatch_e2e_latency_seconds", "e2e", () if r.e2e_s is None else (r.e2e_s,))
    feed("tokwatch_ttot_seconds", "ttot", () if r.ttot_s is None else (r.ttot_s,))


def _tps_error(fams: _Families, lv: Sequence[str], r: RunResult) -> None:
    """The bound beside a run's exported tok/s (when the run was watched for stalls)."""
    if r.tps_error_ratio is not None:
        fams.gauge(
            "tokwatch_probe_decode_tokens_per_second_error_ratio",
            "Bound on the relative error the client's lateness can put in that tok/s (0: a server figure).",
            lv,
            r.tps_error_ratio,
        )


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


def last_run_families(
    fams: _Families,
    lv: Sequence[str],
    r: RunResult,
    *,
    include_tps: bool,
    diagnostics: bool = True,
    statuses: Iterable[Status] = tuple(Status),
) -> None:
    """Gauges describing one run; shared by /metrics (last run: the `statuses` its series has seen, the
    error bounds and stall only with `diagnostics`) and /probe (this run, every status and figure)."""
    fams.gauge("tokwatch_probe_success", "1 if the run was ok, else 0.", lv, float(r.ok))
    for status in sorted({*statuses, r.status}, key=STATUS_ORDER.__getitem__):
        fams.gauge(
            "tokwatch_probe_status",
            "1 for the run's status, 0 for the other statuses its series has had.",
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
    if diagnostics and r.ttft_s is not None and r.ttft_error_s is not None:
        fams.gauge(
            "tokwatch_probe_ttft_error_seconds",
            "Bound on the error the client's lateness can have put in that TTFT.",
            lv,
            r.ttft_error_s,
        )
    if r.ttot_s is not None:
        fams.gauge("tokwatch_probe_ttot_seconds", "Reasoning-to-output gap (TTOT) of the run.", lv, r.ttot_s)
    if r.output_tokens is not None:
        fams.gauge("tokwatch_probe_output_tokens", "Output tokens of the run.", lv, float(r.output_tokens))
    # A model that does not reason reports 0 on every run: no series for it.
    if r.think_tokens:
        fams.gauge("tokwatch_probe_think_tokens", "Reasoning tokens of the run.", lv, float(r.think_tokens))
    if r.prompt_tokens is not None:
        fams.gauge(
            "tokwatch_probe_prompt_tokens",
            "Prompt tokens of the run, as the server counted them.",
            lv,
            float(r.prompt_tokens),
        )
    if diagnostics and r.cached_tokens is not None:
        fams.gauge(
            "tokwatch_probe_cached_prompt_tokens",
            "Prompt tokens of the run the server served from its prefix cache.",
            lv,
            float(r.cached_tokens),
        )
    for phase, seconds in r.network_phases().items():
        fams.gauge(
            "tokwatch_probe_phase_seconds",
            "Network phases of the run, by blackbox_exporter's names: resolve, connect, tls (setting up its "
            "connection in this round; 0 if kept open), proxy_connect (through a proxy: its tunnel's "
            "set-up), processing (request sent to first response byte).",
            lv,
            seconds,
            extra={"phase": phase},
        )
    if diagnostics and r.max_stall_s is not None:
        fams.gauge(
            "tokwatch_probe_max_stall_seconds",
            "Largest measurement-loop stall while the run streamed.",
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
        _tps_error(fams, lv, r)
    if include_tps:
        prefill_family(fams, lv, r)


def prefill_family(fams: _Families, lv: Sequence[str], r: RunResult) -> None:
    """The run's prefill tok/s by source (when it has one)."""
    if r.prefill_tokens_per_second is not None and r.prefill_source is not None:
        fams.gauge(
            "tokwatch_probe_prefill_tokens_per_second",
            "Prefill tokens per second (prompt tokens computed over the prefill time), by source.",
            lv,
            r.prefill_tokens_per_second,
            extra={"source": r.prefill_source.value},
        )


def probe_result_families(result: RunResult, ep: EndpointSettings, site: str = NO_SITE) -> list[Metric]:
    """The metrics `/probe?target=` returns for one run (blackbox-exporter style)."""
    labels = LabelSet([ep], site)
    fams = _Families(labels.run_names)
    lv = labels.run_values(ep, result.workload)
    last_run_families(fams, lv, result, include_tps=True)
    if result.tls_cert_expiry_s is not None and result.tls_earliest_cert_expiry_s is not None:
        # blackbox_exporter's probe_ssl_earliest_cert_expiry, for a /probe caller
        fams.gauge(
            "tokwatch_probe_tls_cert_expiry_timestamp_seconds",
            "Unix time the endpoint's TLS leaf certificate expires (notAfter).",
            lv,
            result.tls_cert_expiry_s,
        )
        fams.gauge(
            "tokwatch_probe_tls_earliest_cert_expiry_timestamp_seconds",
            "Unix time the first of the certificates the endpoint's server sent expires.",
            lv,
            result.tls_earliest_cert_expiry_s,
        )
    out = list(fams.all())
    # trigger="on_demand" on every sample: Prometheus scraping both /metrics and /probe for one endpoint
    # keeps two distinct series, and the shipped rules read only the scheduled ones (`trigger=""`).
    for fam in out:
        fam.samples = [s._replace(labels={**s.labels, "trigger": "on_demand"}) for s in fam.samples]
    return out
