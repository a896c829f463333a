"""Prometheus text format / OpenMetrics -> a typed, immutable snapshot indexed by sample name.

The classic text format is parsed line by line with regular expressions (`_parse_text_fast`):
prometheus_client's own text parser walks label strings character by character and took ~0.1 s for one
vLLM /metrics body, on the exporter's main loop, for every counter snapshot. Anything the fast path does
not recognise (and all of OpenMetrics) goes through prometheus_client's parsers, which stay the reference:
a test checks that both give the same snapshot for every capture. Samples are indexed by their full
sample name (`vllm:generation_tokens_total`, `..._sum`, `..._count`, `..._created`) because the text
parser strips `_total` from counter family names but never from sample names, so sample names are the
stable key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as _parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as _parse_text

MAX_TEXT_CHARS = 8 * 1024 * 1024
MAX_SAMPLES = 200_000

Labels = Mapping[str, str]


class MetricsParseError(ValueError):
    """A /metrics body that is not valid exposition text (or is larger than the caps)."""


@dataclass(frozen=True, slots=True)
class Series:
    """One sample of one time series."""

    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every finite sample of one scrape, by sample name, plus the family type of each sample name."""

    series: Mapping[str, tuple[Series, ...]]
    types: Mapping[str, str] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        """True when at least one series of this sample name was exposed."""
        return bool(self.series.get(name))

    def names(self) -> Iterable[str]:
        """All sample names in the scrape."""
        return self.series.keys()

    def select(self, name: str, where: Labels | None = None) -> tuple[Series, ...]:
        """Series of `name` whose labels include every pair of `where`."""
        found = self.series.get(name, ())
        if not where:
            return found
        return tuple(s for s in found if all(s.labels.get(k) == v for k, v in where.items()))

    def total(self, name: str, where: Labels | None = None) -> float | None:
        """Sum over the matching series (e.g. over vLLM's `engine` label), None when there are none."""
        found = self.select(name, where)
        return math.fsum(s.value for s in found) if found else None

    def mean(self, name: str, where: Labels | None = None) -> float | None:
        """Mean over the matching series (for ratios such as per-engine KV-cache usage)."""
        found = self.select(name, where)
        return math.fsum(s.value for s in found) / len(found) if found else None

    def label_values(self, label: str, prefix: str) -> set[str]:
        """Distinct values of `label` over all samples whose name starts with `prefix`."""
        return {
            s.labels[label]
            for name, found in self.series.items()
            if name.startswith(prefix)
            for s in found
            if label in s.labels
        }

    def kind_of(self, name: str) -> str:
        """Family type of a sample name ('counter', 'gauge', 'histogram', ... or 'unknown')."""
        return self.types.get(name, "unknown")

    def renamed(self, old_prefix: str, new_prefix: str) -> MetricsSnapshot:
        """This snapshot with every sample name starting with `old_prefix` renamed to start with
        `new_prefix` (a server whose families changed separator); the others unchanged."""

        def rename(name: str) -> str:
            return new_prefix + name[len(old_prefix) :] if name.startswith(old_prefix) else name

        return MetricsSnapshot(
            MappingProxyType({rename(n): found for n, found in self.series.items()}),
            MappingProxyType({rename(n): kind for n, kind in self.types.items()}),
        )


def is_openmetrics(text: str, content_type: str | None = None) -> bool:
    """OpenMetrics when the server says so or the body ends with the mandatory `# EOF` line."""
    if content_type and "openmetrics" in content_type.lower():
        return True
    return text.rstrip().endswith("# EOF")


def parse_metrics(
    text: str,
    *,
    content_type: str | None = None,
    max_chars: int = MAX_TEXT_CHARS,
    max_samples: int = MAX_SAMPLES,
) -> MetricsSnapshot:
    """Parse one /metrics body; raises MetricsParseError naming the problem (never another exception)."""
    if len(text) > max_chars:
        raise MetricsParseError(f"body of {len(text)} characters exceeds the {max_chars} cap")
    openmetrics = is_openmetrics(text, content_type)
    if not openmetrics:
        fast = _parse_text_fast(text, max_samples)
        if fast is not None:
            return fast
    return _parse_reference(text, openmetrics, max_samples)


def _parse_reference(text: str, openmetrics: bool, max_samples: int) -> MetricsSnapshot:
    """prometheus_client's parsers: slower, but they define what the fast path must produce."""
    parser = _parse_openmetrics if openmetrics else _parse_text
    series: dict[str, list[Series]] = {}
    types: dict[str, str] = {}
    count = 0
    try:
        families: Iterable[Metric] = parser(text)
        for family in families:
            for sample in family.samples:
                count += 1
                if count > max_samples:
                    raise MetricsParseError(f"more than {max_samples} samples")
                value = float(sample.value)
                # NaN/Inf carry no counter information and would poison sums and deltas.
                if not math.isfinite(value):
                    continue
                types.setdefault(sample.name, family.type)
                series.setdefault(sample.name, []).append(
                    Series(MappingProxyType(dict(sample.labels)), value)
                )
    except MetricsParseError:
        raise
    except Exception as exc:  # the parsers raise ValueError, IndexError, KeyError... on bad input
        raise MetricsParseError(f"invalid exposition text: {type(exc).__name__}: {str(exc)[:200]}") from None
    return MetricsSnapshot(
        series=MappingProxyType({k: tuple(v) for k, v in series.items()}),
        types=MappingProxyType(types),
    )


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(
    rf"^({_NAME})[ \t]*(\{{[^}}]*\}})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*$"
)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|$)')
_TYPE = re.compile(rf"^#[ \t]+TYPE[ \t]+({_NAME})[ \t]+(\w+)[ \t]*$")
# Sample-name suffixes prometheus_client's text parser accepts as part of a TYPE'd family (any other
# sample name starts an untyped family).
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _family_type(name: str, types: Mapping[str, str]) -> str:
    """The TYPE of the family a sample name belongs to (sample names carry suffixes: _total, _bucket...)."""
    typ = types.get(name)
    if typ is not None:
        return typ
    for typ_name, suffixes in _SUFFIXES.items():
        for suffix in suffixes:
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) == typ_name:
                return typ_name
    return "unknown"


def _parse_labels(raw: str) -> dict[str, str] | None:
    """`a="1",b="x"` (without braces) -> dict; None when the string is not exactly a label list."""
    labels: dict[str, str] = {}
    pos, end = 0, len(raw)
    while pos < end:
        m = _LABEL.match(raw, pos)
        if m is None:
            return None if raw[pos:].strip() else labels
        value = m.group(2)
        labels[m.group(1)] = _unescape(value) if "\\" in value else value
        pos = m.end()
    return labels


def _parse_text_fast(text: str, max_samples: int) -> MetricsSnapshot | None:
    """The classic text format, line by line; None when a line is unusual (the reference parser decides)."""
    types: dict[str, str] = {}
    series: dict[str, list[Series]] = {}
    sample_types: dict[str, str] = {}
    count = 0
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        if line[0] == "#":
            if (t := _TYPE.match(line)) is not None:
                types[t.group(1)] = t.group(2)
            continue
        m = _SAMPLE.match(line)
        if m is None:
            return None
        count += 1
        if count > max_samples:
            raise MetricsParseError(f"more than {max_samples} samples")
        try:
            value = float(m.group(3))
        except ValueError:
            return None
        name, raw = m.group(1), m.group(2)
        labels = _parse_labels(raw[1:-1]) if raw else {}
        if labels is None:
            return None
        if not math.isfinite(value):
            continue
        typ = _family_type(name, types)
        if typ == "counter" and name in types and not name.endswith("_total"):
            # prometheus_client names a counter's sample `<family>_total` even when exposed without it.
            name += "_total"
        sample_types.setdefault(name, typ)
        series.setdefault(name, []).append(Series(MappingProxyType(labels), value))
    return MetricsSnapshot(
        series=MappingProxyType({k: tuple(v) for k, v in series.items()}),
        types=MappingProxyType(sample_types),
    )
