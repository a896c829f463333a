"""Service-level objectives: parsing (`ttft:p99<=0.5` or seed 002's YAML list), evaluation and goodput."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokwatch.bench import arrays
from tokwatch.bench.aggregate import SEND_METRICS, metric_array
from tokwatch.bench.request_metrics import HIGHER_IS_BETTER, LIST_METRICS, SCALAR_METRICS, RequestRecord
from tokwatch.figures.stats import percentile

# Peers' names for the same figures (Veeksha: ttfc, tbc; etalon/vLLM: itl).
ALIASES = {
    "ttfc": "ttft",
    "tbc": "tbt",
    "itl": "tbt",
    "end_to_end_latency": "e2e",
    "fluidity": "fluidity_index",
}
SLO_METRICS = tuple(m for m in (*SCALAR_METRICS, *LIST_METRICS) if m not in SEND_METRICS)
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
_SPEC_RE = re.compile(r"^\s*([a-z_]+)\s*:\s*p(\d+(?:\.\d+)?)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*(ms|s)?\s*$")


class SloError(ValueError):
    """An SLO definition that cannot be used; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Percentile `percentile` (0..1) of `metric` must satisfy `op value` (seconds for times)."""

    name: str
    metric: str
    percentile: float
    value: float
    op: str = "<="

    @property
    def key(self) -> str:
        """Stable key such as `ttft_p99`."""
        return f"{self.metric}_p{self.percentile * 100:g}"

    @property
    def lower_is_better(self) -> bool:
        """True for `<=`/`<` objectives."""
        return self.op in ("<=", "<")

    def holds(self, observed: float) -> bool:
        """Whether one observed value satisfies the objective."""
        return _OPS[self.op](observed, self.value)


def _metric(name: str, where: str) -> str:
    metric = ALIASES.get(name, name)
    if metric not in SLO_METRICS:
        raise SloError(f"{where}: unknown SLO metric {name!r} (use one of {', '.join(SLO_METRICS)})")
    return metric


def parse_slo(spec: str) -> Slo:
    """Parse `metric:pNN<=value[ms|s]`, e.g. `ttft:p99<=0.5` or `tbt:p90<=50ms`."""
    m = _SPEC_RE.match(spec)
    if not m:
        raise SloError(f"--slo {spec!r}: expected METRIC:pNN<=VALUE, e.g. ttft:p99<=0.5 or tbt:p90<=50ms")
    name, pct, op, raw, unit = m.groups()
    metric = _metric(name, f"--slo {spec!r}")
    q = float(pct)
    if not 0 < q <= 100:
        raise SloError(f"--slo {spec!r}: percentile must be in (0, 100]")
    try:
        value = float(raw) * (0.001 if unit == "ms" else 1.0)
    except ValueError:
        raise SloError(f"--slo {spec!r}: {raw!r} is not a number") from None
    return Slo(name=spec.strip(), metric=metric, percentile=q / 100.0, value=value, op=op)


def slo_from_mapping(item: Any, where: str) -> Slo:
    """One seed-002 YAML entry: {name, metric, percentile (0..1), value, type: constant}."""
    if not isinstance(item, dict):
        raise SloError(f"{where}: an SLO must be a mapping with metric, percentile and value")
    unknown = set(item) - {"name", "metric", "percentile", "value", "type", "op"}
    if unknown:
        raise SloError(f"{where}: unknown SLO field(s) {', '.join(sorted(map(str, unknown)))}")
    for key in ("metric", "percentile", "value"):
        if key not in item:
            raise SloError(f"{where}: SLO is missing {key!r}")
    if item.get("type", "constant") != "constant":
        raise SloError(f"{where}: SLO type {item['type']!r} is not supported (only 'constant')")
    metric = _metric(str(item["metric"]), where)
    try:
        pct = float(item["percentile"])
        value = float(item["value"])
    except (TypeError, ValueError):
        raise SloError(f"{where}: percentile and value must be numbers") from None
    if not 0 < pct <= 1:
        raise SloError(f"{where}: percentile must be a fraction in (0, 1], e.g. 0.99")
    op = str(item.get("op", ">=" if metric in HIGHER_IS_BETTER else "<="))
    if op not in _OPS:
        raise SloError(f"{where}: op must be one of {', '.join(_OPS)}")
    name = str(item.get("name") or f"p{pct * 100:g} {metric} {op} {value:g}")
    return Slo(name=name, metric=metric, percentile=pct, value=value, op=op)


def evaluate(slos: Sequence[Slo], records: Sequence[RequestRecord]) -> dict[str, Any]:
    """slo_results.json (seed 002 shape): `all_slos_met` and each objective's observed value."""
    results = []
    for slo in slos:
        values = metric_array(records, slo.metric)
        observed: float | None = None
        if len(values):
            observed = arrays.percentiles_sorted(arrays.as_sorted(values), [slo.percentile * 100])[0]
        results.append(
            {
                "met": observed is not None and slo.holds(observed),
                "slo_metric_key": slo.key,
                "observed_value": observed,
                "threshold": slo.value,
                "percentile": slo.percentile,
                "metric": slo.metric,
                "op": slo.op,
                "name": slo.name,
                "lower_is_better": slo.lower_is_better,
                "samples": len(values),
            }
        )
    return {"all_slos_met": all(r["met"] for r in results), "results": results}


def request_meets(slo: Slo, record: RequestRecord) -> bool:
    """Whether one request meets an objective: its own value, or its own percentile of a per-token list."""
    if not record.ok:
        return False
    if slo.metric in LIST_METRICS:
        series = record.series(slo.metric)
        return not series or slo.holds(percentile(series, slo.percentile * 100))
    value = record.scalar(slo.metric)
    return value is not None and slo.holds(value)


def goodput(slos: Sequence[Slo], records: Sequence[RequestRecord], wall_s: float) -> dict[str, Any]:
    """Requests meeting every SLO over all measured requests, errored ones included."""
    measured = [r for r in records if not r.warmup]
    good = sum(1 for r in measured if r.ok and all(request_meets(s, r) for s in slos))
    return {
        "good_requests": good,
        "measured_requests": len(measured),
        "goodput_ratio": good / len(measured) if measured else None,
        "goodput_requests_per_s": good / wall_s if wall_s > 0 else None,
    }
