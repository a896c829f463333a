"""Write tokwatch's Grafana dashboards to dashboards/json/, or with --check verify the committed JSON.

Usage: python dashboards/generate.py [--check] [--out DIR] [--metrics-doc MD | --metrics-file SCRAPE]
--check regenerates in memory and fails (exit 1) if a committed file differs, is missing or is stale, or if
a panel queries a metric docs/metrics.md (or a saved /metrics scrape) does not define, uses an Angular panel
type or overlaps another.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python dashboards/generate.py`: make `dashboards` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards import benchmarks, health, history, lint, overview, server
from dashboards.grafana_model import current_model

ROOT = Path(__file__).resolve().parent.parent
JSON_DIR = ROOT / "dashboards" / "json"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# File name -> builder. File names are what the Grafana provider loads; keep them stable.
DASHBOARDS: dict[str, Callable[[], g.Dashboard]] = {
    "tokwatch-overview.json": overview.build,
    "tokwatch-server.json": server.build,
    "tokwatch-health.json": health.build,
    "tokwatch-history.json": history.build,
    "tokwatch-benchmarks.json": benchmarks.build,
}


def render(dashboard: g.Dashboard) -> str:
    """Deterministic JSON text of a dashboard in Grafana's current model (no nulls, no legacy keys; sorted
    keys, 2-space indent, trailing newline)."""
    plain = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    return json.dumps(current_model(plain), sort_keys=True, indent=2) + "\n"


def generate() -> dict[str, str]:
    """File name -> JSON text for every dashboard."""
    return {name: render(build()) for name, build in DASHBOARDS.items()}


def lint_problems(rendered: dict[str, str], catalog: lint.MetricCatalog) -> list[str]:
    """Metric, panel-type and layout problems of the generated dashboards."""
    problems: list[str] = []
    for text in rendered.values():
        model: dict[str, Any] = json.loads(text)
        problems += lint.unknown_metrics(model, catalog)
        problems += lint.angular_panels(model)
        problems += lint.layout_problems(model)
    return problems


def drift(rendered: dict[str, str], out: Path) -> list[str]:
    """Differences between freshly generated JSON and the files in `out`."""
    problems = []
    for name, text in rendered.items():
        path = out / name
        if not path.exists():
            problems.append(f"{path}: missing; run `python dashboards/generate.py`")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: differs from the generator output; run `python dashboards/generate.py`")
    for path in sorted(out.glob("*.json")):
        if path.name not in rendered:
            problems.append(f"{path}: not produced by the generator (stale file)")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument("--out", type=Path, default=JSON_DIR, help="JSON directory (default: %(default)s)")
    contract = parser.add_mutually_exclusive_group()
    contract.add_argument("--metrics-doc", type=Path, default=METRICS_DOC, help="metric-name contract")
    contract.add_argument(
        "--metrics-file", type=Path, help="a saved /metrics scrape of tokwatch to check names against instead"
    )
    args = parser.parse_args(argv)

    source = args.metrics_file or args.metrics_doc
    if not source.is_file():
        print(f"error: metrics contract {source} not found", file=sys.stderr)
        return 2
    if args.metrics_file:
        catalog = lint.metrics_from_exposition(source.read_text(encoding="utf-8"))
    else:
        catalog = lint.metrics_from_markdown(source)
    rendered = generate()
    problems = lint_problems(rendered, catalog)
    if args.check:
        problems += drift(rendered, args.out)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {len(rendered)} dashboards to {args.out}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    if args.check:
        print(f"ok: {len(rendered)} dashboards match {args.out} and query only documented metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
