"""Workloads: what a timed run sends, by prompt size (input tokens) and output size, and how often.

`seed000` (the default) sends the configured prompt (seed 000's "Explain theory of relativity simply") with
`max_tokens` (256). The other workloads send a fresh natural-language prompt sized to `input_tokens`
(tokwatch.probes.prompts) and ask for `output_tokens`; presets match the public tiers (Artificial Analysis:
100/300, 1k/1k, 10k/1.5k). A workload may run on its own schedule (a long prompt less often) and with its
own timeout. Definitions: docs/methodology.md, "Workloads and fresh prompts".
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from tokwatch.figures.series import DEFAULT_WORKLOAD
from tokwatch.settings.setting_values import duration_fields, positive_duration_fields
from tokwatch.settings.strict_yaml import StrictModel

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
# seed000's max_tokens: the output the endpoint's own timeout is meant for (a bigger output gets more time).
TIMEOUT_BASE_TOKENS = 256
MAX_WORKLOADS = 16  # per endpoint: every workload is a label value on every per-run series


class Workload(StrictModel):
    """One named workload; a preset name alone (`- long`) or with some fields changed (`{name: long,
    input_tokens: 1500}`) takes the preset's other values."""

    name: str
    input_tokens: int | None = Field(None, ge=1, le=2_000_000)  # None: seed000's configured prompt
    output_tokens: int | None = Field(None, ge=1, le=131072)  # None: probe.max_tokens (seed000)
    interval: float | None = None  # own schedule; None: the main schedule's
    offset: float | None = None  # with `interval`; None: the main offset when shorter, else 0
    timeout: float | None = None  # None: the endpoint's timeout, scaled by output_tokens / 256
    warmup: bool | None = None  # None: probe.warmup
    _durations = positive_duration_fields("interval", "timeout")
    _offsets = duration_fields("offset")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """A bare name is that preset; a preset's name with fields takes the preset's other values."""
        if isinstance(data, str):
            data = {"name": data}
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"] in _PRESET_FIELDS:
            return {**_PRESET_FIELDS[data["name"]], **data}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                "a workload name is 1-32 characters of lowercase letters, digits, '.', '_' or '-' "
                f"(got {v!r})"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if self.name == DEFAULT_WORKLOAD and self.input_tokens is not None:
            raise ValueError(
                f"workload {DEFAULT_WORKLOAD} sends the configured prompt: it takes no input_tokens "
                "(name another workload for a sized prompt)"
            )
        if self.name not in _PRESET_FIELDS and (self.input_tokens is None or self.output_tokens is None):
            known = ", ".join(_PRESET_FIELDS)
            raise ValueError(
                f"workload {self.name!r} is not a preset ({known}): give it input_tokens and output_tokens"
            )
        if self.offset is not None and self.interval is None:
            raise ValueError("offset needs the workload's own interval")
        if self.interval is not None:
            if self.interval < 1:
                raise ValueError("interval must be at least 1s")
            if self.offset is not None and self.offset >= self.interval:
                raise ValueError(
                    f"offset ({self.offset:g}s) must be shorter than interval ({self.interval:g}s)"
                )
        return self

    @property
    def sized(self) -> bool:
        """A fresh prompt sized to `input_tokens` (every workload but seed000)."""
        return self.input_tokens is not None

    def max_tokens(self, configured: int) -> int:
        """The output asked for: the workload's own, else the configured max_tokens (seed000)."""
        return self.output_tokens if self.output_tokens is not None else configured

    def schedule(self, interval: float, offset: float) -> tuple[float, float]:
        """(interval, offset) the workload runs on, given the main schedule's."""
        if self.interval is None:
            return interval, offset
        if self.offset is not None:
            return self.interval, self.offset
        return self.interval, offset if offset < self.interval else 0.0

    def timeout_for(self, endpoint_timeout: float, configured_max_tokens: int) -> float:
        """The run's timeout: the workload's own, else the endpoint's scaled by the output asked for (the
        endpoint's timeout is meant for seed000's 256 tokens)."""
        if self.timeout is not None:
            return self.timeout
        scale = max(1.0, self.max_tokens(configured_max_tokens) / TIMEOUT_BASE_TOKENS)
        return endpoint_timeout * scale


_PRESET_FIELDS: dict[str, dict[str, Any]] = {
    DEFAULT_WORKLOAD: {},
    "short": {"input_tokens": 100, "output_tokens": 300},
    "medium": {"input_tokens": 1000, "output_tokens": 1000},
    "long": {"input_tokens": 10000, "output_tokens": 1500},
}
PRESETS: dict[str, Workload] = {name: Workload.model_validate(name) for name in _PRESET_FIELDS}
SEED000 = PRESETS[DEFAULT_WORKLOAD]


def check_workloads(workloads: tuple[Workload, ...]) -> tuple[Workload, ...]:
    """At least one, at most MAX_WORKLOADS, names unique; raises ValueError naming the problem."""
    if not workloads:
        raise ValueError("needs at least one workload")
    if len(workloads) > MAX_WORKLOADS:
        raise ValueError(f"at most {MAX_WORKLOADS} workloads (got {len(workloads)})")
    seen: set[str] = set()
    for w in workloads:
        if w.name in seen:
            raise ValueError(f"workload {w.name!r} appears twice")
        seen.add(w.name)
    return workloads
