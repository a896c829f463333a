"""Typed configuration: YAML file -> validated pydantic models, with errors that name file, line and field."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tokwatch.result import TimingSource

DEFAULT_LISTEN = "127.0.0.1:9477"
DEFAULT_PROMPT = "Explain theory of relativity simply"
DEFAULT_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 30.0

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
RESERVED_LABELS = frozenset(
    {"endpoint", "status", "source", "le", "quantile", "kind", "model", "instance", "job", "phase", "metric"}
)


class ConfigError(Exception):
    """A configuration problem, already formatted as `file:line: field: message` lines."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as '500ms', '30s', '15m', '1h', '7d'."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 15m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ValueError(
                f"invalid duration {value!r}: use a number of seconds or e.g. 500ms, 30s, 15m, 1h"
            )
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError("expected a duration such as 30s, 15m or 1h")
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, not {value!r}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_positive_duration(value: Any) -> float:
    """`parse_duration`, and more than zero (an interval, a timeout or a window of 0 means nothing)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be a duration above zero, not {value!r}")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _duration_fields(*names: str) -> Any:
    """Durations that must be finite and above zero."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_positive_duration(v))


def _offset_fields(*names: str) -> Any:
    """Durations that may be zero (an offset into the interval)."""
    return field_validator(*names, mode="before")(lambda v: v if v is None else parse_duration(v))


class ProbeSettings(_Strict):
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
    # A run during which the measurement loop stalled this long is flagged `timing_disturbed`.
    disturbance_threshold: float = 0.005
    _probe_durations = _duration_fields("disturbance_threshold")

    @field_validator("disturbance_threshold")
    @classmethod
    def _positive_threshold(cls, v: float) -> float:
        if not 0 < v < 60:
            raise ValueError("must be a duration above 0 and below 60s")
        return v

    @field_validator("timing_preference")
    @classmethod
    def _unique_sources(cls, v: tuple[TimingSource, ...]) -> tuple[TimingSource, ...]:
        if not v:
            raise ValueError("needs at least one timing source")
        if len(set(v)) != len(v):
            raise ValueError("lists a timing source twice")
        return v


class ScheduleSettings(_Strict):
    """When rounds run: every `interval`, aligned so rounds start at `offset` past the interval boundary."""

    interval: float = 3600.0
    offset: float = 1800.0
    parallelism: int = Field(4, ge=1, le=64)  # servers (host:port) probed at once
    per_server: int = Field(1, ge=1, le=64)  # probes at once against one server
    # /probe?target= within this long after the endpoint's last run returns that run instead of probing.
    on_demand_min_interval: float = 60.0
    # Runs the window figures (median, CV, uptime, fleet comparison) take in besides scheduled, undisturbed
    # ones: "on_demand" (/probe) and/or "timing_disturbed".
    window_includes: tuple[Literal["on_demand", "timing_disturbed"], ...] = ()
    window: float = 86400.0  # window for the in-memory median/CV/stddev gauges
    run_on_start: bool = (
        True  # one round at start-up, so a restart does not leave the gauges empty for an hour
    )
    _durations = _duration_fields("interval", "window", "on_demand_min_interval")
    _offsets = _offset_fields("offset")

    @model_validator(mode="after")
    def _check(self) -> ScheduleSettings:
        if self.interval < 1:
            raise ValueError("interval must be at least 1s")
        if self.offset >= self.interval:
            raise ValueError(f"offset ({self.offset:g}s) must be shorter than interval ({self.interval:g}s)")
        return self


class StorageSettings(_Strict):
    """Where every run is kept: PostgreSQL when a DSN is set, else an embedded SQLite file."""

    dsn: SecretStr | None = None
    sqlite_path: str | None = None
    outbox_path: str | None = None
    retention: float = 400 * 86400.0
    enabled: bool = True
    queue_size: int = Field(10000, ge=1)  # runs held in memory when the outbox cannot be written
    pool_size: int = Field(4, ge=1, le=64)  # PostgreSQL connections
    write_timeout: float = 5.0  # a write slower than this fails; its runs stay in the outbox
    compress_after: float = 7 * 86400.0  # TimescaleDB: compress chunks older than this
    timescale: bool = True  # use TimescaleDB when the extension is available
    _durations = _duration_fields("retention", "write_timeout", "compress_after")


class EndpointSettings(_Strict):
    """One probed endpoint."""

    name: str
    kind: Literal["openai", "ollama", "llamacpp", "vllm", "sglang"]
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
    _durations = _duration_fields("timeout", "scrape_interval")

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

    @field_validator("base_url", "metrics_url")
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

    @property
    def effective_metrics_url(self) -> str | None:
        """Server /metrics URL: explicit, or `<base>/metrics` for kinds that expose one."""
        if self.metrics_url:
            return self.metrics_url
        if self.kind in ("vllm", "llamacpp", "sglang"):
            return f"{server_root(self.base_url)}/metrics"
        return None

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


class Config(_Strict):
    """The whole tokwatch.yml."""

    listen: str = DEFAULT_LISTEN
    instance: str | None = None
    probe: ProbeSettings = Field(default_factory=ProbeSettings)  # type: ignore[arg-type]
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)  # type: ignore[arg-type]
    storage: StorageSettings = Field(default_factory=StorageSettings)  # type: ignore[arg-type]
    endpoints: tuple[EndpointSettings, ...] = ()

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
        return self

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
        for name in ("stream", "prompt", "system_prompt", "max_tokens"):
            value = getattr(ep, name)
            if value is not None:
                overrides[name] = value
        return self.probe.model_copy(update=overrides) if overrides else self.probe


def server_key(base_url: str) -> str:
    """scheme://host:port of a URL (default port filled in): endpoints on one server share it."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def server_root(base_url: str) -> str:
    """The server root of a base URL: a trailing `/v1` (OpenAI-style) is dropped, so both forms work."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_listen(value: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT); raises ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not port:
        raise ValueError(
            f"listen address {value!r} must be HOST:PORT, e.g. 127.0.0.1:9477 (:9477 for every interface)"
        )
    if not port.isdigit():
        raise ValueError(f"listen address {value!r}: port {port!r} is not a number")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {value!r}: port {int(port)} is out of range (0-65535)")
    return host.strip("[]") or "0.0.0.0", int(port)


def check_http_url(value: str) -> str:
    """`value` if it is an http(s):// URL with a host and a valid port; ValueError naming the problem."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        hint = f"; did you mean http://{value}?" if "://" not in value else ""
        raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}{hint}")
    if not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {value!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise ValueError(f"{value!r}: the port is not a number in 0-65535") from None
    return value


# --- loading -------------------------------------------------------------------------------------------

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key and sequence item."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    lines: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
        lines[key] = key_node.start_mark.line + 1
    return _LinedDict(mapping, lines, node.start_mark.line + 1)


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> list[Any]:
    items = [loader.construct_object(n, deep=True) for n in node.value]
    return _LinedList(items, [n.start_mark.line + 1 for n in node.value], node.start_mark.line + 1)


class _LinedDict(dict[Any, Any]):
    def __init__(self, data: Mapping[Any, Any], lines: dict[Any, int], line: int) -> None:
        super().__init__(data)
        self.lines = lines
        self.line = line


class _LinedList(list[Any]):
    def __init__(self, data: list[Any], lines: list[int], line: int) -> None:
        super().__init__(data)
        self.lines = lines
        self.line = line


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _line_of(doc: Any, loc: tuple[Any, ...]) -> int | None:
    line: int | None = getattr(doc, "line", None)
    node = doc
    for part in loc:
        if isinstance(node, _LinedDict) and part in node:
            line = node.lines.get(part, line)
            node = node[part]
        elif isinstance(node, _LinedList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.lines[part]
            node = node[part]
        else:
            break
    return line


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _expand_env(node: Any, path: tuple[Any, ...], problems: list[tuple[tuple[Any, ...], str]]) -> Any:
    if isinstance(node, _LinedDict):
        for key in list(node):
            node[key] = _expand_env(node[key], (*path, key), problems)
        return node
    if isinstance(node, _LinedList):
        for i, item in enumerate(node):
            node[i] = _expand_env(item, (*path, i), problems)
        return node
    if isinstance(node, str) and "${" in node:

        def repl(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                problems.append((path, f"environment variable {m.group(1)} is not set"))
                return ""
            return value

        return _ENV_RE.sub(repl, node)
    return node


def _clean_message(msg: str) -> str:
    return msg.removeprefix("Value error, ")


M = TypeVar("M", bound=BaseModel)


def parse_yaml_doc(text: str, filename: str) -> Any:
    """YAML text -> a mapping remembering line numbers, ${ENV} expanded; ConfigError names the line."""
    try:
        doc = yaml.load(text, Loader=_LineLoader)  # safe: _LineLoader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(f"{where}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{filename}: invalid YAML: {exc}") from None
    if doc is None:
        doc = _LinedDict({}, {}, 1)
    if not isinstance(doc, dict):
        raise ConfigError(f"{filename}:1: the file must be a mapping of settings, not {type(doc).__name__}")
    problems: list[tuple[tuple[Any, ...], str]] = []
    doc = _expand_env(doc, (), problems)
    if problems:
        raise ConfigError(
            "\n".join(f"{filename}:{_line_of(doc, p) or 1}: {_field_path(p)}: {m}" for p, m in problems)
        )
    return doc


def line_of(doc: Any, loc: tuple[Any, ...]) -> int | None:
    """Line of the setting at `loc` in a document from `parse_yaml_doc` (None if unknown)."""
    return _line_of(doc, loc)


def format_validation_error(exc: ValidationError, filename: str, doc: Any = None) -> str:
    """`file:line: field: message` lines for a pydantic error (line left out when `doc` is None)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        msg = "unknown setting" if err["type"] == "extra_forbidden" else _clean_message(err["msg"])
        line = _line_of(doc, loc) if doc is not None else None
        lines.append(f"{filename}{f':{line}' if line else ''}: {_field_path(loc)}: {msg}")
    return "\n".join(lines)


def validate_yaml(text: str, filename: str, model: type[M]) -> M:
    """Parse YAML text into `model`; raises ConfigError with `file:line: field: message` lines."""
    doc = parse_yaml_doc(text, filename)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, filename, doc)) from None


def read_config_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, display name) of a config file; raises ConfigError naming the file."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None


def load_config_text(text: str, filename: str = "<config>") -> Config:
    """Parse and validate tokwatch config text; raises ConfigError with `file:line: field: message` lines."""
    return validate_yaml(text, filename, Config)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file."""
    return load_config_text(*read_config_file(path))
