"""Panel builders on top of grafanalib: consistent units, datasources, thresholds and a grid layout.

Only current (non-Angular) panel types are built here: timeseries, stat, table, bargauge, state-timeline,
heatmap, barchart, xychart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import attr
from grafanalib import core as g

PROMETHEUS_UID = "tokwatch-prometheus"
POSTGRES_UID = "tokwatch-postgres"
POSTGRES_TYPE = "grafana-postgresql-datasource"

# Panels follow the dashboard's `datasource` variable, so one JSON works against any Prometheus.
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
POSTGRES = {"type": POSTGRES_TYPE, "uid": POSTGRES_UID}

TOKS = "suffix: tok/s"
SECONDS = "s"
RATIO = "percentunit"
COUNT = "short"


class DocRef(NamedTuple):
    """A section of the docs that defines a panel's number (checked by tests to exist)."""

    doc: str
    section: str


REF_STATUS = DocRef("docs/methodology.md", "Status")
REF_TIMING = DocRef("docs/methodology.md", "Timing sources")
REF_LATENCY = DocRef("docs/methodology.md", "Streamed latency figures")
REF_TOKENS = DocRef("docs/methodology.md", "Token counting")
REF_WINDOW = DocRef("docs/metrics.md", "Window figures")
REF_PERCENTILES = DocRef("docs/methodology.md", "Percentiles over windows")
REF_SELF_METRICS = DocRef("docs/metrics.md", "Exporter self-metrics")
REF_SERVER = DocRef("docs/methodology.md", "Server counters")
REF_NETWORK = DocRef("docs/methodology.md", "Network phases")
REF_STORAGE = DocRef("docs/metrics.md", "Storage")
REF_COST = DocRef("docs/methodology.md", "Cost and energy")

GREEN, AMBER, RED = "green", "#EAB839", "red"

# Minimum bucket for panels built on increase(...[$__interval]): at least 4 scrapes at the 30 s scrape
# interval of prometheus/prometheus.yml, or increase() has too few samples and returns nothing.
MIN_INTERVAL = "2m"


def steps(*pairs: tuple[str, float | None]) -> list[dict[str, Any]]:
    """Threshold steps [(color, from_value)]; the first step's value is None (the base)."""
    return [{"color": color, "value": value} for color, value in pairs]


def prom(
    expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series"
) -> g.Target:
    """A Prometheus query target bound to the dashboard's datasource variable (`fmt="table"` for tables)."""
    return g.Target(
        expr=expr,
        format=fmt,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        datasource=PROMETHEUS,
        intervalFactor=1,
        step=None,
    )


class SqlTarget(g.SqlTarget):
    """grafanalib's SqlTarget marked as hand-written SQL, so Grafana opens it in the code editor."""

    def to_json_data(self) -> dict[str, Any]:
        """Target JSON with `editorMode: code`."""
        return {**super().to_json_data(), "editorMode": "code"}


def sql(raw_sql: str, ref: str = "A", fmt: str = "table") -> SqlTarget:
    """A PostgreSQL query target against the provisioned tokwatch store (`fmt`: table or time_series)."""
    return SqlTarget(rawSql=raw_sql, refId=ref, format=fmt, datasource=POSTGRES, intervalFactor=1, step=None)


class Condition(NamedTuple):
    """What must hold for a panel to show data on a healthy install (the conditional panels), and a PromQL
    query that returns a sample exactly when it holds: the panel test (tests/dashboards) requires data from
    the panel whenever `probe` returns some, and lets it be empty otherwise. `$__range` is the time range."""

    text: str
    probe: str


CONDITION_PREFIX = "Shows data only when "
HISTOGRAMS = Condition(
    "the exporter's latency histograms are on (`metrics.histograms: true`; off by default)",
    "count(tokwatch_ttft_seconds_bucket)",
)
SCRAPE_FAILED = Condition(
    "a scrape of an inference server's /metrics failed in the time range",
    "sum(increase(tokwatch_server_scrape_errors_total[$__range])) > 0",
)
PREEMPTED = Condition(
    "a server preempted (vLLM) or retracted (SGLang) requests in the time range",
    "sum(increase(tokwatch_server_preemptions_total[$__range])) > 0",
)
MIRRORED_COUNTERS = Condition(
    "an endpoint lists a counter in `mirror_metrics` and it increased in the time range",
    "sum(increase(tokwatch_server_mirrored_total[$__range])) > 0",
)
MIRRORED_GAUGES = Condition(
    "an endpoint lists a gauge in `mirror_metrics`", "count(tokwatch_server_mirrored_value)"
)
OLLAMA = Condition(
    "an Ollama endpoint is probed (its /api/ps answers)", "count(tokwatch_server_model_vram_ratio)"
)
OLLAMA_RELOADED = Condition(
    "an Ollama endpoint had to reload its model in the time range",
    "sum(increase(tokwatch_server_model_reloads_total[$__range])) > 0",
)
PRICED = Condition(
    "an endpoint has prices (its `pricing:`, `pricing.models`, a price table or an OpenRouter list)",
    "count(tokwatch_pricing_info)",
)
PROBE_SPEND = Condition(
    "a priced endpoint's probe runs cost something in the time range",
    "sum(increase(tokwatch_probe_cost_total[$__range])) > 0",
)
POWERED = Condition(
    "an endpoint has a `power_metrics_url` (a DCGM exporter or node_exporter /metrics) and its idle baseline "
    "was measured",
    "count(tokwatch_energy_idle_watts)",
)
CONDITIONS = (
    HISTOGRAMS,
    SCRAPE_FAILED,
    PREEMPTED,
    MIRRORED_COUNTERS,
    MIRRORED_GAUGES,
    OLLAMA,
    OLLAMA_RELOADED,
    PRICED,
    PROBE_SPEND,
    POWERED,
)


def describe(text: str, ref: DocRef, condition: Condition | None = None) -> str:
    """Panel description ending with where the number is defined (docs file and section), and for a
    conditional panel with what must hold for it to show data (read back by `condition_of`)."""
    described = f'{text} Definition: {ref.doc}, section "{ref.section}".'
    return f"{described} {CONDITION_PREFIX}{condition.text}." if condition else described


def condition_of(description: str) -> Condition | None:
    """The condition a panel's description names (None: the panel always shows data once probes ran)."""
    for condition in CONDITIONS:
        if description.endswith(f"{CONDITION_PREFIX}{condition.text}."):
            return condition
    return None


def stat(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    unit: str,
    thresholds: list[dict[str, Any]] | None = None,
    mappings: list[dict[str, Any]] | None = None,
    decimals: int | None = None,
    text_mode: str = "value_and_name",
    color_mode: str = "value",
    graph: bool = False,
    datasource: dict[str, str] = PROMETHEUS,
    no_value: str = "no data",
) -> g.Stat:
    """One tile per series (per endpoint), last value, coloured by thresholds."""
    return g.Stat(
        title=title,
        description=description,
        dataSource=datasource,
        targets=list(targets),
        format=unit,
        decimals=decimals,
        reduceCalc="lastNotNull",
        textMode=text_mode,
        colorMode=color_mode,
        graphMode="area" if graph else "none",
        color={"mode": "thresholds"},
        thresholds=thresholds or steps((GREEN, None)),
        mappings=mappings or [],
        noValue=no_value,
        maxDataPoints=100,
    )


def timeseries(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    unit: str,
    overrides: list[dict[str, Any]] | None = None,
    min_interval: str | None = None,
    draw: str = "line",
    fill: int = 10,
    points: str = "auto",
    datasource: dict[str, str] = PROMETHEUS,
    legend: bool = True,
) -> g.TimeSeries:
    """A time-series panel with a table legend showing last and max, nulls left as gaps."""
    return g.TimeSeries(
        title=title,
        description=description,
        dataSource=datasource,
        targets=list(targets),
        unit=unit,
        overrides=overrides or [],
        interval=min_interval,
        drawStyle=draw,
        fillOpacity=fill,
        showPoints=points,
        spanNulls=False,
        legendDisplayMode="table" if legend else "hidden",
        legendCalcs=["lastNotNull", "max"] if legend else [],
        tooltipMode="multi",
        tooltipSort="desc",
        maxDataPoints=500,
    )


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    mappings: list[dict[str, Any]],
    min_interval: str | None = None,
) -> g.StateTimeline:
    """Per-endpoint state over time, coloured by value mappings."""
    return g.StateTimeline(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=list(targets),
        mappings=mappings,
        colorMode="fixed",
        interval=min_interval,
        mergeValues=True,
        showValue="never",
        fillOpacity=80,
        rowHeight=0.8,
        maxDataPoints=500,
    )


def table(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    overrides: list[dict[str, Any]] | None = None,
    transformations: list[dict[str, Any]] | None = None,
    datasource: dict[str, str] = PROMETHEUS,
) -> g.Table:
    """A (non-Angular) table panel."""
    return g.Table(
        title=title,
        description=description,
        dataSource=datasource,
        targets=list(targets),
        overrides=overrides or [],
        transformations=transformations or [],
        filterable=True,
    )


class BarGauge(g.BarGauge):
    """grafanalib's BarGauge with the current `options.reduceOptions` / `fieldConfig` model.

    The upstream class still emits the Grafana 6 `fieldOptions` block, which current Grafana ignores.
    """

    def to_json_data(self) -> dict[str, Any]:
        """Panel JSON in the bargauge model Grafana has used since 7.0."""
        return self.panel_json(
            {
                "fieldConfig": {
                    "defaults": {
                        "color": {"mode": "thresholds"},
                        "decimals": self.decimals,
                        "max": self.max,
                        "min": self.min,
                        "unit": self.format,
                        "mappings": self.valueMaps,
                        "thresholds": {"mode": "absolute", "steps": self.thresholds},
                    },
                    "overrides": [],
                },
                "options": {
                    "displayMode": self.displayMode,
                    "orientation": self.orientation,
                    "reduceOptions": {"calcs": [self.calc], "fields": "", "values": self.allValues},
                    "showUnfilled": True,
                    "valueMode": "color",
                    "namePlacement": "auto",
                    "sizing": "auto",
                    "minVizWidth": 8,
                    "minVizHeight": 16,
                },
                "type": g.BARGAUGE_TYPE,
            }
        )


def bargauge(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    unit: str,
    thresholds: list[dict[str, Any]],
    maximum: float | None = None,
) -> BarGauge:
    """Horizontal bars, one per series, for ranking endpoints."""
    return BarGauge(
        title=title,
        description=description,
        dataSource=PROMETHEUS,
        targets=list(targets),
        format=unit,
        calc="lastNotNull",
        displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT,
        orientation=g.ORIENTATION_HORIZONTAL,
        thresholds=thresholds,
        min=0,
        max=maximum,
    )


@attr.s
class Heatmap(g.Panel):
    """The current heatmap panel (Grafana 9+), fed pre-bucketed Prometheus histograms.

    grafanalib's Heatmap emits the legacy Angular model (`cards`, `dataFormat`, ...), so it is not used.
    """

    unit: str = attr.ib(default="")

    def to_json_data(self) -> dict[str, Any]:
        """Panel JSON in the heatmap model with `calculate: false` (buckets come from `le`)."""
        return self.panel_json(
            {
                "fieldConfig": {
                    "defaults": {"custom": {"scaleDistribution": {"type": "linear"}}},
                    "overrides": [],
                },
                "options": {
                    "calculate": False,
                    "cellGap": 1,
                    "color": {
                        "mode": "scheme",
                        "scheme": "Oranges",
                        "scale": "exponential",
                        "exponent": 0.5,
                        "steps": 64,
                        "reverse": False,
                        "fill": "dark-orange",
                    },
                    "filterValues": {"le": 1e-9},
                    "legend": {"show": True},
                    "rowsFrame": {"layout": "auto"},
                    "showValue": "never",
                    "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
                    "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
                },
                "type": "heatmap",
            }
        )


def heatmap(title: str, description: str, expr: str, unit: str) -> Heatmap:
    """Distribution over time of a histogram: `expr` must return one series per `le` bucket."""
    fields: dict[str, Any] = {
        "unit": unit,
        "title": title,
        "description": description,
        "dataSource": PROMETHEUS,
        "targets": [prom(expr, "{{le}}", fmt="heatmap")],
        "interval": MIN_INTERVAL,
        "maxDataPoints": 200,
    }
    return Heatmap(**fields)


@attr.s
class BarChart(g.BarChart):
    """grafanalib's BarChart with the two keys it lacks: `options.xField` (the bars' labels) and a unit."""

    x_field: str = attr.ib(default="")
    unit: str = attr.ib(default="")

    def to_json_data(self) -> dict[str, Any]:
        """Panel JSON with `options.xField` and `fieldConfig.defaults.unit`."""
        model: dict[str, Any] = super().to_json_data()
        model["options"]["xField"] = self.x_field
        model["fieldConfig"]["defaults"]["unit"] = self.unit
        model["fieldConfig"]["defaults"]["color"] = {"mode": "palette-classic"}
        return model


def stacked_bars(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    unit: str,
    x_field: str,
    transformations: list[dict[str, Any]],
) -> BarChart:
    """Horizontal stacked bars, one per row of the (transformed) table, one segment per other column."""
    # A dict, as for Heatmap: mypy's attrs plugin sees only the fields declared here, not grafanalib's.
    fields: dict[str, Any] = {
        "title": title,
        "description": description,
        "dataSource": PROMETHEUS,
        "targets": list(targets),
        "transformations": transformations,
        "orientation": "horizontal",
        "stacking": "normal",
        "showValue": "never",
        "legendDisplayMode": "list",
        "legendPlacement": "bottom",
        "tooltipMode": "multi",
        "fillOpacity": 80,
        "x_field": x_field,
        "unit": unit,
    }
    return BarChart(**fields)


@attr.s
class XYChart(g.Panel):
    """Grafana's XY chart (core since 10.4, the 11.x model): one point per row of each frame, the field
    named `x_field` on the x axis against the frame's other numeric field; one colour and legend entry per
    frame."""

    x_field: str = attr.ib(default="")
    x_label: str = attr.ib(default="")
    y_label: str = attr.ib(default="")
    x_unit: str = attr.ib(default="")
    y_unit: str = attr.ib(default="")

    def to_json_data(self) -> dict[str, Any]:
        """Panel JSON: auto series mapping on `x_field`, points only, axis labels and units per axis."""
        axis = {"axisPlacement": "auto", "axisBorderShow": False, "scaleDistribution": {"type": "linear"}}
        return self.panel_json(
            {
                "fieldConfig": {
                    "defaults": {
                        "color": {"mode": "palette-classic"},
                        "custom": {**axis, "show": "points", "pointSize": {"fixed": 9}, "axisLabel": ""},
                        "unit": self.y_unit,
                    },
                    "overrides": [
                        {
                            "matcher": {"id": "byName", "options": self.x_field},
                            "properties": [
                                {"id": "unit", "value": self.x_unit},
                                {"id": "custom.axisLabel", "value": self.x_label},
                            ],
                        },
                        {
                            "matcher": {"id": "byType", "options": "number"},
                            "properties": [{"id": "custom.axisLabel", "value": self.y_label}],
                        },
                    ],
                },
                "options": {
                    "mapping": "auto",
                    "series": [{"x": {"matcher": {"id": "byName", "options": self.x_field}}}],
                    "legend": {"showLegend": True, "displayMode": "list", "placement": "right", "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"},
                },
                "type": "xychart",
            }
        )


def xy_chart(
    title: str,
    description: str,
    targets: Sequence[g.Target],
    transformations: list[dict[str, Any]],
    x: tuple[str, str, str],
    y: tuple[str, str],
) -> XYChart:
    """A scatter of instant figures: `x` = (field name, axis label, unit) of the transformed frames, `y` =
    (axis label, unit) of their other numeric field."""
    fields: dict[str, Any] = {  # a dict, as for BarChart: mypy's attrs plugin sees only the fields here
        "title": title,
        "description": description,
        "dataSource": PROMETHEUS,
        "targets": list(targets),
        "transformations": transformations,
        "x_field": x[0],
        "x_label": x[1],
        "x_unit": x[2],
        "y_label": y[0],
        "y_unit": y[1],
    }
    return XYChart(**fields)


def value_mapping(options: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """Grafana value mappings: {raw value: (text, color)}."""
    return [
        {
            "type": "value",
            "options": {
                value: {"text": text, "color": color, "index": i}
                for i, (value, (text, color)) in enumerate(options.items())
            },
        }
    ]


def by_ref(ref: str, **properties: Any) -> dict[str, Any]:
    """A field override for every series of one query (refId)."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [{"id": key, "value": value} for key, value in properties.items()],
    }


class Grid:
    """Places panels left to right on Grafana's 24-column grid, wrapping to a new line when full.

    Rows start on a fresh line, so no two panels can overlap.
    """

    WIDTH = 24

    def __init__(self) -> None:
        self.panels: list[Any] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def row(self, title: str, repeat: str | None = None) -> None:
        """A full-width, expanded row header; `repeat` names a variable to repeat it (and its panels) over."""
        self._newline()
        self.panels.append(
            g.RowPanel(
                title=title,
                gridPos=g.GridPos(h=1, w=self.WIDTH, x=0, y=self._y),
                repeat=g.Repeat(variable=repeat) if repeat else g.Repeat(),
            )
        )
        self._y += 1

    def add(self, panel: Any, w: int, h: int) -> None:
        """Place `panel` with width `w` (1..24) and height `h`, after the previous one."""
        if not 1 <= w <= self.WIDTH:
            raise ValueError(f"panel {panel.title!r}: width {w} is outside 1..{self.WIDTH}")
        if self._x + w > self.WIDTH:
            self._newline()
        self.panels.append(attr.evolve(panel, gridPos=g.GridPos(h=h, w=w, x=self._x, y=self._y)))
        self._x += w
        self._line_height = max(self._line_height, h)

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0
