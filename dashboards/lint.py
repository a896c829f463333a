"""Static checks for PromQL and Grafana dashboard JSON: metric names, panel types, layout.

`metric_names_in_promql` is shared with the Prometheus-rules lint; the rest checks a dashboard model as
Grafana would load it, because no Grafana runs in the tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Functions, aggregations, operators and literals that look like identifiers in PromQL.
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "atan2",
        "inf",
        "nan",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*)\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\s*\((.*)\)\s*$", re.DOTALL)

# Series Prometheus itself attaches to every scrape target; they are not defined by tokwatch.
PROMETHEUS_TARGET_SERIES = frozenset(
    {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling"}
)

# Panel types Grafana renders only through the removed AngularJS framework.
ANGULAR_PANEL_TYPES = frozenset(
    {
        "graph",
        "singlestat",
        "table-old",
        "heatmap-old",
        "grafana-singlestat-panel",
        "grafana-piechart-panel",
        "grafana-worldmap-panel",
        "grafana-clock-panel",
        "grafana-polystat-panel",
        "natel-discrete-panel",
        "flant-statusmap-panel",
        "marcuscalidus-svg-panel",
        "larona-epict-panel",
        "ae3e-plotly-panel",
        "briangann-gauge-panel",
        "briangann-datatable-panel",
        "jdbranham-diagram-panel",
        "michaeldmoore-annunciator-panel",
        "vonage-status-panel",
    }
)

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names_in_promql(expr: str) -> set[str]:
    """Return every metric name a PromQL expression selects (functions, labels, keywords excluded).

    Grafana variables ($endpoint, ${datasource}, $__interval) are ignored, so dashboard queries parse.
    """
    names = {_unquote(m.group(1)) for m in _NAME_MATCHER.finditer(expr)}
    text = _GRAFANA_VAR.sub(" ", expr)
    text = _STRING.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    for match in _IDENT.finditer(text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or aggregation call, or an operator keyword
        names.add(word)
    return names


def metric_names_in_template_query(query: str) -> set[str]:
    """Metric names in a Grafana Prometheus variable query (`label_values(...)`, `query_result(...)`)."""
    lv = _LABEL_VALUES.match(query)
    if lv:
        args = lv.group(1)
        # label_values(selector, label): the last top-level comma separates the label name.
        depth = 0
        for i in range(len(args) - 1, -1, -1):
            ch = args[i]
            depth += ch in ")}]"
            depth -= ch in "({["
            if ch == "," and depth == 0:
                return metric_names_in_promql(args[:i])
        return set()  # label_values(label): no metric involved
    qr = _QUERY_RESULT.match(query)
    if qr:
        return metric_names_in_promql(qr.group(1))
    return metric_names_in_promql(query)


def _unquote(literal: str) -> str:
    return literal[1:-1]


@dataclass(frozen=True)
class MetricCatalog:
    """Metric names a contract defines; histograms also expose `_bucket`, `_sum`, `_count`."""

    names: frozenset[str]
    histograms: frozenset[str]

    def defines(self, name: str) -> bool:
        """True if `name` is a series the contract produces (incl. histogram and counter sub-series)."""
        if name in self.names or name in PROMETHEUS_TARGET_SERIES:
            return True
        for suffix in _HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in self.histograms:
                return True
        return False


_BACKTICK_METRIC = re.compile(r"`((?:tokwatch|process|python)_\w+)`")


def metrics_from_markdown(path: Path) -> MetricCatalog:
    """Read the metric names from the first column of every table in docs/metrics.md.

    A row is a histogram when its type cell says `histogram` or its table has a `buckets` column.
    """
    names: set[str] = set()
    histograms: set[str] = set()
    header: list[str] = []
    previous = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped.startswith("|"):
            header, previous = [], stripped
            continue
        cells = [c.strip().lower() for c in stripped.strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):
            header = [c.strip().lower() for c in previous.strip("|").split("|")]
            continue
        previous = stripped
        if not header:
            continue
        found = _BACKTICK_METRIC.findall(stripped.strip("|").split("|")[0])
        names.update(found)
        is_histogram = any("bucket" in h for h in header) or (len(cells) > 1 and cells[1] == "histogram")
        if is_histogram:
            histograms.update(found)
    return MetricCatalog(frozenset(names), frozenset(histograms))


def metrics_from_exposition(text: str) -> MetricCatalog:
    """The series names present in a /metrics scrape (Prometheus text format), e.g. a live tokwatch's."""
    names: set[str] = set()
    histograms: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            histograms.add(family.name)
    return MetricCatalog(frozenset(names), frozenset(histograms))


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard model, including panels nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def iter_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every Prometheus query of panels, annotations and template variables.

    Queries against other datasources (the PostgreSQL store) are skipped.
    """
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            source = target.get("datasource") or panel.get("datasource")
            if _is_prometheus(source) and target.get("expr"):
                where = f"panel {panel.get('id')} {panel.get('title')!r} ref {target.get('refId')}"
                yield where, target["expr"]
    for annotation in dashboard.get("annotations", {}).get("list", []):
        expr = annotation_expr(annotation)
        if _is_prometheus(annotation.get("datasource")) and expr:
            yield f"annotation {annotation.get('name')!r}", expr
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query" and _is_prometheus(variable.get("datasource")):
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, dict) else str(query or "")
            yield f"variable {variable.get('name')!r}", text


def annotation_expr(annotation: dict[str, Any]) -> str:
    """An annotation's PromQL: `target.expr` (Grafana 10+), or the older top-level `expr`; "" if none."""
    target = annotation.get("target")
    expr = target.get("expr") if isinstance(target, dict) else None
    return str(expr or annotation.get("expr") or "")


def _is_prometheus(datasource: object) -> bool:
    return isinstance(datasource, dict) and datasource.get("type") == "prometheus"


def unknown_metrics(dashboard: dict[str, Any], catalog: MetricCatalog) -> list[str]:
    """Problems naming each query that selects a metric the catalog does not define."""
    problems = []
    for where, expr in iter_queries(dashboard):
        parse = metric_names_in_template_query if where.startswith("variable") else metric_names_in_promql
        for name in sorted(parse(expr)):
            if not catalog.defines(name):
                problems.append(f"{dashboard.get('uid')}: {where} queries unknown metric {name!r}")
    return problems


def angular_panels(dashboard: dict[str, Any]) -> list[str]:
    """Problems naming each panel whose type needs Grafana's removed Angular support."""
    return [
        f"{dashboard.get('uid')}: panel {p.get('id')} {p.get('title')!r} has Angular type {p.get('type')!r}"
        for p in iter_panels(dashboard)
        if p.get("type") in ANGULAR_PANEL_TYPES
    ]


def layout_problems(dashboard: dict[str, Any]) -> list[str]:
    """Duplicate panel ids, gridPos outside the 24-column grid, and overlapping panels."""
    uid = dashboard.get("uid")
    problems: list[str] = []
    seen: set[int] = set()
    boxes: list[tuple[str, int, int, int, int]] = []
    for panel in iter_panels(dashboard):
        pid, title = panel.get("id"), panel.get("title")
        if not isinstance(pid, int):
            problems.append(f"{uid}: panel {title!r} has no integer id")
        elif pid in seen:
            problems.append(f"{uid}: panel id {pid} is used twice")
        else:
            seen.add(pid)
        grid = panel.get("gridPos") or {}
        try:
            x, y, w, h = (int(grid[k]) for k in ("x", "y", "w", "h"))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{uid}: panel {pid} {title!r} has no complete gridPos")
            continue
        if w < 1 or h < 1 or x < 0 or y < 0 or x + w > 24:
            problems.append(f"{uid}: panel {pid} {title!r} gridPos {grid} is outside the 24-column grid")
        boxes.append((f"{pid} {title!r}", x, y, w, h))
    problems.extend(_overlaps(uid, boxes))
    return problems


def _overlaps(uid: object, boxes: Iterable[tuple[str, int, int, int, int]]) -> Iterator[str]:
    placed: list[tuple[str, int, int, int, int]] = []
    for box in boxes:
        name, x, y, w, h = box
        for other, ox, oy, ow, oh in placed:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                yield f"{uid}: panel {name} overlaps panel {other}"
        placed.append(box)
