"""Typed simulator configuration (sim.yml): strict pydantic models with `file:line: field: message` errors."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from tokwatch.settings.setting_values import check_http_url, duration_fields, parse_listen
from tokwatch.settings.strict_yaml import StrictModel, read_config_file, validate_yaml
from tokwatch.tracing.extra import require_otel

DEFAULT_SIM_LISTEN = "127.0.0.1:8900"
FAULT_KINDS = (
    "http_401",
    "http_403",
    "http_429",
    "http_5xx",
    "malformed_json",
    "wrong_shape",
    "error_mid_stream",
    "stall",
    "reset",
    "http_529",
    "overloaded_mid_stream",
)
Dialect = Literal["openai", "vllm", "llamacpp", "ollama", "sglang", "anthropic"]
ReasoningFormat = Literal["reasoning_content", "reasoning", "think_tags"]
# Server names become the first path segment; "_sim" is reserved for the admin routes.
_SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class FaultSettings(StrictModel):
    """Per-request fault probabilities; at most one fault is drawn per request, so they must sum to <= 1."""

    http_401: float = Field(0.0, ge=0.0, le=1.0)
    http_403: float = Field(0.0, ge=0.0, le=1.0)
    http_429: float = Field(0.0, ge=0.0, le=1.0)
    http_5xx: float = Field(0.0, ge=0.0, le=1.0)
    malformed_json: float = Field(0.0, ge=0.0, le=1.0)
    wrong_shape: float = Field(0.0, ge=0.0, le=1.0)
    error_mid_stream: float = Field(0.0, ge=0.0, le=1.0)
    stall: float = Field(0.0, ge=0.0, le=1.0)
    reset: float = Field(0.0, ge=0.0, le=1.0)
    # Anthropic's overload: HTTP 529 before the stream, or an overloaded_error event in it (other dialects
    # send their own error body with status 529).
    http_529: float = Field(0.0, ge=0.0, le=1.0)
    overloaded_mid_stream: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _sum(self) -> FaultSettings:
        total = sum(getattr(self, k) for k in FAULT_KINDS)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities sum to {total:g}; they must sum to at most 1")
        return self

    def as_dict(self) -> dict[str, float]:
        """Probabilities by fault kind, in draw order."""
        return {k: float(getattr(self, k)) for k in FAULT_KINDS}


class ModelProfile(StrictModel):
    """One simulated model: its timing model, output shape, faults and hostile behaviours."""

    name: str = Field(min_length=1, max_length=200)
    decode_tps: float = Field(50.0, gt=0.0, le=1_000_000.0)
    prefill_tps: float = Field(2000.0, gt=0.0)
    # The model's context length: a longer request is refused as the dialect refuses it (Ollama truncates
    # the prompt to it instead, as its num_ctx does). None: unlimited.
    context_tokens: int | None = Field(None, ge=1)
    jitter: float = Field(0.0, ge=0.0, le=1.0)
    contention: float = Field(0.0, ge=0.0)
    think_tokens: int = Field(0, ge=0)
    # [MIN, MAX]: a request that asks to think (docs/simulator.md "Thinking on request") thinks a length
    # drawn uniformly from this range, cut by its think budget and max_tokens; requests that do not ask
    # think `think_tokens`. None: every request thinks `think_tokens`.
    natural_think: tuple[int, int] | None = None
    reasoning_format: ReasoningFormat = "reasoning_content"
    tokens_per_chunk: int = Field(1, ge=1, le=1024)
    natural_stop_tokens: int | None = Field(None, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    ping_interval: float | None = None
    strip_eval_duration: bool = False
    cold_load_probability: float = Field(0.0, ge=0.0, le=1.0)
    cold_load_duration: float = 2.0
    warm_load_duration: float = 0.0
    vram_fraction: float = Field(1.0, ge=0.0, le=1.0)
    size_bytes: int = Field(4_000_000_000, ge=0)
    faults: FaultSettings = Field(default_factory=FaultSettings)  # type: ignore[arg-type]
    fault_after_tokens: int | None = Field(None, ge=0)
    stall_seconds: float = 600.0
    endless_stream: bool = False
    huge_body_bytes: int | None = Field(None, ge=1)
    invalid_utf8: bool = False
    # Known answers (an answer table): a request whose prompt contains a key is answered with its text, then
    # stops; with several keys in the prompt, the one found last (a few-shot prompt's question) answers.
    answers: dict[str, str] = Field(default_factory=dict)
    _d = duration_fields("ping_interval", "cold_load_duration", "warm_load_duration", "stall_seconds")

    @field_validator("answers")
    @classmethod
    def _answers(cls, v: dict[str, str]) -> dict[str, str]:
        for key, answer in v.items():
            if not key.strip() or not answer.strip():
                raise ValueError(f"answers: key {key!r} and its answer must both have text")
        return v

    @field_validator("natural_think")
    @classmethod
    def _natural_think(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and not 1 <= v[0] <= v[1]:
            raise ValueError("natural_think must be [MIN, MAX] with 1 <= MIN <= MAX")
        return v

    @field_validator("ping_interval")
    @classmethod
    def _ping(cls, v: float | None) -> float | None:
        if v is not None and v < 0.001:
            raise ValueError("ping_interval must be at least 1ms")
        return v


class GpuPowerSettings(StrictModel):
    """A simulated server's GPUs as a DCGM exporter shows them (`/<server>/dcgm/metrics`)."""

    gpus: int = Field(1, ge=1, le=64)
    idle_watts: float = Field(60.0, ge=0, le=2000)
    watts_per_running: float = Field(40.0, ge=0, le=2000)  # added per running request
    max_watts: float = Field(350.0, gt=0, le=2000)  # each GPU's cap
    model_name: str = "NVIDIA H100 80GB HBM3"


class ServerSettings(StrictModel):
    """One simulated inference server, reachable under `/<name>/`."""

    name: str
    dialect: Dialect
    models: tuple[ModelProfile, ...] = Field(min_length=1)
    kv_capacity_tokens: int | None = Field(None, ge=1)
    max_running: int = Field(256, ge=1)
    close_after_stream: bool = False
    background_rps: float = Field(0.0, ge=0.0, le=1000.0)
    background_prompt_tokens: int = Field(64, ge=1)
    background_max_tokens: int = Field(128, ge=1)
    # Prompt counting as a real server's: a chat template's tokens added to every prompt, and a tokenizer that
    # counts the words x this factor more (or fewer) than the simulator's one token per word.
    chat_template_tokens: int = Field(0, ge=0, le=100_000)
    prompt_token_scale: float = Field(1.0, gt=0, le=100)
    legacy_names: bool = False
    data_parallel: int = Field(1, ge=1, le=64)
    prefix_caching: bool = True
    api_key: SecretStr | None = None
    gpu_power: GpuPowerSettings | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _SERVER_NAME_RE.match(v):
            raise ValueError(
                "must be 1-64 characters of letters, digits, '.', '_' or '-', not starting with '_'"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        seen: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"model name {m.name!r} appears twice")
            seen.add(m.name)
        if self.legacy_names and self.dialect != "vllm":
            raise ValueError("legacy_names applies only to dialect vllm")
        if self.data_parallel > 1 and self.dialect != "vllm":
            raise ValueError("data_parallel applies only to dialect vllm")
        if self.legacy_names and self.data_parallel > 1:
            raise ValueError(
                "data_parallel needs the V1 metric names (legacy_names: false): V0 had no engine label"
            )
        return self

    def model(self, name: str) -> ModelProfile | None:
        """The profile serving `name`, or None."""
        return next((m for m in self.models if m.name == name), None)


class SimConfig(StrictModel):
    """The whole sim.yml."""

    listen: str = DEFAULT_SIM_LISTEN
    seed: int = 0
    truth_capacity: int = Field(10000, ge=1, le=1_000_000)
    # An OTLP/HTTP receiver for a server span of each request that carries a `traceparent` (docs/tracing.md).
    otlp_endpoint: str | None = None
    servers: tuple[ServerSettings, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        seen: set[str] = set()
        for s in self.servers:
            if s.name in seen:
                raise ValueError(f"server name {s.name!r} appears twice")
            seen.add(s.name)
        parse_listen(self.listen)
        if self.otlp_endpoint is not None:
            check_http_url(self.otlp_endpoint)
            require_otel()
        return self

    def server(self, name: str) -> ServerSettings | None:
        """The server with this name, or None."""
        return next((s for s in self.servers if s.name == name), None)


def load_sim_config_text(text: str, filename: str = "<sim config>") -> SimConfig:
    """Parse and validate sim config text; raises ConfigError with `file:line: field: message` lines."""
    return validate_yaml(text, filename, SimConfig)


def load_sim_config(path: str | os.PathLike[str]) -> SimConfig:
    """Read and validate a simulator config file."""
    return load_sim_config_text(*read_config_file(path))
