"""Pieces every tokwatch dashboard shares: template variables, annotations, the dashboard shell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib import core as g

from dashboards.panels import PROMETHEUS, PROMETHEUS_UID

# Grafana 10.4+ model; older keys grafanalib still emits are ignored by Grafana.
SCHEMA_VERSION = 39
TAGS = ["tokwatch", "llm"]


def datasource_variable() -> g.Template:
    """`$datasource`: which Prometheus to query, defaulting to the provisioned one."""
    return g.Template(
        name="datasource",
        label="Prometheus",
        type="datasource",
        query="prometheus",
        default=PROMETHEUS_UID,
        refresh=g.REFRESH_ON_DASHBOARD_LOAD,
    )


def query_variable(
    name: str, label: str, query: str, multi: bool = True, default: str | None = "$__all"
) -> g.Template:
    """A Prometheus `label_values(...)` variable; multi-select with All unless told otherwise. All is `.*`
    rather than the list of values: it also matches a series without the label (no `site:` configured) and
    stays short at fleet size."""
    return g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=PROMETHEUS,
        multi=multi,
        includeAll=multi,
        allValue=".*" if multi else None,
        default=default,
        refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=g.SORT_ALPHA_IGNORE_CASE_ASC,
    )


def site_variable() -> g.Template:
    """`$site`: the vantage points (exporters' `site:`), several at once; All also matches no site."""
    return query_variable("site", "Site", "label_values(tokwatch_endpoint_info, site)")


def workload_variable() -> g.Template:
    """`$workload`: the probe workloads, several at once (every per-run query keeps `workload` apart)."""
    return query_variable("workload", "Workload", "label_values(tokwatch_probe_runs_total, workload)")


def custom_variable(name: str, label: str, values: Sequence[str], default: str) -> g.Template:
    """A fixed list of choices (e.g. range windows)."""
    return g.Template(name=name, label=label, type="custom", query=",".join(values), default=default)


def builtin_annotation() -> dict[str, Any]:
    """Grafana's own annotations & alerts entry, which every dashboard normally carries."""
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def prometheus_annotation(
    name: str, expr: str, title: str, text: str, tags: str, color: str, step: str = "1m"
) -> dict[str, Any]:
    """Marks every step where `expr` returns a sample (contiguous steps merge into a region).

    The query goes in `target` (expr, and the step as `interval`), where Grafana's Prometheus plugin reads
    it since Grafana 10 (it moves a top-level `expr`/`step` there on load); the title, text and tag keys stay
    on the annotation, where the plugin reads them when it turns samples into events."""
    return {
        "datasource": PROMETHEUS,
        "enable": True,
        "iconColor": color,
        "name": name,
        "target": {"expr": expr, "interval": step, "refId": "Anno"},
        "tagKeys": tags,
        "textFormat": text,
        "titleFormat": title,
        "useValueForTime": False,
    }


def dashboard(
    title: str,
    uid: str,
    description: str,
    panels: list[Any],
    variables: list[g.Template],
    annotations: Sequence[dict[str, Any]] = (),
    time_from: str = "now-24h",
    refresh: str = "1m",
) -> g.Dashboard:
    """A dashboard with stable uid, tokwatch tags, numbered panels and shared crosshair."""
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=TAGS,
        panels=panels,
        templating=g.Templating(list=variables),
        annotations=g.Annotations(list=[builtin_annotation(), *annotations]),
        time=g.Time(time_from, "now"),
        refresh=refresh,
        timezone="browser",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
        editable=True,
        links=[
            {
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "icon": "external link",
                "tags": ["tokwatch"],
                "targetBlank": False,
                "title": "tokwatch",
                "tooltip": "",
                "type": "dashboards",
            }
        ],
    ).auto_panel_ids()
