"""Every PromQL query of the dashboards parses, checked by Prometheus' own promtool.

Grafana variables are replaced by values of the right kind first (`$__interval` by a duration,
`$endpoint` by a regex), as Grafana does before a query reaches Prometheus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import generate
from dashboards.lint import iter_queries

VARIABLES = {
    "__interval": "2m",
    "__rate_interval": "2m",
    "__range": "24h",
    "latency_window": "24h",
    "window": "24h",
    "endpoint": "titan|cloud",
    "workload": "long|seed000",
    "site": "a|b",
    "instance": ".*",
}


def grafana_expand(expr: str) -> str:
    """Substitute `$name` / `${name}` with sample values; fails on an unknown variable."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown variable ${name} in {expr}"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def _queries() -> list[tuple[str, str]]:
    found = []
    for name in sorted(generate.DASHBOARDS):
        model = json.loads((generate.JSON_DIR / name).read_text(encoding="utf-8"))
        found += [
            (f"{name}: {where}", expr)
            for where, expr in iter_queries(model)
            if not where.startswith("variable")
        ]
    return found


def test_grafana_expand() -> None:
    assert grafana_expand('x{endpoint=~"$endpoint"}[$__interval]') == 'x{endpoint=~"titan|cloud"}[2m]'
    assert grafana_expand("y[${latency_window}]") == "y[24h]"


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    queries = _queries()
    assert len(queries) > 40
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:query:{i}", "expr": grafana_expand(expr)}
                    for i, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        # Map promtool's rule index back to the panel so the failure names it.
        bad = sorted({int(i) for i in re.findall(r"dashboard:query:(\d+)", proc.stdout + proc.stderr)})
        named = "\n".join(f"{queries[i][0]}: {queries[i][1]}" for i in bad)
        pytest.fail(f"promtool rejected dashboard queries:\n{proc.stdout}{proc.stderr}\n{named}")
    assert f"SUCCESS: {len(queries)} rules found" in proc.stdout
