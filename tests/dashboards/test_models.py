"""The generated dashboards as Grafana would load them (no Grafana runs here, so the model is checked)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from grafanalib import core as g

from dashboards import generate, panels
from dashboards.lint import ANGULAR_PANEL_TYPES, angular_panels, iter_panels, layout_problems
from dashboards.promql import STATUS_CODES, WORKLOAD, divide, status_code, with_endpoint_info
from tokwatch.figures.result import Status

MODERN_TYPES = {
    "row",
    "stat",
    "timeseries",
    "table",
    "bargauge",
    "barchart",
    "state-timeline",
    "heatmap",
    "histogram",
    "xychart",
}
# Keys only the legacy Angular heatmap model has (same `type`, different panel).
LEGACY_HEATMAP_KEYS = {"cards", "dataFormat", "xBucketSize", "yBucketBound", "heatmap", "highlightCards"}
EXPECTED_UIDS = {
    "tokwatch-overview.json": "tokwatch-overview",
    "tokwatch-server.json": "tokwatch-server",
    "tokwatch-health.json": "tokwatch-health",
    "tokwatch-history.json": "tokwatch-history",
    "tokwatch-benchmarks.json": "tokwatch-benchmarks",
}


def _load() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(generate.JSON_DIR.glob("*.json"))
    }


MODELS = _load()


@pytest.fixture(params=sorted(MODELS), ids=lambda name: name.removesuffix(".json"))
def model(request: pytest.FixtureRequest) -> dict[str, Any]:
    return MODELS[request.param]


def _panel(model: dict[str, Any], title: str) -> dict[str, Any]:
    matches = [p for p in iter_panels(model) if p.get("title") == title]
    assert len(matches) == 1, f"{title!r}: {len(matches)} panels"
    return matches[0]


def test_stable_uids_and_titles() -> None:
    assert {name: m["uid"] for name, m in MODELS.items()} == EXPECTED_UIDS
    assert all(m["title"].startswith("tokwatch — ") for m in MODELS.values())


def test_dashboard_model_basics(model: dict[str, Any]) -> None:
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    assert "id" not in model  # Grafana assigns ids; a fixed one would clash on import
    assert "rows" not in model  # legacy rows layout not used
    assert "tokwatch" in model["tags"]
    assert model["time"]["to"] == "now"
    assert layout_problems(model) == []
    assert angular_panels(model) == []


def test_only_current_panel_types(model: dict[str, Any]) -> None:
    types = {p["type"] for p in iter_panels(model)}
    assert types <= MODERN_TYPES
    assert not types & ANGULAR_PANEL_TYPES


def test_heatmaps_use_the_current_model(model: dict[str, Any]) -> None:
    for panel in iter_panels(model):
        if panel["type"] == "heatmap":
            assert not LEGACY_HEATMAP_KEYS & set(panel), panel["title"]
            assert panel["options"]["calculate"] is False  # buckets come from the histogram's `le`
            assert all(t["format"] == "heatmap" and "sum by (le)" in t["expr"] for t in panel["targets"])


def test_grafanalib_heatmap_is_the_legacy_model() -> None:
    """Why dashboards.panels has its own Heatmap: grafanalib's emits the Angular-era model."""
    assert LEGACY_HEATMAP_KEYS & set(g.Heatmap(title="x").to_json_data())


def test_grafanalib_classes_emit_the_expected_types() -> None:
    """Which grafanalib class emits which `type`: the ones used are current, the legacy ones are Angular."""
    used = {
        g.TimeSeries: "timeseries",
        g.Stat: "stat",
        g.Table: "table",
        panels.BarGauge: "bargauge",
        g.StateTimeline: "state-timeline",
        g.RowPanel: "row",
        panels.Heatmap: "heatmap",
        panels.BarChart: "barchart",
    }
    for cls, kind in used.items():
        assert cls(title="x").to_json_data()["type"] == kind
        assert kind not in ANGULAR_PANEL_TYPES
    for legacy in (g.Graph, g.SingleStat, g.PieChart, g.Worldmap, g.Discrete, g.Statusmap):
        assert legacy(title="x", targets=[]).to_json_data()["type"] in ANGULAR_PANEL_TYPES


def test_bargauge_uses_the_current_field_config_model() -> None:
    bar = _panel(MODELS["tokwatch-overview.json"], "Ranking (7-day median tok/s)")
    assert "fieldOptions" not in bar["options"]
    assert bar["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
    assert bar["fieldConfig"]["defaults"]["unit"] == panels.TOKS


def test_every_panel_has_a_description(model: dict[str, Any]) -> None:
    for panel in iter_panels(model):
        if panel["type"] != "row":
            assert panel.get("description"), f"{panel['title']!r} has no description"


def test_prometheus_queries_follow_the_datasource_variable(model: dict[str, Any]) -> None:
    for panel in iter_panels(model):
        for target in panel.get("targets", []):
            if target.get("expr"):
                assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            else:
                assert target["datasource"] == {"type": panels.POSTGRES_TYPE, "uid": panels.POSTGRES_UID}
                assert target["rawSql"].lstrip().startswith("SELECT")


def test_ref_ids_are_unique_per_panel(model: dict[str, Any]) -> None:
    for panel in iter_panels(model):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_template_variables() -> None:
    def variables(name: str) -> dict[str, dict[str, Any]]:
        return {v["name"]: v for v in MODELS[name]["templating"]["list"]}

    overview = variables("tokwatch-overview.json")
    assert set(overview) == {"datasource", "endpoint", "site", "workload", "window", "latency_window"}
    workload = overview["workload"]  # several at once: every aggregation keeps `workload` apart
    assert workload["query"] == "label_values(tokwatch_probe_runs_total, workload)"
    site = overview["site"]
    assert site["query"] == "label_values(tokwatch_endpoint_info, site)"
    for variable in (workload, site):
        assert variable["multi"] is True and variable["includeAll"] is True
        # All is `.*`: it also matches series without the label (an exporter without `site:`)
        assert variable["allValue"] == ".*" and variable["current"]["value"] == "$__all"
    exprs = [t["expr"] for p in iter_panels(MODELS["tokwatch-overview.json"]) for t in p.get("targets", [])]
    per_run = [e for e in exprs if re.search(r"tokwatch_(probe|window|fleet)_|_seconds_bucket", e)]
    assert per_run and all('workload=~"$workload"' in e and 'site=~"$site"' in e for e in per_run)
    assert overview["datasource"]["type"] == "datasource" and overview["datasource"]["query"] == "prometheus"
    assert overview["datasource"]["current"]["value"] == panels.PROMETHEUS_UID
    endpoint = overview["endpoint"]
    assert endpoint["query"] == "label_values(tokwatch_endpoint_info, endpoint)"
    assert endpoint["multi"] is True and endpoint["includeAll"] is True
    assert overview["window"]["current"]["value"] == "24h"
    assert set(variables("tokwatch-server.json")) == {"datasource", "endpoint", "site", "workload"}
    assert set(variables("tokwatch-health.json")) == {"datasource", "instance", "site"}
    history = variables("tokwatch-history.json")
    assert set(history) == {"endpoint", "site", "workload"}
    assert all(v["datasource"]["uid"] == panels.POSTGRES_UID and v["multi"] for v in history.values())
    bench = variables("tokwatch-benchmarks.json")
    assert set(bench) == {"endpoint", "run"}
    assert all(v["datasource"]["uid"] == panels.POSTGRES_UID for v in bench.values())
    assert bench["run"]["multi"] is False and "__value" in bench["run"]["query"]


def test_variables_used_in_queries_are_defined(model: dict[str, Any]) -> None:
    defined = {v["name"] for v in model["templating"]["list"]}
    builtin = {"__interval", "__rate_interval", "__range", "__timeFilter", "__timeGroupAlias", "__all"}
    texts = [t.get("expr") or t.get("rawSql", "") for p in iter_panels(model) for t in p.get("targets", [])]
    texts += [p.get("title", "") for p in iter_panels(model)]
    texts += [a.get("expr", "") for a in model["annotations"]["list"]]
    used = {m for text in texts for m in re.findall(r"\$\{?(\w+)", text)}
    assert used - builtin <= defined


def test_per_endpoint_queries_honour_the_endpoint_and_site_variables() -> None:
    for name in ("tokwatch-overview.json", "tokwatch-server.json"):
        for panel in iter_panels(MODELS[name]):
            for target in panel.get("targets", []):
                expr = target["expr"]
                selectors = re.findall(r"tokwatch_\w+(\{[^}]*\})?", expr)
                assert selectors and all('site=~"$site"' in s for s in selectors), expr
                if "tokwatch_fleet_" in expr:
                    continue  # fleet-wide by definition
                assert all('endpoint=~"$endpoint"' in s for s in selectors), expr


def test_per_endpoint_aggregations_keep_sites_and_workloads_apart() -> None:
    """Two sites never fold into one line: every `by (...)` over a per-endpoint family keeps `site` (and
    `workload` where the family has one), and every legend naming the endpoint names its site."""
    for name in ("tokwatch-overview.json", "tokwatch-server.json", "tokwatch-health.json"):
        for panel in iter_panels(MODELS[name]):
            for target in panel.get("targets", []):
                expr, legend = target.get("expr", ""), target.get("legendFormat", "")
                if "tokwatch_" not in expr or "instance" in expr.split("(")[0]:
                    continue
                for keyword, clause in re.findall(r"\b(by|on) \(([^)]*)\)", expr):
                    labels = {label.strip() for label in clause.split(",")}
                    if labels & {"le", "instance"}:
                        continue  # the heatmap sums buckets; health's own panels are per exporter
                    assert "site" in labels, f"{panel['title']}: by ({clause}) in {expr}"
                    # a join of an endpoint's info series (kind and model, or its prices' currency)
                    info = bool(labels & {"kind", "currency"}) or (
                        keyword == "on" and labels == {"endpoint", "site"}
                    )
                    if re.search(r"tokwatch_(probe|window|fleet)_", expr) and not info:
                        assert "workload" in labels, f"{panel['title']}: by ({clause}) in {expr}"
                if "{{endpoint}}" in legend:
                    assert "{{endpoint}} @ {{site}}" in legend, f"{panel['title']}: {legend}"


def test_units_are_consistent() -> None:
    overview = MODELS["tokwatch-overview.json"]
    for title in (
        "Last ok run",
        "$window median",
        "± stddev",
        "Recent runs",
        "Ranking (7-day median tok/s)",
        "Decode tok/s and failed runs",
    ):
        assert _panel(overview, title)["fieldConfig"]["defaults"]["unit"] == "suffix: tok/s"
    for title in ("CV ($window)", "Uptime ($window)"):
        assert _panel(overview, title)["fieldConfig"]["defaults"]["unit"] == "percentunit"
    for title in (
        "TTFT per run and p50 ($window)",
        "E2E latency per run",
        "Inter-token latency p50 / p99 (histogram)",
        "TPOT p50 / p95 / mean (histogram)",
        "TTOT per run",
        "Network phases per endpoint",
    ):
        assert _panel(overview, title)["fieldConfig"]["defaults"]["unit"] == "s"


def test_cv_tile_thresholds_are_5_and_15_percent() -> None:
    cv = _panel(MODELS["tokwatch-overview.json"], "CV ($window)")
    steps = cv["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [
        {"color": "green", "value": None},
        {"color": "#EAB839", "value": 0.05},
        {"color": "red", "value": 0.15},
    ]
    assert cv["fieldConfig"]["defaults"]["color"] == {"mode": "thresholds"}
    assert cv["options"]["colorMode"] == "background"  # the band, not coloured text


def test_overview_is_a_tile_wall_repeated_per_endpoint() -> None:
    panels = MODELS["tokwatch-overview.json"]["panels"]
    row = panels[0]
    assert row["type"] == "row" and row["title"] == "$endpoint" and row["repeat"] == "endpoint"
    tiles = []
    for p in panels[1:]:
        if p["type"] == "row":
            break
        tiles.append(p)
    assert [p["title"] for p in tiles] == [
        "Status",
        "Last ok run",
        "$window median",
        "CV ($window)",
        "± stddev",
        "Uptime ($window)",
        "Recent runs",
    ]
    assert sum(p["gridPos"]["w"] for p in tiles) == 24 and {p["gridPos"]["y"] for p in tiles} == {1}
    # an endpoint that never had an ok run still gets its tiles, each saying so
    no_value = {p["title"]: p["fieldConfig"]["defaults"].get("noValue") for p in tiles if p["type"] == "stat"}
    assert no_value["Status"] == "NO RUNS" and no_value["Last ok run"] == "no ok run yet"
    assert all(no_value.values())
    spark = tiles[-1]
    assert spark["type"] == "timeseries" and spark["options"]["legend"]["displayMode"] == "hidden"
    assert {t["refId"] for t in spark["targets"]} == {"A", "B"}  # ok tok/s line + failed-run bars
    strip = [p for p in panels if p["type"] == "row" and p["title"].startswith("Comparison")]
    assert strip and strip[0].get("repeat") is None
    pairs = _panel(MODELS["tokwatch-overview.json"], "X is N % faster than the next")
    assert "tokwatch_fleet_faster_than_next_ratio" in pairs["targets"][0]["expr"]
    assert "$endpoint" not in pairs["targets"][0]["expr"]  # the whole fleet, whatever is selected


def test_status_pill_maps_every_status_to_text() -> None:
    for title in ("Status", "Status timeline"):
        panel = _panel(MODELS["tokwatch-overview.json"], title)
        (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
        texts = {int(value): option["text"] for value, option in mapping["options"].items()}
        assert texts == {STATUS_CODES[s]: s.value.replace("_", " ").upper() for s in Status}
        assert texts[STATUS_CODES[Status.TIMEOUT]] == "TIMEOUT"
        assert texts[STATUS_CODES[Status.RATE_LIMITED]] == "RATE LIMITED"
        assert status_code((WORKLOAD,)) in panel["targets"][0]["expr"]
    tile = _panel(MODELS["tokwatch-overview.json"], "Status")
    # The tile names what it measures: kind and model joined from tokwatch_endpoint_info under the pill.
    assert tile["targets"][0]["expr"] == with_endpoint_info(status_code((WORKLOAD,)))
    assert (
        tile["targets"][0]["legendFormat"] == "{{endpoint}} @ {{site}} · {{workload}} — {{kind}} · {{model}}"
    )
    assert tile["options"]["textMode"] == "value_and_name"
    timeline = _panel(MODELS["tokwatch-overview.json"], "Status timeline")
    assert timeline["type"] == "state-timeline"


def test_status_code_expression_covers_each_status_once() -> None:
    expr = status_code()
    for status, code in STATUS_CODES.items():
        assert expr.count(f'status="{status.value}"') == 1
        assert f'status="{status.value}"}} == 1) * {code})' in expr
    assert sorted(STATUS_CODES.values()) == list(range(1, len(Status) + 1))


def test_trend_panel_shows_failed_runs_as_red_bars() -> None:
    trend = _panel(MODELS["tokwatch-overview.json"], "Decode tok/s and failed runs")
    exprs = {t["refId"]: t["expr"] for t in trend["targets"]}
    assert 'status!="ok"' in exprs["B"] and "[$__interval]" in exprs["B"] and "increase(" in exprs["B"]
    assert "tokwatch_probe_success" in exprs["A"]  # line breaks while the latest run is not ok
    (override,) = trend["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": "B"}
    props = {p["id"]: p["value"] for p in override["properties"]}
    assert props["custom.drawStyle"] == "bars"
    assert props["color"] == {"mode": "fixed", "fixedColor": "red"}
    annotations = [a for a in MODELS["tokwatch-overview.json"]["annotations"]["list"] if a.get("target")]
    assert len(annotations) == 1 and 'status!="ok"' in annotations[0]["target"]["expr"]
    assert annotations[0]["target"]["interval"] == "1m" and "expr" not in annotations[0]


def test_ttft_panels_read_exact_figures_and_histogram_panels_are_conditional(model: dict[str, Any]) -> None:
    """TTFT comes from the per-run gauge and the exact window percentiles, never from histogram buckets
    (their p50 misdrew LLM TTFTs by up to 73 %); a panel reading a histogram says it needs them on."""
    exprs = {t["expr"] for p in iter_panels(model) for t in p.get("targets", []) if t.get("expr")}
    assert not [e for e in exprs if "tokwatch_ttft_seconds_bucket" in e]
    for panel in iter_panels(model):
        histogram = any(
            re.search(r"tokwatch_\w+_(bucket|sum|count)\b", t.get("expr", ""))
            for t in panel.get("targets", [])
        )
        condition = panels.condition_of(panel.get("description", ""))
        assert (condition is panels.HISTOGRAMS) == histogram, panel["title"]
    if model["uid"] == "tokwatch-overview":
        ttft = _panel(model, "TTFT per run and p50 ($window)")
        assert [t["expr"].split("{")[0].split("(")[-1] for t in ttft["targets"]] == [
            "tokwatch_probe_ttft_seconds",
            "tokwatch_window_ttft_percentile_seconds",
        ]
        assert 'window="$window"' in ttft["targets"][1]["expr"]


def test_conditions_are_read_back_from_descriptions() -> None:
    text = panels.describe("Gaps.", panels.REF_LATENCY, panels.HISTOGRAMS)
    assert text.endswith(
        "Shows data only when the exporter's latency histograms are on "
        "(`metrics.histograms: true`; off by default)."
    )
    assert panels.condition_of(text) is panels.HISTOGRAMS
    assert panels.condition_of(panels.describe("Gaps.", panels.REF_LATENCY)) is None
    conditional = {
        p["title"]
        for m in MODELS.values()
        for p in iter_panels(m)
        if panels.condition_of(p.get("description", ""))
    }
    assert "Ollama model in VRAM" in conditional and "Status" not in conditional


def test_network_phase_panel_stacks_the_phases_per_series() -> None:
    bars = _panel(MODELS["tokwatch-overview.json"], "Network phases per endpoint")
    assert bars["type"] == "barchart" and bars["options"]["stacking"] == "normal"
    (target,) = bars["targets"]
    assert 'phase=~"resolve|connect|proxy_connect|tls|processing"' in target["expr"]
    assert target["instant"] is True and target["format"] == "table"
    grouping, organize = bars["transformations"]
    assert grouping["options"] == {
        "columnField": "phase",
        "rowField": "series",
        "valueField": "Value",
        "emptyValue": "null",
    }
    order = organize["options"]["indexByName"]
    assert sorted(order, key=order.get)[1:] == ["resolve", "connect", "proxy_connect", "tls", "processing"]
    assert bars["options"]["xField"] == "series"


def test_divide_guards_against_idle_denominators() -> None:
    assert divide("a", "b") == "(a) / ((b) > 0)"
    tpot = _panel(MODELS["tokwatch-overview.json"], "TPOT p50 / p95 / mean (histogram)")
    mean = next(t["expr"] for t in tpot["targets"] if t["legendFormat"].endswith(" mean"))
    assert "_sum" in mean and "_count" in mean and mean.endswith(") > 0)")


def test_provisioning_points_at_the_generated_json_and_fixed_uids() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "provisioning"
    prom = yaml.safe_load((root / "datasources" / "tokwatch-prometheus.yaml").read_text(encoding="utf-8"))
    pg = yaml.safe_load((root / "datasources" / "tokwatch-postgres.yaml").read_text(encoding="utf-8"))
    provider = yaml.safe_load((root / "dashboards" / "tokwatch.yaml").read_text(encoding="utf-8"))
    assert prom["apiVersion"] == 1 and pg["apiVersion"] == 1 and provider["apiVersion"] == 1
    assert prom["datasources"][0]["uid"] == panels.PROMETHEUS_UID
    assert prom["datasources"][0]["type"] == "prometheus"
    (pg_source,) = pg["datasources"]
    assert (pg_source["uid"], pg_source["type"]) == (panels.POSTGRES_UID, panels.POSTGRES_TYPE)
    assert pg_source["secureJsonData"]["password"].startswith("${")  # from the environment, never inline
    (prov,) = provider["providers"]
    assert prov["type"] == "file" and prov["options"]["path"]


def test_descriptions_point_at_existing_doc_sections(model: dict[str, Any]) -> None:
    root = Path(__file__).resolve().parents[2]
    refs = {
        m.groups()
        for panel in iter_panels(model)
        for m in re.finditer(r'Definition: (\S+), section "([^"]+)"\.', panel.get("description") or "")
    }
    assert refs, "no panel names where its number is defined"
    for doc, section in refs:
        headings = re.findall(r"^#+\s+(.+?)\s*$", (root / doc).read_text(encoding="utf-8"), re.MULTILINE)
        assert any(h == section or h.startswith(f"{section} ") for h in headings), (
            f"{doc}: no section {section!r}"
        )
