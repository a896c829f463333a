"""report.md: a human-readable summary of one run, built only from the JSON figures."""

from __future__ import annotations

from typing import Any

from tokwatch.bench.costing import cost_and_energy_lines
from tokwatch.bench.health import Check

_TIME_METRICS = ("ttft", "ttot", "tbt", "inter_chunk", "output_itl", "tpot", "e2e", "normalized_latency")
_COUNT_METRICS = ("prompt_tokens", "think_tokens", "output_tokens", "fluidity_index")
_SEND_METRICS = ("scheduling_lag", "queue_time", "connect")
_COLS = ("p50", "p90", "p95", "p99", "mean", "std", "min", "max")
# trace_summary.json figure -> (report label, scale, digits)
_TRACE_LABELS = {
    "latency_s": ("latency (s)", 1.0, 3),
    "first_turn_ttft_s": ("first-turn TTFT (s)", 1.0, 3),
    "ttfat_s": ("TTFAT (s)", 1.0, 3),
    "decode_tokens_per_s": ("decode tok/s", 1.0, 1),
    "cache_hit_rate": ("cache hit rate (%)", 100.0, 1),
    "eligible_cache_hit_rate": ("eligible cache hit rate (%)", 100.0, 1),
}


def _fmt(value: Any, scale: float = 1.0, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}"
    return str(value)


def _table(summary: dict[str, Any], names: tuple[str, ...], scale: float, digits: int) -> list[str]:
    lines = ["| metric | n | " + " | ".join(_COLS) + " |", "|---|---:|" + "---:|" * len(_COLS)]
    for name in names:
        s = summary["metrics"].get(name)
        if not s or not s["count"]:
            continue
        cells = " | ".join(_fmt(s[c], scale, digits) for c in _COLS)
        lines.append(f"| {name} | {s['count']} | {cells} |")
    return lines


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _prompt_cache(cache: dict[str, Any], opts: dict[str, Any]) -> list[str]:
    """What the server's prefix cache served (summary `prompt_cache`)."""
    salt = opts.get("prompt_salt")
    prompts = f"fresh for this run (salt {salt})" if salt else "repeated (--repeat-prompts)"
    out = ["", "## Prompt cache", "", f"- prompts: {prompts}"]
    if not cache["requests_reporting_cached_tokens"]:
        return [*out, "- the server reported no cached prompt tokens"]
    return [
        *out,
        f"- cached: {cache['cached_tokens']} of {cache['prompt_tokens']} prompt tokens "
        f"({_pct(cache['cached_share'])}), over {cache['requests_reporting_cached_tokens']} requests",
        f"- beyond conversation history ({cache['history_tokens']} tokens) and chat template "
        f"({cache['template_tokens']} tokens): {cache['cached_outside_history_tokens']} "
        f"({_pct(cache['cached_outside_history_share'])})",
    ]


def _conversations(multi: dict[str, Any], traces: dict[str, Any] | None) -> list[str]:
    """Seed 003's multi-turn figures: per request, then per conversation (trace)."""
    out = [
        "",
        "## Conversations",
        "",
        f"- turns per request (mean): {_fmt(multi['turns_per_request_mean'])}",
        f"- KV-cache hit estimate (history / prompt tokens): {_pct(multi['history_hit_estimate'])}",
        f"- cache hit rate (server cached_tokens / prompt tokens): {_pct(multi['cache_hit_rate'])}; "
        f"eligible (cached / history tokens, turns > 1): {_pct(multi['eligible_cache_hit_rate'])}"
        + ("" if multi["requests_reporting_cached_tokens"] else " — the server reported no cached_tokens"),
        "",
        "| TTFT (ms) | n | p50 | p99 | mean |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (("first turn", "ttft_first_turn"), ("later turns", "ttft_later_turns")):
        s = multi[key]
        out.append(f"| {label} | {s['count']} | {_fmt(s['p50'], 1e3)} | {_fmt(s['p99'], 1e3)} | "
                   f"{_fmt(s['mean'], 1e3)} |")  # fmt: skip
    if traces is None:
        return out
    c = traces["conversations"]
    out += [
        "",
        f"Per conversation ({c['completed']} completed of {c['started']} started; trace_summary.json):",
        "",
        "| figure | n | mean | p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in traces["figures"].items():
        label, scale, digits = _TRACE_LABELS.get(name, (name, 1.0, 3))
        cells = " | ".join(_fmt(s[k], scale, digits) for k in ("mean", "p50", "p90", "p99", "max"))
        out.append(f"| {label} | {s['count']} | {cells} |")
    return out


def _reasoning(r: dict[str, Any]) -> list[str]:
    """Seed 001's reasoning figures: how think phases ended, and time per phase."""
    ends, share = r["think_end"], r["think_end_share"]
    field = r["budget_field"]
    asked = f"asked in `{field}`" if field else "not requestable with this kind (only max_tokens bounds it)"
    out = [
        "",
        "## Reasoning",
        "",
        f"- requests: {r['requests']} ({r['ok_requests']} ok); think budget {asked}",
        f"- budget force rate: **{_pct(r['budget_force_rate'])}** — natural stop {ends['natural']} "
        f"({_pct(share['natural'])}), budget hit {ends['budget']} ({_pct(share['budget'])}), "
        f"length {ends['length']} ({_pct(share['length'])})",
        "",
        "| figure | n | p50 | p95 | p99 | mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = (
        ("think budget (tokens)", "think_budget", 1.0, 0),
        ("think tokens", "think_tokens", 1.0, 0),
        ("answer tokens", "output_tokens", 1.0, 0),
        ("TTFT (ms)", "ttft_s", 1e3, 1),
        ("think phase (ms)", "think_s", 1e3, 1),
        ("TTOT (ms)", "ttot_s", 1e3, 1),
        ("answer phase (ms)", "answer_s", 1e3, 1),
        ("think tok/s", "think_tokens_per_s", 1.0, 1),
        ("answer tok/s", "answer_tokens_per_s", 1.0, 1),
    )
    for label, key, scale, digits in rows:
        s = r[key]
        if s["count"]:
            cells = " | ".join(_fmt(s[k], scale, digits) for k in ("p50", "p95", "p99", "mean"))
            out.append(f"| {label} | {s['count']} | {cells} |")
    return out


def render(
    summary: dict[str, Any],
    throughput: dict[str, Any],
    slo_results: dict[str, Any],
    checks: list[Check],
    traces: dict[str, Any] | None = None,
) -> str:
    """The Markdown report; `traces` is trace_summary.json of a multi-turn run."""
    opts = summary["options"]
    req = summary["requests"]
    out = [
        f"# tokwatch bench: {opts.get('model', '?')} @ {opts.get('target', '?')}",
        "",
        f"- status: **{'complete' if summary['complete'] else 'INCOMPLETE'}** ({summary['stop_reason']})"
        + (f" — {summary['message']}" if summary.get("message") else ""),
        f"- load: {opts.get('load', '?')}; wall time {summary['wall_time_s']:.1f} s",
        f"- requests: {req['total']} measured, {req['ok']} ok, {req['errored']} errored, "
        f"{req['warmup_excluded']} warm-up excluded",
    ]
    if summary.get("requested_rate_per_s"):
        out.append(
            f"- rate: requested {summary['requested_rate_per_s']:.3f}/s, achieved "
            f"{_fmt(summary.get('achieved_send_rate_per_s'), digits=3)}/s"
        )
    out += ["", "## Latency (ms)", "", *_table(summary, _TIME_METRICS, 1e3, 2)]
    out += ["", "## Client side (ms, not part of latency)", "", *_table(summary, _SEND_METRICS, 1e3, 3)]
    out += ["", "## Tokens and fluidity", "", *_table(summary, _COUNT_METRICS, 1.0, 2)]
    out += ["", "## Throughput", "", "| window | s | ok requests/s | tokens/s |", "|---|---:|---:|---:|"]
    for key in ("overall", "steady_state", "last_30s"):
        w = throughput[key]
        span = w["window_end_s"] - w["window_start_s"]
        out.append(
            f"| {key} | {span:.1f} | {_fmt(w['requests_per_s'])} | {_fmt(w['tokens_per_s'], digits=1)} |"
        )
    if summary.get("prompt_cache"):
        out += _prompt_cache(summary["prompt_cache"], opts)
    if summary.get("multi_turn"):
        out += _conversations(summary["multi_turn"], traces)
    if summary.get("reasoning"):
        out += _reasoning(summary["reasoning"])
    errors = {k: v for k, v in req["by_status"].items() if v and k != "ok"}
    out += ["", "## Errors", "", ", ".join(f"{k}: {v}" for k, v in errors.items()) or "none"]
    out += ["", "## SLOs", ""]
    if slo_results["results"]:
        out += ["| objective | observed | threshold | met |", "|---|---:|---:|---|"]
        for r in slo_results["results"]:
            out.append(
                f"| {r['name']} | {_fmt(r['observed_value'], digits=4)} | {r['op']} {r['threshold']:g} | "
                f"{'yes' if r['met'] else '**no**'} |"
            )
        g = summary["goodput"]
        out += [
            "",
            f"All met: **{'yes' if slo_results['all_slos_met'] else 'no'}**; goodput "
            f"{g['good_requests']}/{g['measured_requests']} requests ({_fmt(g['goodput_ratio'], 100, 1)} %)",
        ]
    else:
        out.append("none given")
    if summary.get("cost") or summary.get("energy"):
        out += ["", "## Cost and energy", "", *(f"- {line}" for line in cost_and_energy_lines(summary))]
    server = summary.get("server") or {}
    if server:
        out += ["", "## Server /metrics over the run", ""]
        out += [f"- {k}: {_fmt(v, digits=3)}" for k, v in server.items()]
    out += ["", "## Health checks", "", "```", *(c.line() for c in checks), "```", ""]
    return "\n".join(out)
