"""What one server's /metrics says, in server-neutral terms: the common output of every adapter."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokwatch.counters.parse import Labels, MetricsSnapshot


@dataclass(frozen=True, slots=True)
class CounterReading:
    """Cumulative counters and current gauges of one server (one model), None where not exposed.

    `decode_tokens` / `decode_seconds` are the pair whose deltas give decode tok/s for one run; `basis`
    names which server families they came from. `raw` holds every raw server counter the figures were
    derived from (a decrease of any is a reset) and `created` their `_created` timestamps (a change means
    the server restarted even if the counters have already grown past their old values).
    """

    server: str  # "vllm", "llamacpp" or "sglang"
    basis: str | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    finished_requests: float | None = None
    preemptions: float | None = None
    decode_tokens: float | None = None
    decode_seconds: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    decode_calls: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_hit_ratio: float | None = None  # a server-side gauge, when the server has no hit/query counters
    raw: Mapping[str, float] = field(default_factory=dict)
    created: Mapping[str, float] = field(default_factory=dict)
    problem: str | None = None  # e.g. the endpoint's model is not among the served models


class ModelNotServed(LookupError):
    """Several models are served and none is the endpoint's model."""


def model_filter(snap: MetricsSnapshot, prefix: str, model: str | None, label: str = "model_name") -> Labels:
    """Label filter selecting the endpoint's model when a server exposes several; {} when it serves one.

    With a single served model no filter is applied, so a served-model alias that differs from the
    configured model name still works; with several, the configured model must be one of them.
    """
    served = snap.label_values(label, prefix)
    if len(served) <= 1:
        return {}
    if model is not None and model in served:
        return {label: model}
    raise ModelNotServed(f"serves {len(served)} models ({', '.join(sorted(served)[:5])}) and not {model!r}")


class RawCounters:
    """Reads counters from a snapshot under one label filter and remembers every raw value it read."""

    def __init__(self, snap: MetricsSnapshot, where: Labels) -> None:
        self.snap = snap
        self.where = where
        self.raw: dict[str, float] = {}

    def total(self, *names: str) -> float | None:
        """Sum of the first exposed of several alternative sample names (newest naming first)."""
        for name in names:
            value = self.snap.total(name, self.where)
            if value is not None:
                self.raw[name] = value
                return value
        return None

    def gauge(self, *names: str, mean: bool = False) -> float | None:
        """Sum (or mean, for ratios) of the first exposed of several alternative gauge names."""
        for name in names:
            value = self.snap.mean(name, self.where) if mean else self.snap.total(name, self.where)
            if value is not None:
                return value
        return None

    def created(self) -> dict[str, float]:
        """The earliest `_created` timestamp of every raw counter read that has one."""
        return created_stamps(self.snap, self.raw, self.where)


def created_name(sample: str) -> str:
    """The `_created` sample that belongs to a counter or histogram sample name."""
    for suffix in ("_total", "_sum", "_count"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)] + "_created"
    return sample + "_created"


def created_stamps(snap: MetricsSnapshot, samples: Iterable[str], where: Labels) -> dict[str, float]:
    """The earliest `_created` timestamp of each listed counter sample (a new series never moves it)."""
    out: dict[str, float] = {}
    for sample in samples:
        name = created_name(sample)
        found = snap.select(name, where)
        if found:
            out[name] = min(s.value for s in found)
    return out


def reset_between(before: CounterReading, after: CounterReading) -> str | None:
    """Why the server's counters were reset between two readings (a restart), or None if they were not."""
    if before.server != after.server:
        return f"server type changed from {before.server} to {after.server}"
    for name, old in before.raw.items():
        new = after.raw.get(name)
        if new is None:
            return f"{name} disappeared"
        if new < old:
            return f"{name} decreased from {old:g} to {new:g}"
    for name, old in before.created.items():
        new = after.created.get(name)
        if new is not None and new != old:
            return f"{name} changed"
    return None


def delta(before: float | None, after: float | None) -> float | None:
    """after - before, None when either side is missing."""
    if before is None or after is None:
        return None
    return after - before


def delta_from_zero(before: float | None, after: float | None) -> float | None:
    """after - before where a series absent before counts as 0 (servers create labelled series lazily)."""
    if after is None:
        return None
    return after - (before or 0.0)
