"""dashboards/lint.py: metric-name extraction from PromQL, the metrics.md catalog, model checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dashboards.lint import (
    MetricCatalog,
    angular_panels,
    layout_problems,
    metric_names_in_promql,
    metric_names_in_template_query,
    metrics_from_exposition,
    metrics_from_markdown,
    unknown_metrics,
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("tokwatch_probe_success", {"tokwatch_probe_success"}),
        ('tokwatch_probe_success{endpoint=~"$endpoint", status!="ok"}', {"tokwatch_probe_success"}),
        (
            "histogram_quantile(0.99, sum by (le, endpoint) "
            '(rate(tokwatch_ttft_seconds_bucket{job="x"}[5m])))',
            {"tokwatch_ttft_seconds_bucket"},
        ),
        (
            "sum without (instance) (increase(a_total[$__interval]))"
            " / on (endpoint) group_left (model) b_info",
            {"a_total", "b_info"},
        ),
        ("(a) / ((b) > 0)", {"a", "b"}),
        ("a > bool 0 and b unless c or d", {"a", "b", "c", "d"}),
        ("a offset 1h + b @ start()", {"a", "b"}),
        ("max_over_time(a[1h:5m]) * 1e3 + Inf - NaN", {"a"}),
        ('label_replace(a, "dst", "$1 and by", "src", "(.*)")', {"a"}),
        ('{__name__="tokwatch_build_info", version="1"}', {"tokwatch_build_info"}),
        ("endpoint:tokwatch_ttft_seconds:p99_1h > 2", {"endpoint:tokwatch_ttft_seconds:p99_1h"}),
        (
            'time() - tokwatch_probe_last_ok_timestamp_seconds{endpoint=~"${endpoint}"}',
            {"tokwatch_probe_last_ok_timestamp_seconds"},
        ),
        ("sum by(endpoint)(x)", {"x"}),
        ("vector(1) + scalar(up)", {"up"}),
        ('count_values("version", tokwatch_build_info)', {"tokwatch_build_info"}),
        ("topk(3, a) atan2 b", {"a", "b"}),
    ],
)
def test_metric_names_in_promql(expr: str, expected: set[str]) -> None:
    assert metric_names_in_promql(expr) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("label_values(tokwatch_endpoint_info, endpoint)", {"tokwatch_endpoint_info"}),
        ('label_values(tokwatch_window_runs{endpoint=~"a,b"}, window)', {"tokwatch_window_runs"}),
        ("label_values(endpoint)", set()),
        ("query_result(topk(5, tokwatch_probe_success))", {"tokwatch_probe_success"}),
        ("tokwatch_probe_success", {"tokwatch_probe_success"}),
    ],
)
def test_metric_names_in_template_query(query: str, expected: set[str]) -> None:
    assert metric_names_in_template_query(query) == expected


METRICS_MD = """# Metrics

Text mentioning `tokwatch_not_in_a_table` is ignored.

| name | type | extra labels | meaning |
|---|---|---|---|
| `tokwatch_runs_total` | counter | `status` | runs; see `tokwatch_other` |
| `tokwatch_last_seconds` | gauge | | last |

| name | buckets (seconds) | observed |
|---|---|---|
| `tokwatch_ttft_seconds` | 0.01 … 120 | per run |

| name | type | labels | meaning |
|---|---|---|---|
| `tokwatch_e2e_seconds` | histogram | | e2e |
"""


def test_metrics_from_markdown_reads_first_column_and_histograms(tmp_path: Path) -> None:
    doc = tmp_path / "metrics.md"
    doc.write_text(METRICS_MD, encoding="utf-8")
    catalog = metrics_from_markdown(doc)
    assert catalog.names == {
        "tokwatch_runs_total",
        "tokwatch_last_seconds",
        "tokwatch_ttft_seconds",
        "tokwatch_e2e_seconds",
    }
    assert catalog.histograms == {"tokwatch_ttft_seconds", "tokwatch_e2e_seconds"}
    assert catalog.defines("tokwatch_ttft_seconds_bucket")
    assert catalog.defines("tokwatch_e2e_seconds_count")
    assert not catalog.defines("tokwatch_last_seconds_bucket")  # a gauge has no buckets
    assert not catalog.defines("tokwatch_other")  # named in a meaning cell, not defined
    assert not catalog.defines("tokwatch_not_in_a_table")
    assert catalog.defines("up")  # Prometheus' own per-target series


def test_real_metrics_doc_defines_the_probe_contract() -> None:
    catalog = metrics_from_markdown(Path(__file__).resolve().parents[2] / "docs" / "metrics.md")
    assert {
        "tokwatch_probe_runs_total",
        "tokwatch_endpoint_info",
        "tokwatch_probes_in_flight",
    } <= catalog.names
    assert "tokwatch_inter_token_latency_seconds" in catalog.histograms


def _panel(
    pid: int, x: int, y: int, w: int, h: int, kind: str = "timeseries", **extra: Any
) -> dict[str, Any]:
    return {"id": pid, "title": f"p{pid}", "type": kind, "gridPos": {"x": x, "y": y, "w": w, "h": h}, **extra}


def test_layout_problems_finds_overlap_duplicate_ids_and_out_of_grid() -> None:
    model = {
        "uid": "t",
        "panels": [
            _panel(1, 0, 0, 12, 4),
            _panel(2, 12, 0, 12, 4),
            _panel(3, 6, 2, 6, 4),  # overlaps panel 1
            _panel(2, 0, 10, 4, 4),  # duplicate id
            _panel(5, 20, 20, 6, 2),  # past column 24
            {"id": 6, "title": "no grid", "type": "stat"},
        ],
    }
    problems = layout_problems(model)
    assert any("panel 3 'p3' overlaps panel 1 'p1'" in p for p in problems)
    assert any("panel id 2 is used twice" in p for p in problems)
    assert any("p5" in p and "outside the 24-column grid" in p for p in problems)
    assert any("no grid" in p and "no complete gridPos" in p for p in problems)
    assert len(problems) == 4


def test_layout_without_problems_is_clean() -> None:
    model = {"uid": "t", "panels": [_panel(1, 0, 0, 12, 4), _panel(2, 12, 0, 12, 4), _panel(3, 0, 4, 24, 1)]}
    assert layout_problems(model) == []


def test_angular_panels_are_reported_including_inside_collapsed_rows() -> None:
    model = {
        "uid": "t",
        "panels": [
            _panel(1, 0, 0, 24, 8, kind="graph"),
            _panel(2, 0, 8, 24, 1, kind="row", panels=[_panel(3, 0, 9, 24, 4, kind="singlestat")]),
            _panel(4, 0, 13, 24, 4, kind="timeseries"),
        ],
    }
    problems = angular_panels(model)
    assert len(problems) == 2
    assert "'graph'" in problems[0] and "'singlestat'" in problems[1]


def test_unknown_metrics_checks_prometheus_queries_only() -> None:
    catalog = MetricCatalog(frozenset({"tokwatch_known"}), frozenset())
    prom = {"type": "prometheus", "uid": "${datasource}"}
    pg = {"type": "grafana-postgresql-datasource", "uid": "pg"}
    model = {
        "uid": "t",
        "panels": [
            _panel(
                1, 0, 0, 24, 4, datasource=prom, targets=[{"refId": "A", "expr": "tokwatch_known + typo_x"}]
            ),
            _panel(
                2, 0, 4, 24, 4, datasource=pg, targets=[{"refId": "A", "rawSql": "SELECT 1", "expr": "x y"}]
            ),
        ],
        "annotations": {"list": [{"name": "ann", "datasource": prom, "expr": "tokwatch_unknown_a"}]},
        "templating": {
            "list": [
                {"name": "v", "type": "query", "datasource": prom, "query": "label_values(tokwatch_gone, l)"},
                {"name": "s", "type": "query", "datasource": pg, "query": "SELECT name FROM endpoints"},
                {"name": "w", "type": "custom", "query": "1h,24h"},
            ]
        },
    }
    problems = unknown_metrics(model, catalog)
    assert problems == [
        "t: panel 1 'p1' ref A queries unknown metric 'typo_x'",
        "t: annotation 'ann' queries unknown metric 'tokwatch_unknown_a'",
        "t: variable 'v' queries unknown metric 'tokwatch_gone'",
    ]


EXPOSITION = """# HELP tokwatch_probe_runs Timed probe runs by status.
# TYPE tokwatch_probe_runs counter
tokwatch_probe_runs_total{endpoint="a",status="ok"} 3.0
# HELP tokwatch_ttft_seconds Time to first token.
# TYPE tokwatch_ttft_seconds histogram
tokwatch_ttft_seconds_bucket{endpoint="a",le="0.1"} 1.0
tokwatch_ttft_seconds_bucket{endpoint="a",le="+Inf"} 2.0
tokwatch_ttft_seconds_count{endpoint="a"} 2.0
tokwatch_ttft_seconds_sum{endpoint="a"} 0.3
# HELP tokwatch_server_model_vram_ratio Ollama VRAM share.
# TYPE tokwatch_server_model_vram_ratio gauge
"""


def test_metrics_from_exposition_uses_the_series_present() -> None:
    catalog = metrics_from_exposition(EXPOSITION)
    assert catalog.defines("tokwatch_probe_runs_total")
    assert not catalog.defines("tokwatch_probe_runs")
    assert catalog.defines("tokwatch_ttft_seconds_bucket") and catalog.defines("tokwatch_ttft_seconds_sum")
    assert catalog.histograms == {"tokwatch_ttft_seconds"}
    assert not catalog.defines("tokwatch_server_model_vram_ratio")  # family declared, but no series
