"""grafanalib's dashboard JSON in the model Grafana 11 reads: no nulls, no keys Grafana no longer reads.

grafanalib 0.7 writes every attribute it knows, null when unset, including keys of Grafana's pre-7 graph and
table panels, of pre-8 templating (tags) and of its own row layout. Grafana ignores them, and
grafana-foundation-sdk's loader raises TypeError on the nulls. A key is removed here when Grafana's own
schema does not define it where it stands: @grafana/schema 11.6 for the dashboard, panel, row, variable and
time-picker models, grafana-foundation-sdk 11.6 for the Prometheus query model, Grafana's SQL query model
for PostgreSQL targets. tests/dashboards/test_grafana_schema.py checks the result against both.
"""

from __future__ import annotations

from typing import Any

# Dashboard: `rows` (pre-5 layout), `sharedCrosshair` (replaced by graphTooltip), `hideControls`, `style`
# (removed from the model), `__inputs` (an export-for-sharing list, empty here).
_DASHBOARD = ("__inputs", "hideControls", "rows", "sharedCrosshair", "style")
# Time picker: `time_options` is no longer in TimePickerConfig (hidden, nowDelay, quick_ranges,
# refresh_intervals).
_TIMEPICKER = ("time_options",)
# Panels: grafanalib's row-layout keys (`span`, `height`, `minSpan`), `editable`/`error` (panel state of
# the Angular era), and the old table panel's `columns`, `fontSize`, `color`, `mappings`, which the current
# table reads from `fieldConfig.defaults` (all four were at their defaults).
_PANEL = ("editable", "error", "span", "height", "minSpan", "columns", "fontSize", "color", "mappings")
# A row is RowPanel: these keys only.
_ROW_KEEP = ("collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type")
# Targets: `metric` and `target` (Graphite-era), `query` (a copy of `expr`), `step` (pre-7 Prometheus
# resolution) are in no query model; a PostgreSQL target also drops grafanalib's Prometheus fields.
_TARGET = ("metric", "target", "query", "step")
_SQL_TARGET = (*_TARGET, "expr", "legendFormat", "instant", "intervalFactor", "interval")
# Variables: tag support was removed in Grafana 8 (`tags`, `tagsQuery`, `tagValuesQuery`, `useTags`);
# `auto`, `auto_count`, `auto_min` belong to interval variables only.
_VARIABLE = ("tags", "tagsQuery", "tagValuesQuery", "useTags")
_INTERVAL_ONLY = ("auto", "auto_count", "auto_min")
SQL_DATASOURCE_TYPES = ("grafana-postgresql-datasource", "postgres")


def without_nulls(value: Any, key: str = "") -> Any:
    """`value` with every null dropped, except a threshold step's `value`: the schema requires it and null
    is how Grafana writes the base step (-Infinity)."""
    if isinstance(value, dict):
        in_step = key == "steps"  # a threshold step (list items carry the list key)
        return {
            k: without_nulls(v, k) for k, v in value.items() if v is not None or (k == "value" and in_step)
        }
    if isinstance(value, list):
        return [without_nulls(v, key) for v in value]  # list items are read under the list's key
    return value


def _drop(obj: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        obj.pop(key, None)


def _target(target: dict[str, Any]) -> None:
    datasource = target.get("datasource")
    sql = isinstance(datasource, dict) and datasource.get("type") in SQL_DATASOURCE_TYPES
    _drop(target, _SQL_TARGET if sql else _TARGET)


def _panel(panel: dict[str, Any]) -> dict[str, Any]:
    if panel.get("type") == "row":
        row = {k: v for k, v in panel.items() if k in _ROW_KEEP}
        row["panels"] = [_panel(p) for p in row.get("panels", [])]  # a collapsed row holds its panels
        return row
    _drop(panel, _PANEL)
    for target in panel.get("targets", []):
        _target(target)
    return panel


def _variable(variable: dict[str, Any]) -> None:
    _drop(variable, _VARIABLE)
    if variable.get("type") != "interval":
        _drop(variable, _INTERVAL_ONLY)
    current = variable.get("current")
    if isinstance(current, dict):
        current.pop("tags", None)
        if "text" not in current or "value" not in current:
            # No default (grafanalib wrote nulls): Grafana selects the first option on load; an option
            # needs text and value.
            del variable["current"]


def current_model(model: dict[str, Any]) -> dict[str, Any]:
    """The dashboard JSON without nulls and without keys Grafana 11's model does not define."""
    clean: dict[str, Any] = without_nulls(model)
    _drop(clean, _DASHBOARD)
    _drop(clean.get("timepicker", {}), _TIMEPICKER)
    clean["panels"] = [_panel(p) for p in clean.get("panels", [])]
    for variable in clean.get("templating", {}).get("list", []):
        _variable(variable)
    return clean
