"""Check that every metric a Prometheus rule file reads exists in tokwatch's /metrics output.

    python prometheus/lint_metric_names.py --metrics-url http://127.0.0.1:9477/metrics prometheus/rules/*.yml
    python prometheus/lint_metric_names.py --metrics-file metrics.txt prometheus/rules/*.yml

Metric names are the identifiers of each rule's `expr` and of the PromQL strings its annotations pass to
`query`; functions, keywords, label names, durations and the names recorded by the rule files themselves
are not metric names. Exit status 1 lists every unknown name with its file, group and rule.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

# The PromQL name extraction is shared with the dashboards' lint; the script lives outside any package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboards.lint import metric_names_in_promql, metrics_from_exposition

# Series Prometheus itself creates for every target or rule, never present in an exporter's output.
PROMETHEUS_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)
_TEMPLATE_ACTION_RE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


@dataclass(frozen=True)
class Use:
    """One metric name read by one rule."""

    file: str
    group: str
    rule: str
    metric: str


def _template_queries(annotation: str) -> list[str]:
    """PromQL strings handed to `query` inside Go templates; `%s` placeholders become empty strings."""
    out = []
    for block in _TEMPLATE_ACTION_RE.findall(annotation):
        if not re.search(r"\bquery\b", block):
            continue
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', block):
            out.append(literal.replace("%s", ""))
    return out


class RuleFileError(Exception):
    """A rule file that cannot be read or does not have the rule-file shape."""


def rule_uses(paths: Iterable[Path]) -> tuple[list[Use], set[str]]:
    """Every (rule, metric) use in the files, and the names the files record."""
    uses: list[Use] = []
    recorded: set[str] = set()
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise RuleFileError(f"{path}: cannot read rule file: {exc}") from None
        groups = doc.get("groups") if isinstance(doc, dict) else None
        if not isinstance(groups, list):
            raise RuleFileError(f"{path}: not a rule file (no `groups:` list)")
        for group in groups:
            gname = str(group.get("name", "?"))
            for rule in group.get("rules") or []:
                rname = rule.get("record") or rule.get("alert") or "?"
                if "record" in rule:
                    recorded.add(rule["record"])
                exprs = [str(rule.get("expr", ""))]
                for value in (rule.get("annotations") or {}).values():
                    exprs.extend(_template_queries(str(value)))
                for expr in exprs:
                    for name in sorted(metric_names_in_promql(expr)):
                        uses.append(Use(str(path), gname, rname, name))
    return uses, recorded


def unknown_uses(paths: Sequence[Path], exposition: str) -> list[Use]:
    """Uses of names that neither tokwatch exposes, nor the rule files record, nor Prometheus creates."""
    uses, recorded = rule_uses(paths)
    known = metrics_from_exposition(exposition).names | recorded | PROMETHEUS_SERIES
    return [u for u in uses if u.metric not in known]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: exit 0 if every name is known, 1 listing the unknown ones, 2 on unreadable input."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics-url", help="tokwatch /metrics URL")
    source.add_argument("--metrics-file", type=Path, help="a saved /metrics scrape")
    parser.add_argument("rule_files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.metrics_url:
            with urllib.request.urlopen(args.metrics_url, timeout=10) as resp:
                exposition = resp.read().decode("utf-8")
        else:
            exposition = args.metrics_file.read_text(encoding="utf-8")
        bad = unknown_uses(args.rule_files, exposition)
    except (OSError, ValueError, RuleFileError) as exc:
        print(f"lint_metric_names: {exc}", file=sys.stderr)
        return 2
    for u in bad:
        print(f"{u.file}: group {u.group}: {u.rule}: metric {u.metric} is not in tokwatch's /metrics output")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
