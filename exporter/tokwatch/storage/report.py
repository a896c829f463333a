"""`tokwatch report`: per-endpoint figures from the store, as a table, JSON or Markdown."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from tokwatch.storage.base import Store
from tokwatch.storage.window import WINDOW_S, window_figures
from tokwatch.window import FleetComparison, compare_fleet, window_label
from tokwatch.window_rule import WindowRule


@dataclass(frozen=True, slots=True)
class EndpointReport:
    """One report line."""

    endpoint: str
    last_run_at: float | None
    last_status: str | None
    last_ok_at: float | None
    last_tokens_per_second: float | None
    median_24h: float | None
    stddev_24h: float | None
    cv_24h: float | None
    cv_band: str | None
    uptime_24h: float | None
    runs_24h: int
    median_since: float | None
    uptime_since: float | None
    runs_since: int
    # Of runs_24h: runs with a client-timed figure set aside (the exporter ran late: a busy host), and ok
    # runs whose tok/s was among them (left out of the median, CV and stddev).
    set_aside_24h: int = 0
    tps_set_aside_24h: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    """Everything `tokwatch report` prints."""

    generated_at: float
    since: str
    backend: str
    location: str
    endpoints: list[EndpointReport]
    comparison: FleetComparison | None


async def build_report(store: Store, now: float, since_s: float, *, rule: WindowRule) -> Report:
    """Last run, 24 h figures and the `--since` window (median, uptime, fleet comparison) per endpoint; the
    figures over the runs `rule` counts, as on /metrics and the status page."""
    label = window_label(since_s)
    day = await window_figures(store, now, rule=rule, window_s=WINDOW_S)
    period = await window_figures(store, now, rule=rule, window_s=since_s)
    last = await store.last_runs(now - since_s)
    names = sorted(set(day) | set(period) | set(last))
    rows = []
    for name in names:
        d, p, lr = day.get(name), period.get(name), last.get(name)
        rows.append(
            EndpointReport(
                endpoint=name,
                last_run_at=lr.time if lr else None,
                last_status=lr.status if lr else None,
                last_ok_at=lr.ok_time if lr else None,
                last_tokens_per_second=lr.ok_tokens_per_second if lr else None,
                median_24h=d.median if d else None,
                stddev_24h=d.stddev if d else None,
                cv_24h=d.cv if d else None,
                cv_band=d.band if d else None,
                uptime_24h=d.uptime if d else None,
                runs_24h=d.runs if d else 0,
                median_since=p.median if p else None,
                uptime_since=p.uptime if p else None,
                runs_since=p.runs if p else 0,
                set_aside_24h=d.disturbed_runs if d else 0,
                tps_set_aside_24h=d.tps_set_aside if d else 0,
            )
        )
    comparison = compare_fleet({n: f.median for n, f in period.items()}, label)
    return Report(now, label, store.backend, store.location, rows, comparison)


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _age(now: float, t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, now - t)
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    if s < 172800:
        return f"{s / 3600:.0f}h ago"
    return f"{s / 86400:.0f}d ago"


def _cells(report: Report) -> tuple[list[str], list[list[str]]]:
    head = [
        "endpoint",
        "last tok/s",
        "last run",
        "status",
        "24h median",
        "CV",
        "stddev",
        "uptime 24h",
        "runs 24h",
        "set aside 24h",
        f"{report.since} median",
        f"uptime {report.since}",
    ]
    body = []
    for r in report.endpoints:
        cv = "-" if r.cv_24h is None else f"{r.cv_24h * 100:.1f}% {r.cv_band}"
        body.append(
            [
                r.endpoint,
                _num(r.last_tokens_per_second),
                _age(report.generated_at, r.last_run_at),
                r.last_status or "-",
                _num(r.median_24h),
                cv,
                _num(r.stddev_24h, ".2f"),
                _pct(r.uptime_24h),
                str(r.runs_24h),
                _set_aside(r),
                _num(r.median_since),
                _pct(r.uptime_since),
            ]
        )
    return head, body


def _set_aside(r: EndpointReport) -> str:
    """'2 (tok/s 1)': runs with client timing set aside, and how many of them lost their tok/s sample."""
    if not r.set_aside_24h:
        return "-" if not r.runs_24h else "0"
    return f"{r.set_aside_24h}" + (f" (tok/s {r.tps_set_aside_24h})" if r.tps_set_aside_24h else "")


def _footer(report: Report) -> str:
    when = datetime.fromtimestamp(report.generated_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    line = (
        report.comparison.text() if report.comparison else "comparison: fewer than two endpoints with ok runs"
    )
    where = f"{report.backend} {report.location}, {when}"
    busy = ""
    if any(r.set_aside_24h for r in report.endpoints):
        busy = (
            "\nset aside: runs whose client timing the exporter's own lateness (a busy host) could have "
            "moved beyond the tolerance; their status and uptime count, a tok/s set aside is not a sample."
        )
    return f"{line}\nCV bands: <5% tight, 5-15% typical, >15% jittery. {where}{busy}"


def render_table(report: Report) -> str:
    """Aligned plain-text table plus the comparison line."""
    head, body = _cells(report)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not body:
        lines.append("(no runs stored in this window)")
    return "\n".join(lines) + "\n\n" + _footer(report) + "\n"


def render_markdown(report: Report) -> str:
    """A GitHub-flavoured Markdown table plus the comparison line."""
    head, body = _cells(report)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n\n" + _footer(report).replace("\n", "  \n") + "\n"


def render_json(report: Report) -> str:
    """Machine-readable report; times are unix seconds, ratios 0..1."""
    data = asdict(report)
    if report.comparison is not None:
        data["comparison"] = {
            **asdict(report.comparison),
            "ratio": report.comparison.ratio,
            "percent_faster": report.comparison.percent_faster,
            "text": report.comparison.text(),
        }
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


RENDERERS = {"table": render_table, "markdown": render_markdown, "json": render_json}
