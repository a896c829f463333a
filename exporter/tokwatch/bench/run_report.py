"""`tokwatch bench report RUN`: a stored run recomputed from its stored requests, every segment of a split
run (`--segment K/N`) merged into one result (tokwatch.bench.merge), with the segments that are missing
and how the segments' clocks agreed. Read-only: the store is neither migrated nor written.

Exit codes are the bench's, for the merged run: 0 complete and every SLO met, 1 an SLO missed, 2 bad input,
3 incomplete (a segment missing or stopped early), 4 no request succeeded.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from tokwatch.bench.compare import CompareError
from tokwatch.bench.compare_store import StoredRun, read_stored_run
from tokwatch.bench.costing import cost_and_energy_lines
from tokwatch.bench.merge import SPLIT_KEY, is_split, merged_outcome, merged_summary
from tokwatch.bench.outcome import ExitCode

FIGURES = ("ttft", "tbt", "tpot", "e2e", "normalized_latency", "scheduling_lag", "queue_time")


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _segments(split: dict[str, Any]) -> list[str]:
    n = split["segments"]
    lines = [f"segments: {len(split['stored'])}/{n} stored, common start {_when(split['start_at'])}"]
    if split["missing"]:
        lines.append(f"MISSING: segment(s) {', '.join(map(str, split['missing']))} stored nothing")
    spread = split.get("clock_offset_spread_s")
    if spread is not None:
        error = split.get("clock_offset_error_s") or 0.0
        lines.append(
            f"clocks: the segments' clocks were {spread * 1e3:.3f} ms apart against the database's "
            f"(each read within +- {error * 1e3:.3f} ms); the arrivals below are each segment's sends moved "
            "onto the database's clock"
        )
    else:
        lines.append("clocks: not measured against a common clock (the store has none, e.g. SQLite)")
    rows = [
        [
            f"{s['segment']}/{s['segments']}",
            s["instance"] or "-",
            "yes" if s["complete"] else f"no ({s['stop_reason']})",
            "-" if s["arrivals_planned"] is None else str(s["arrivals_planned"]),
            f"{s['requests_ok']}/{s['requests_measured']}",
            _ms(s["start_lag_s"]),
            "-"
            if s["clock_offset_s"] is None
            else f"{s['clock_offset_s'] * 1e3:+.3f} +- {(s['clock_error_s'] or 0) * 1e3:.3f}",
            "-" if s["cpu_s"] is None else f"{s['cpu_s']:.2f}",
        ]
        for s in split["per_segment"]
    ]
    head = ["segment", "instance", "complete", "planned", "ok/measured", "start lag ms", "clock offset ms"]
    return lines + _table([*head, "CPU s"], rows)


def _arrivals(doc: dict[str, Any] | None) -> str:
    if not doc:
        return "arrivals: closed loop (no schedule to check)"
    lag1 = doc.get("lag1_autocorrelation")
    lag = "-" if lag1 is None else f"{lag1:+.3f}"
    if doc.get("ks_d") is not None:
        shape = f"gaps vs exponential: KS D {doc['ks_d']:.4f} (p {doc['ks_p']:.3f})"
    elif doc.get("gap_error_p99_s") is not None:
        shape = f"|gap - 1/R| p99 {doc['gap_error_p99_s'] * 1e3:.3f} ms"
    else:
        shape = f"gap CV {doc['gap_cv']:.3f}" if doc.get("gap_cv") is not None else "too few to check"
    achieved = doc.get("achieved_rate")
    rate = "-" if achieved is None else f"{achieved:.1f}/s"
    clock = "on the database's clock" if doc.get("clock") == "database" else "on each machine's own clock"
    return (
        f"arrivals ({doc['kind']}, merged send stamps {clock}): {rate} of {doc['rate']:g}/s; {shape}; "
        f"lag-1 {lag}"
    )


def render_text(summary: dict[str, Any]) -> str:
    """The merged result as text: segments, counts, arrivals, percentiles, throughput, SLOs."""
    req = summary["requests"]
    options = summary.get("options") or {}
    state = "complete" if summary["complete"] else f"INCOMPLETE ({summary['stop_reason']})"
    lines = [
        f"bench run {summary['run_id']}: {options.get('load', '')}, model {options.get('model', '')}; {state}"
    ]
    if summary.get("message"):
        lines.append(f"  {summary['message']}")
    split = summary.get(SPLIT_KEY)
    if split:
        lines += _segments(split)
        planned = f" of {split['arrivals_planned']} planned" if split.get("arrivals_planned") else ""
        if planned and split.get("arrivals_planned_missing"):
            planned += f" ({split['arrivals_planned_missing']} of them in the missing segments)"
        elif planned and split["missing"]:
            planned += " (the missing segments' share unknown)"
    else:
        planned = ""
    lines.append(
        f"requests: {req['total']} measured{planned}, {req['ok']} ok, {req['errored']} errored "
        f"(counts summed over the segments)"
    )
    lines.append(_arrivals(summary.get("arrivals")))
    metrics = summary["metrics"]
    rows = []
    for name in FIGURES:
        m = metrics.get(name)
        if m and m["count"]:
            rows.append([name, str(m["count"]), *(_ms(m[q]) for q in ("p50", "p90", "p99", "max"))])
    lines += ["percentiles of the merged requests (ms), never averaged over segments:"]
    lines += _table(["figure", "count", "p50", "p90", "p99", "max"], rows)
    overall = summary["throughput"]["overall"]
    lines.append(
        f"throughput: {overall.get('requests_per_s') or 0:.2f} req/s, "
        f"{overall.get('generated_tokens_per_s') or 0:.1f} generated tok/s "
        f"over {summary['wall_time_s']:.1f} s"
    )
    for r in (summary.get("slo_results") or {}).get("results", []):
        obs = "-" if r["observed_value"] is None else f"{r['observed_value']:.4g}"
        lines.append(f"SLO {r['name']}: {obs} {'met' if r['met'] else 'MISSED'}")
    lines += cost_and_energy_lines(summary)
    lines.append(f"not merged (not stored per request): {', '.join(summary['not_merged'])}")
    return "\n".join(lines) + "\n"


def stored_cost_and_energy(summary_text: str) -> dict[str, Any]:
    """The `cost` and `energy` sections of a stored run's summary.json (none when it has neither)."""
    try:
        stored = json.loads(summary_text)
    except (TypeError, json.JSONDecodeError):
        return {}
    return {k: stored[k] for k in ("cost", "energy") if isinstance(stored, dict) and stored.get(k)}


def report(parts: StoredRun, as_json: bool) -> tuple[int, str]:
    """(exit code, text) of a stored run's merged result."""
    run, segments, requests = parts
    outcome = merged_outcome(run, segments, requests)
    summary = merged_summary(run, segments, requests, outcome)
    if not is_split(run, segments):  # a split run's segments each measured their own, never summed here
        summary.update(stored_cost_and_energy(run.summary))
    text = json.dumps(summary, indent=2, default=str) + "\n" if as_json else render_text(summary)
    return int(outcome.exit_code()), text


def cmd_report(args: argparse.Namespace) -> int:
    """`tokwatch bench report RUN --config tokwatch.yml [--format table|json]`."""
    if len(args.runs) != 1 or args.config is None:
        print(
            "tokwatch bench report: needs one stored run id (or a unique prefix) and --config tokwatch.yml "
            "(the store the run went to)",
            file=sys.stderr,
        )
        return int(ExitCode.USAGE)
    try:
        code, text = report(read_stored_run(args.config, args.runs[0]), args.format == "json")
    except CompareError as exc:
        print(f"tokwatch bench report: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    sys.stdout.write(text)
    return code
