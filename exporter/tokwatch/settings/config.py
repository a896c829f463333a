"""The exporter's typed configuration (tokwatch.yml): pydantic models, loaded through
tokwatch.settings.strict_yaml so
that every error names file, line and field."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from tokwatch.figures.result import TimingSource
from tokwatch.settings.access import (
    AuthSettings,
    HeaderValue,
    base_url_fields,
    check_endpoint_reach,
    headers_fields,
    path_fields,
    text_fields,
)
from tokwatch.settings.kinds import Kind
from tokwatch.settings.pricing import Pricing, PricingSettings
from tokwatch.settings.reach import (
    NoProxy,
    ProxyPasswordFile,
    ProxyUrl,
    TlsConfig,
    check_proxy_fields,
    inherit_reach,
)
from tokwatch.settings.setting_values import (
    MAX_HORIZON_S,
    check_http_url,
    duration_fields,
    horizon_fields,
    parse_listen,
    parse_positive_duration,
    positive_duration_fields,
    ratio_fields,
    window_label,
)
from tokwatch.settings.site_offset import site_offset
from tokwatch.settings.strict_yaml import ConfigError, StrictModel, read_config_file, validate_yaml
from tokwatch.settings.workloads import SEED000, Workload, check_workloads
from tokwatch.tracing.extra import require_otel

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:9477"
DEFAULT_PROMPT = "Explain theory of relativity simply"
DEFAULT_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 30.0

_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SITE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RESERVED_LABELS = frozenset(
    {
        "endpoint", "status", "source", "le", "quantile", "kind", "model", "instance", "job", "phase",
        "metric", "workload", "window", "percentile",
    }
)  # fmt: skip


class Tolerance(StrictModel):
    """How far the client's own lateness may have moved a client-timed figure before the figure is set
    aside (docs/methodology.md, "Disturbance"): a relative bound for tok/s, and for latencies (TTFT, ITL
    percentiles, TPOT, TTOT, E2E) the larger of an absolute floor and a share of the figure."""

    tokens_per_second: float = 0.01
    latency: float = 0.05
    latency_floor: float = 0.001
    _ratios = ratio_fields("tokens_per_second", "latency")
    _floor = positive_duration_fields("latency_floor")

    def latency_limit(self, value_s: float) -> float:
        """The largest error bound a latency figure of `value_s` seconds may carry and still count."""
        return max(self.latency_floor, self.latency * value_s)


class ProbeSettings(StrictModel):
    """What a probe sends and how a run is judged; endpoints may override some of it."""

    prompt: str = DEFAULT_PROMPT
    system_prompt: str | None = None
    max_tokens: int = Field(256, ge=1, le=131072)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    stream: bool = True
    warmup: bool = True
    # The timed run's prompt starts with a unique prefix, so its TTFT is prefill on a loaded model, never a
    # prompt-cache hit left by the warm-up ("same": the old behaviour, identical prompts).
    timed_prompt: Literal["unique", "same"] = "unique"
    # ignore_eos/min_tokens so the server generates exactly max_tokens; None = where the kind supports it.
    fixed_output: bool | None = None
    short_output: Literal["degraded", "ok"] = "degraded"
    timing_preference: tuple[TimingSource, ...] = (
        TimingSource.ENGINE,
        TimingSource.VLLM_METRICS,
        TimingSource.SERVER_WALL,
        TimingSource.CLIENT_STREAM,
        TimingSource.CLIENT_WALL,
    )
    # What to do with a counter-delta figure whose window saw other requests.
    shared_server_window: Literal["flag", "fallback"] = "fallback"
    max_response_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # A tok/s above this cannot come from a real decode (the fastest single-stream serving is a few
    # thousand tok/s): such a run is garbage, not a record.
    max_plausible_tokens_per_second: float = Field(20000.0, gt=0)
    # A client-timed figure whose error bound (from the measurement loop's stalls) exceeds its tolerance is
    # set aside; the run's status, and every server-sourced figure, always count.
    tolerance: Tolerance = Field(default_factory=Tolerance)
    # The setting `tolerance` replaced: named only to say so when an old config still sets it.
    disturbance_threshold: None = None
    # What each timed run sends (tokwatch.settings.workloads); seed000 alone by default. Endpoints may
    # override.
    workloads: tuple[Workload, ...] = (SEED000,)
    # A sized prompt whose server-counted size misses the workload's input_tokens by more than this share
    # is flagged `prompt_size_missed`.
    prompt_tolerance: float = Field(0.10, gt=0.0, lt=1.0)
    # Cached prompt tokens a fresh prompt may get from the chat template's own preamble (its default system
    # prompt, which every request shares); a run with more is `cache_assisted`. Endpoints may override.
    cache_preamble_tokens: int = Field(64, ge=0)
    # Every endpoint's TLS and proxy settings unless it sets its own (tokwatch.settings.reach.inherit_reach).
    tls_config: TlsConfig | None = None
    proxy_url: ProxyUrl | None = None
    proxy_password_file: ProxyPasswordFile | None = None
    proxy_from_environment: bool | None = None
    no_proxy: NoProxy | None = None

    @model_validator(mode="after")
    def _proxy(self) -> ProbeSettings:
        check_proxy_fields(self)
        return self

    @field_validator("disturbance_threshold", mode="before")
    @classmethod
    def _replaced(cls, v: Any) -> None:
        raise ValueError(
            "replaced by probe.tolerance: a stall now sets aside only the figures it could have moved beyond "
            "their tolerance (docs/configuration.md)"
        )

    @field_validator("workloads")
    @classmethod
    def _workloads(cls, v: tuple[Workload, ...]) -> tuple[Workload, ...]:
        return check_workloads(v)

    @field_validator("timing_preference")
    @classmethod
    def _unique_sources(cls, v: tuple[TimingSource, ...]) -> tuple[TimingSource, ...]:
        if not v:
            raise ValueError("needs at least one timing source")
        if len(set(v)) != len(v):
            raise ValueError("lists a timing source twice")
        return v


MAX_WINDOWS = 8  # window figures are exported per window: a bounded `window` label


class ScheduleSettings(StrictModel):
    """When rounds run: every `interval`, aligned so rounds start at `offset` past the interval boundary."""

    interval: float = 3600.0
    offset: float = 1800.0
    parallelism: int = Field(4, ge=1, le=64)  # servers (host:port) probed at once
    per_server: int = Field(1, ge=1, le=64)  # probes at once against one server
    # /probe?target= within this long after the endpoint's last run returns that run instead of probing.
    on_demand_min_interval: float = 60.0
    # What the window figures (median, CV, uptime, fleet comparison) take in besides scheduled runs and the
    # tok/s figures within tolerance: "on_demand" (/probe runs) and/or "timing_disturbed" (tok/s figures a
    # client stall set aside).
    window_includes: tuple[Literal["on_demand", "timing_disturbed"], ...] = ()
    window: float = 86400.0  # always among the exported windows; storage off: the fleet comparison's
    # Every window the window figures (median, CV, uptime, p50/p90/p99...) are computed and exported over,
    # besides `window`: 30 min and 1 day uptime as OpenRouter's, 72 h as Artificial Analysis' headline.
    windows: tuple[float, ...] = Field((1800.0, 86400.0, 259200.0, 604800.0), max_length=MAX_WINDOWS)
    run_on_start: bool = (
        True  # one round at start-up, so a restart does not leave the gauges empty for an hour
    )
    _durations = positive_duration_fields("interval", "on_demand_min_interval")
    _horizons = horizon_fields("window")
    _offsets = duration_fields("offset")

    @model_validator(mode="after")
    def _check(self) -> ScheduleSettings:
        if self.interval < 1:
            raise ValueError("interval must be at least 1s")
        # The default 30m applies to intervals longer than it; shorter ones start at 0
        # (tokwatch.settings.config's
        # round_schedule), shifted by the site like any offset not configured.
        if "offset" in self.model_fields_set and self.offset >= self.interval:
            raise ValueError(f"offset ({self.offset:g}s) must be shorter than interval ({self.interval:g}s)")
        return self

    @field_validator("windows", mode="before")
    @classmethod
    def _windows(cls, v: Any) -> Any:
        return _durations_list(v, "windows")


def _durations_list(v: Any, what: str) -> Any:
    """A list of durations (`[30m, 24h]` or seconds) as whole seconds; ValueError naming the bad item."""
    if not isinstance(v, list | tuple):
        return v
    out = []
    for item in v:
        try:
            out.append(parse_positive_duration(item, MAX_HORIZON_S))
        except ValueError as exc:
            raise ValueError(f"{what}: {item!r}: {exc}") from None
    if any(s != int(s) for s in out):
        raise ValueError(f"{what}: a window is a whole number of seconds")
    return out


class MetricsSettings(StrictModel):
    """What /metrics exports beyond its default series budget (docs/metrics.md, "Series budget"); the API,
    the status page, the store and `tokwatch report` carry every figure whatever this says."""

    # Windows the `tokwatch_window_*` families are exported over (`window` label); None: schedule.window
    # (24h) alone. Each must be one of the configured window lengths (schedule.window, schedule.windows).
    windows: tuple[float, ...] | None = Field(None, min_length=1, max_length=MAX_WINDOWS)
    # The latency histograms (TTFT, TTOT, ITL, TPOT, E2E) with LLM-fit buckets: 16-19 series each.
    histograms: bool = False
    # Per-run error bounds, the per-figure set-aside counter and the window's run breakdown.
    diagnostics: bool = False

    @field_validator("windows", mode="before")
    @classmethod
    def _windows(cls, v: Any) -> Any:
        return _durations_list(v, "windows")


class StorageSettings(StrictModel):
    """Where every run is kept: PostgreSQL when a DSN is set, else an embedded SQLite file."""

    dsn: SecretStr | None = None
    sqlite_path: str | None = None
    outbox_path: str | None = None
    retention: float = 400 * 86400.0
    enabled: bool = True
    # Runs held in memory when the outbox cannot be written.
    queue_size: int = Field(10000, ge=1, le=10_000_000)
    pool_size: int = Field(4, ge=1, le=64)  # PostgreSQL connections
    write_timeout: float = 5.0  # a write slower than this fails; its runs stay in the outbox
    compress_after: float = 7 * 86400.0  # TimescaleDB: compress chunks older than this
    timescale: bool = True  # use TimescaleDB when the extension is available
    _durations = positive_duration_fields("write_timeout")
    _horizons = horizon_fields("retention", "compress_after")


class OtlpSettings(StrictModel):
    """Spans of the timed probe runs, sent over OTLP/HTTP (docs/tracing.md; needs the `otel` extra)."""

    # The receiver: http(s)://host:4318 (traces go to /v1/traces) or a full traces URL. None: no spans.
    endpoint: str | None = None
    service_name: str = Field("tokwatch", min_length=1)  # the spans' service.name

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None:
            check_http_url(v)
            require_otel()  # the one-line error naming the extra
        return v


class EndpointSettings(StrictModel):
    """One probed endpoint."""

    name: str
    kind: Kind
    base_url: str
    model: str
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    timeout: float | None = None
    enabled: bool = True
    labels: dict[str, str] = Field(default_factory=dict)
    # Other names the answer's `model` may carry for this endpoint ("*": any; see methodology).
    model_aliases: tuple[str, ...] = ()
    stream: bool | None = None
    prompt: str | None = None
    system_prompt: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=131072)
    ollama_api: Literal["chat", "generate"] = "chat"
    extra_body: dict[str, Any] = Field(default_factory=dict)
    metrics_url: str | None = None
    scrape_interval: float = 15.0
    mirror_metrics: tuple[str, ...] = ()
    renamed_from: tuple[str, ...] = ()
    # This endpoint's own workloads instead of probe.workloads.
    workloads: tuple[Workload, ...] | None = None
    # The model's context length where known: a workload that cannot fit is a config error.
    context_tokens: int | None = Field(None, ge=1)
    # A local HuggingFace tokenizer.json of the model: sized prompts are counted with it (else estimated).
    tokenizer: str | None = None
    cache_preamble_tokens: int | None = Field(None, ge=0)
    # How requests reach it beyond the URL (tokwatch.settings.access): headers, secret ones, query, auth,
    # path.
    headers: dict[str, str | HeaderValue] = Field(default_factory=dict)
    secret_headers: tuple[str, ...] = ()
    query: dict[str, str] = Field(default_factory=dict)
    auth: AuthSettings | None = None
    path: str | None = None
    # How it is reached (tokwatch.settings.reach, blackbox_exporter's names); unset: probe's.
    tls_config: TlsConfig | None = None
    proxy_url: ProxyUrl | None = None
    proxy_password_file: ProxyPasswordFile | None = None
    proxy_from_environment: bool | None = None
    no_proxy: NoProxy | None = None
    # What its tokens cost (tokwatch.settings.pricing; docs/configuration.md, "Pricing"): over
    # pricing.models, the price table and OpenRouter's list, field by field.
    pricing: Pricing | None = None
    # A DCGM exporter's or node_exporter's /metrics that shows the power of the server's GPUs (or CPUs),
    # sampled every `power_scrape_interval` apart from the probes (docs/methodology.md, "Cost and energy").
    power_metrics_url: str | None = None
    power_scrape_interval: float = 1.0
    _durations = positive_duration_fields("timeout", "scrape_interval", "power_scrape_interval")
    _headers = headers_fields("headers")
    _texts = text_fields("headers", "query")
    _path = path_fields("path")
    _base_url = base_url_fields("base_url")

    @field_validator("workloads")
    @classmethod
    def _workloads(cls, v: tuple[Workload, ...] | None) -> tuple[Workload, ...] | None:
        return v if v is None else check_workloads(v)

    @field_validator("scrape_interval")
    @classmethod
    def _scrape_interval(cls, v: float) -> float:
        if v < 0.05:
            raise ValueError("must be at least 50ms: faster scraping only adds load on the server")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be 1-100 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("power_scrape_interval")
    @classmethod
    def _power_interval(cls, v: float) -> float:
        if not 0.05 <= v <= 10.0:
            raise ValueError(
                "must be between 50ms and 10s: a run's energy needs the reading after its end, and its "
                "record waits for it"
            )
        return v

    @field_validator("base_url", "metrics_url", "power_metrics_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else check_http_url(v).rstrip("/")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _LABEL_RE.match(key) or key.startswith("__"):
                raise ValueError(f"label name {key!r} is not a valid Prometheus label name")
            if key in RESERVED_LABELS:
                raise ValueError(f"label name {key!r} is reserved by tokwatch")
        return v

    @model_validator(mode="after")
    def _check(self) -> EndpointSettings:
        given = [n for n in ("api_key", "api_key_env", "api_key_file") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(
                f"set only one of api_key, api_key_env and api_key_file (got {', '.join(given)})"
            )
        check_endpoint_reach(self.headers, self.secret_headers, self.auth, given)
        check_proxy_fields(self)
        return self

    @property
    def is_local(self) -> bool:
        """Loopback or private-range host: seed 000 gives these a 30 s timeout instead of 60 s."""
        host = urlsplit(self.base_url).hostname or ""
        if host == "localhost" or host.endswith(".local"):
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return ip.is_loopback or ip.is_private

    @property
    def effective_timeout(self) -> float:
        """Timeout for one request in seconds."""
        if self.timeout is not None:
            return self.timeout
        return LOCAL_TIMEOUT_S if self.is_local else DEFAULT_TIMEOUT_S

    def resolve_api_key(self) -> str | None:
        """The API key from inline value, environment variable or file; raises ConfigError if unreadable."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env)
            if value is None:
                raise ConfigError(f"endpoint {self.name}: environment variable {self.api_key_env} is not set")
            return value.strip()
        if self.api_key_file is not None:
            try:
                return Path(self.api_key_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"endpoint {self.name}: cannot read api_key_file {self.api_key_file}: {exc.strerror}"
                ) from None
        return None


class Config(StrictModel):
    """The whole tokwatch.yml."""

    listen: str = DEFAULT_LISTEN
    instance: str | None = None
    # The vantage point this exporter probes from (eu-west, office, k8s-a): a `site` label on every series
    # and stored run, so exporters at several sites can share one store (docs/scaling.md).
    site: str | None = None
    probe: ProbeSettings = Field(default_factory=ProbeSettings)  # type: ignore[arg-type]
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)  # type: ignore[arg-type]
    storage: StorageSettings = Field(default_factory=StorageSettings)  # type: ignore[arg-type]
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)  # type: ignore[arg-type]
    otlp: OtlpSettings = Field(default_factory=OtlpSettings)  # type: ignore[arg-type]
    endpoints: tuple[EndpointSettings, ...] = ()
    pricing: PricingSettings = Field(default_factory=PricingSettings)

    @model_validator(mode="after")
    def _check(self) -> Config:
        seen: dict[str, int] = {}
        for i, ep in enumerate(self.endpoints):
            if ep.name in seen:
                raise ValueError(f"endpoints[{i}] repeats the name {ep.name!r} of endpoints[{seen[ep.name]}]")
            seen[ep.name] = i
        for ep in self.endpoints:
            for old in ep.renamed_from:
                if old in seen:
                    raise ValueError(
                        f"endpoint {ep.name!r}: renamed_from {old!r} is still a configured endpoint"
                    )
        parse_listen(self.listen)
        configured = {*self.schedule.windows, self.schedule.window}
        for seconds in self.metrics.windows or ():
            if seconds not in configured:
                known = ", ".join(window_label(s) for s in sorted(configured))
                raise ValueError(
                    f"metrics.windows: {window_label(seconds)} is not a configured window "
                    f"(schedule.window and schedule.windows: {known})"
                )
        for i, ep in enumerate(self.endpoints):
            if self.site is not None and "site" in ep.labels:
                raise ValueError(
                    f"endpoints[{i}] ({ep.name}): labels.site clashes with the top-level site "
                    f"{self.site!r}, which labels every series: remove one of them"
                )
            for w in self.workloads_for(ep):
                _check_fits(i, ep, w, self.probe_for(ep).max_tokens)
        return self

    @model_validator(mode="after")
    def _reach_defaults(self) -> Config:
        endpoints = tuple(inherit_reach(self.probe, ep) for ep in self.endpoints)
        return self if endpoints == self.endpoints else self.model_copy(update={"endpoints": endpoints})

    @field_validator("site")
    @classmethod
    def _site(cls, v: str | None) -> str | None:
        if v is not None and not _SITE_RE.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return v

    @property
    def exported_windows(self) -> tuple[float, ...]:
        """The window lengths /metrics exports window figures over: metrics.windows, else schedule.window."""
        return tuple(sorted(set(self.metrics.windows or (self.schedule.window,))))

    @property
    def site_name(self) -> str:
        """The site runs are stored under ("" when none is configured)."""
        return self.site or ""

    def round_schedule(self, workload: Workload | None = None) -> tuple[float, float]:
        """(interval, offset) the rounds of `workload` (the main schedule's when None) start on: an offset
        not set in the config is shifted by the site's fraction of the interval
        (tokwatch.settings.site_offset),
        so exporters at several sites take turns on a shared server; a configured one is kept as is."""
        s = self.schedule
        interval, offset = (
            (s.interval, s.offset) if workload is None else workload.schedule(s.interval, s.offset)
        )
        own = workload is not None and workload.offset is not None
        if own or "offset" in s.model_fields_set:
            return interval, offset
        return interval, site_offset(self.site_name, interval, offset)

    def workloads_for(self, ep: EndpointSettings) -> tuple[Workload, ...]:
        """The endpoint's own workloads, else probe.workloads."""
        return ep.workloads if ep.workloads is not None else self.probe.workloads

    def workload_for(self, ep: EndpointSettings, name: str) -> Workload | None:
        """One of the endpoint's workloads by name, or None."""
        return next((w for w in self.workloads_for(ep) if w.name == name), None)

    def endpoint(self, name: str) -> EndpointSettings | None:
        """The configured endpoint with this name, or None."""
        return next((e for e in self.endpoints if e.name == name), None)

    @property
    def enabled_endpoints(self) -> tuple[EndpointSettings, ...]:
        """Endpoints the scheduler probes."""
        return tuple(e for e in self.endpoints if e.enabled)

    def probe_for(self, ep: EndpointSettings) -> ProbeSettings:
        """Probe settings with the endpoint's overrides applied."""
        overrides: dict[str, Any] = {}
        for name in ("stream", "prompt", "system_prompt", "max_tokens", "cache_preamble_tokens"):
            value = getattr(ep, name)
            if value is not None:
                overrides[name] = value
        return self.probe.model_copy(update=overrides) if overrides else self.probe


def _check_fits(index: int, ep: EndpointSettings, w: Workload, max_tokens: int) -> None:
    """A workload that cannot fit the endpoint's known context is a config error, not failed runs."""
    if ep.context_tokens is None:
        return
    needed = (w.input_tokens or 0) + w.max_tokens(max_tokens)
    if needed > ep.context_tokens:
        size = f"{w.input_tokens} input + " if w.input_tokens is not None else ""
        output = w.max_tokens(max_tokens)
        raise ValueError(
            f"endpoints[{index}] ({ep.name}): workload {w.name} needs {size}{output} output "
            f"tokens, more than its context_tokens {ep.context_tokens}: shrink the workload "
            f"({{name: {w.name}, input_tokens: ...}}) or give the endpoint its own workloads"
        )


def server_key(base_url: str) -> str:
    """scheme://host:port of a URL (default port filled in): endpoints on one server share it."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def server_root(base_url: str) -> str:
    """The server root of a base URL: a trailing `/v1` (OpenAI-style) is dropped, so both forms work."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def load_config_text(text: str, filename: str = "<config>") -> Config:
    """Parse and validate tokwatch config text; raises ConfigError with `file:line: field: message` lines."""
    return validate_yaml(text, filename, Config)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file; an empty one is valid (the defaults, no endpoints), with a warning."""
    text, name = read_config_file(path)
    config = load_config_text(text, name)
    if not config.model_fields_set:
        log.warning("%s: the file is empty: running on the defaults with no endpoints", name)
    return config
