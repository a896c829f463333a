"""The overview's "Cost and energy" row against the cost and energy families' contract (docs/metrics.md, "Cost
and energy"): every query reads only those names and labels, honours the endpoint/site/workload variables,
and, evaluated by promtool on series shaped as the exporter publishes them, returns exactly the figures each
panel is meant to show. (The end-to-end panel test, tests/dashboards/test_e2e_queries.py, runs these queries
against a live exporter's output too; its fleet has no priced or powered endpoint, so there the row's
conditional panels may be empty.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import cost, generate, panels
from dashboards.lint import metric_names_in_promql, metrics_from_markdown

ROOT = Path(__file__).resolve().parents[2]
OVERVIEW = "tokwatch-overview.json"

# The contract: family -> its labels beyond endpoint and site.
CONTRACT: dict[str, set[str]] = {
    "tokwatch_cost_per_million_tokens": {"workload", "phase", "allocation_method"},
    "tokwatch_probe_cost_total": {"workload"},
    "tokwatch_pricing_info": {"currency", "source"},
    "tokwatch_energy_joules_per_output_token": {"workload"},
    "tokwatch_energy_idle_watts": set(),
}
VALUES = {
    "phase": {"prompt", "generation", "blended"},
    "allocation_method": {"list_price", "effective", "compute_time", "capacity"},
}
# Read beside the contract's families: the speed each price is plotted against.
SPEED = {"tokwatch_window_decode_tokens_per_second_median": {"workload", "window"}}
# Labels the queries make themselves (label_join's point name) or join in (the currency).
MADE = {"series", "currency", "le"}


def _series(name: str, values: str, **labels: str) -> tuple[str, str]:
    """A promtool input series: `name{labels}` and its values."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", values


VARIABLES = {"endpoint": ".*", "site": "a|b", "workload": "seed000", "window": "24h",
             "__interval": "2m", "__range": "30m"}  # fmt: skip
CLOUD = {"endpoint": "cloud", "site": "a", "workload": "seed000"}
TITAN = {"endpoint": "titan", "site": "b", "workload": "seed000"}
COST = "tokwatch_cost_per_million_tokens"
INPUT = [
    # cloud: hosted at list price and at the effective (cache-hit) price, in USD, at site a.
    _series(COST, "2x60", **CLOUD, phase="blended", allocation_method="list_price"),
    _series(COST, "1.5x60", **CLOUD, phase="blended", allocation_method="effective"),
    _series(COST, "1x60", **CLOUD, phase="prompt", allocation_method="list_price"),
    _series(COST, "5x60", **CLOUD, phase="generation", allocation_method="list_price"),
    _series("tokwatch_pricing_info", "1x60", endpoint="cloud", site="a", currency="USD", source="config"),
    _series("tokwatch_probe_cost_total", "0+1x60", **CLOUD),
    _series("tokwatch_window_decode_tokens_per_second_median", "80x60", **CLOUD, window="24h"),
    # titan: self-hosted, at the probe stream's speed and at capacity, in EUR, with power, at site b.
    _series(COST, "0.9x60", **TITAN, phase="blended", allocation_method="compute_time"),
    _series(COST, "0.25x60", **TITAN, phase="blended", allocation_method="capacity"),
    _series(COST, "0.5x60", **TITAN, phase="prompt", allocation_method="compute_time"),
    _series("tokwatch_pricing_info", "1x60", endpoint="titan", site="b", currency="EUR", source="table"),
    _series("tokwatch_window_decode_tokens_per_second_median", "40x60", **TITAN, window="24h"),
    _series("tokwatch_energy_joules_per_output_token", "0.5x60", **TITAN),
    _series("tokwatch_energy_idle_watts", "120x60", endpoint="titan", site="b"),
    # other workloads and sites are not selected
    _series(COST, "9x60", **{**CLOUD, "workload": "long"}, phase="blended", allocation_method="list_price"),
    _series("tokwatch_energy_joules_per_output_token", "9x60", **{**TITAN, "site": "c"}),
]

NAMED = {"cloud": "cloud @ a · seed000", "titan": "titan @ b · seed000"}
PRICES = [
    ({**CLOUD, "phase": "blended", "allocation_method": "list_price", "currency": "USD"}, 2),
    ({**CLOUD, "phase": "blended", "allocation_method": "effective", "currency": "USD"}, 1.5),
    ({**CLOUD, "phase": "prompt", "allocation_method": "list_price", "currency": "USD"}, 1),
    ({**CLOUD, "phase": "generation", "allocation_method": "list_price", "currency": "USD"}, 5),
    ({**TITAN, "phase": "blended", "allocation_method": "compute_time", "currency": "EUR"}, 0.9),
    ({**TITAN, "phase": "blended", "allocation_method": "capacity", "currency": "EUR"}, 0.25),
    ({**TITAN, "phase": "prompt", "allocation_method": "compute_time", "currency": "EUR"}, 0.5),
]
# What each panel's query returns on INPUT at 60m: (labels, value) of every sample.
EXPECTED: dict[tuple[str, str], list[tuple[dict[str, str], float]]] = {
    # the leaderboard price: list price for hosted, capacity (before compute_time) for self-hosted
    ("Speed vs price", "A"): [
        ({**CLOUD, "series": NAMED["cloud"]}, 2),
        ({**TITAN, "series": NAMED["titan"]}, 0.25),
    ],
    ("Speed vs price", "B"): [
        ({**CLOUD, "series": NAMED["cloud"]}, 80),
        ({**TITAN, "series": NAMED["titan"]}, 40),
    ],
    ("Prices now", "A"): PRICES,
    ("$/Mtok by phase and allocation method", "A"): PRICES,
    ("Probe spend per interval", "A"): [({**CLOUD, "currency": "USD"}, 2)],
    ("Probe spend (time range)", "A"): [({**CLOUD, "currency": "USD"}, 30)],
    ("Joules per output token", "A"): [(TITAN, 0.5)],
    ("Idle watts", "A"): [({"endpoint": "titan", "site": "b"}, 120)],
}


def _row_panels() -> list[dict[str, Any]]:
    model = json.loads((generate.JSON_DIR / OVERVIEW).read_text(encoding="utf-8"))
    out: list[dict[str, Any]] = []
    inside = False
    for panel in model["panels"]:
        if panel["type"] == "row":
            inside = panel["title"] == "Cost and energy"
        elif inside:
            out.append(panel)
    return out


def _queries() -> list[tuple[str, str, str]]:
    return [(p["title"], t["refId"], t["expr"]) for p in _row_panels() for t in p["targets"]]


def _expand(expr: str) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: VARIABLES[m.group(1) or m.group(2)], expr)


def test_the_row_has_every_panel_the_issue_asks_for() -> None:
    titles = [p["title"] for p in _row_panels()]
    assert titles == [
        "Speed vs price",
        "Prices now",
        "$/Mtok by phase and allocation method",
        "Probe spend per interval",
        "Probe spend (time range)",
        "Joules per output token",
        "Idle watts",
    ]
    (xy,) = [p for p in _row_panels() if p["type"] == "xychart"]
    assert xy["options"]["series"][0]["x"]["matcher"]["options"] == cost.PRICE_FIELD
    renamed = next(t for t in xy["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    assert set(renamed.values()) == {cost.PRICE_FIELD, cost.SPEED_FIELD}


def test_every_panel_is_conditional_and_defined_in_the_methodology() -> None:
    methodology = (ROOT / "docs" / "methodology.md").read_text(encoding="utf-8")
    assert "\n## Cost and energy\n" in methodology
    for panel in _row_panels():
        assert 'Definition: docs/methodology.md, section "Cost and energy"' in panel["description"]
        assert panels.condition_of(panel["description"]) in (
            panels.PRICED,
            panels.PROBE_SPEND,
            panels.POWERED,
        )


def test_queries_read_only_the_contracts_names_labels_and_values() -> None:
    documented = metrics_from_markdown(ROOT / "docs" / "metrics.md")
    families = {**CONTRACT, **SPEED}
    assert all(documented.defines(name) for name in families)
    for title, ref, expr in _queries():
        names = metric_names_in_promql(expr)
        assert names and names <= set(families), f"{title} {ref}: {names - set(families)}"
        allowed = {"endpoint", "site"} | MADE | set().union(*(families[n] for n in names))
        for name, matchers in re.findall(r"(tokwatch_\w+)\{([^}]*)\}", expr):
            used = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers))
            assert set(used) <= {"endpoint", "site"} | families[name], f"{title} {ref}: {name}{{{matchers}}}"
            # the dashboard's variables: every family by endpoint and site, by workload where it has one
            assert used["endpoint"] == "$endpoint" and used["site"] == "$site", f"{title}: {name}"
            assert ("workload" in families[name]) == (used.get("workload") == "$workload"), f"{title}: {name}"
            for label, value in used.items():
                if label in VALUES:
                    assert value in VALUES[label], f"{title}: {label}={value}"
        for clause in re.findall(r"\b(?:by|on|group_left)\s*\(([^)]*)\)", expr):
            labels = {lab.strip() for lab in clause.split(",") if lab.strip()}
            assert labels <= allowed, f"{title} {ref}: {labels - allowed}"


def test_queries_return_each_panels_figures_on_contract_shaped_series(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    queries = _queries()
    assert {(title, ref) for title, ref, _ in queries} == set(EXPECTED)
    tests = [
        {
            "expr": _expand(expr),
            "eval_time": "60m",
            "exp_samples": [
                {
                    "labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}",
                    "value": value,
                }
                for labels, value in EXPECTED[(title, ref)]
            ],
        }
        for title, ref, expr in queries
    ]
    (tmp_path / "empty.yml").write_text("groups: []\n", encoding="utf-8")
    doc = {
        "rule_files": ["empty.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": values} for series, values in INPUT],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "cost_row_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
