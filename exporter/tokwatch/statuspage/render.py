"""Server-side HTML for the status page: no scripts, no external assets, readable on a phone."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from importlib import resources
from urllib.parse import quote, urlencode

from tokwatch.figures.series import DEFAULT_WORKLOAD, SeriesKey
from tokwatch.figures.wording import counted
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.statuspage import svg
from tokwatch.statuspage.model import (
    HISTORY_DAYS,
    LAST_RUNS,
    SPARK_RUNS,
    Comparison,
    ComparisonRow,
    EndpointPage,
    Incident,
    Overview,
    Tile,
    fleet_workloads,
)
from tokwatch.storage.base import RunPoint
from tokwatch.storage.cost_figures import SeriesCost
from tokwatch.storage.network_time import NetworkTime
from tokwatch.windows.window import CV_TIGHT, CV_TYPICAL, FleetRanking, WindowFigures, cv_band, window_label
from tokwatch.windows.window_percentiles import MIN_SAMPLES, Percentiles

REFRESH_S = 30
# Uptime bands (the colour of an uptime figure, as the CV's): green from 99 %, amber from 95 %, red below.
UPTIME_GOOD = 0.99
UPTIME_FAIR = 0.95
STATUS_LABELS = {
    "ok": "OK",
    "timeout": "TIMEOUT",
    "rate_limited": "RATE LIMITED",
    "provider_error": "PROVIDER ERROR",
    "auth_failure": "AUTH FAILURE",
    "unreachable": "UNREACHABLE",
    "degraded": "DEGRADED",
}

_CSS = (resources.files("tokwatch.statuspage") / "style.css").read_text()


def _e(text: object) -> str:
    return html.escape(str(text))


def endpoint_href(name: str, workload: str | None = None, site: str | None = None) -> str:
    """URL path of an endpoint's page (of one of its series, when a workload or site is given)."""
    query = {k: v for k, v in (("workload", workload), ("site", site)) if v is not None}
    return "/endpoints/" + quote(name, safe="") + (f"?{urlencode(query)}" if query else "")


def compare_href(workload: str, **query: str) -> str:
    """URL of a workload's comparison view (`sort`, `site`, `order` as given)."""
    return "/compare?" + urlencode({"workload": workload, **query})


def series_href(key: SeriesKey, config: Config) -> str:
    """The endpoint page of one series: the workload and site in the query unless they are the defaults."""
    ep = config.endpoint(key.endpoint)
    first = config.workloads_for(ep)[0].name if ep is not None else DEFAULT_WORKLOAD
    return endpoint_href(
        key.endpoint,
        None if key.workload == first else key.workload,
        None if key.site == config.site_name else key.site,
    )


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def ago(now: float, t: float) -> str:
    """'12 s ago', '5 min ago', '3 h ago', '2 d ago'."""
    s = max(0.0, now - t)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 90 * 60:
        return f"{s / 60:.0f} min ago"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} d ago"


def _pill(status: str | None) -> str:
    if status is None:
        return '<span class="pill st-none" data-status="none">NO RUNS</span>'
    label = STATUS_LABELS.get(status, status.upper())
    return f'<span class="pill st-{_e(status)}" data-status="{_e(status)}">{_e(label)}</span>'


def _chips(ep: EndpointSettings, workload: str | None = None, site: str | None = None) -> str:
    series = [*([f"workload {workload}"] if workload else []), *([f"site {site}"] if site else [])]
    chips = [*series, ep.kind, ep.model, *(f"{k}={v}" for k, v in sorted(ep.labels.items()))]
    return '<div class="chips">' + "".join(f'<span class="chip">{_e(c)}</span>' for c in chips) + "</div>"


def _tps(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.1f}"


def _set_aside(day: WindowFigures | None, series: str = "") -> str:
    """How many of the 24 h runs had client-timed figures set aside, and why (nothing when none had)."""
    if day is None or not day.disturbed_runs:
        return ""
    of = f"{_e(series)}: " if series else ""
    tps = f"; tok/s of {day.tps_set_aside} left out of the median" if day.tps_set_aside else ""
    why = (
        "the exporter ran late (a busy host or a CPU limit): figures it could have moved beyond their "
        "tolerance are set aside, the runs' status and uptime count"
    )
    return (
        f'<p class="set-aside muted" title="{why}" data-runs="{day.disturbed_runs}" '
        f'data-tps="{day.tps_set_aside}">{of}{day.disturbed_runs} of {counted(day.runs, "run")}\' client '
        f"timing set aside: host busy{tps}</p>"
    )


def _headline(tile: Tile, now: float) -> str:
    """The primary series' newest counted ok run in large type (seed 000's headline)."""
    ok = tile.headline
    if ok is not None and ok.tokens_per_second is not None:
        source = _e(ok.timing_source or "unknown source")
        return (
            f'<div class="headline"><span class="tps">{ok.tokens_per_second:.1f}</span> tok/s'
            f'<br><small class="muted src" title="{_utc(ok.time)}">last ok run · {source} · '
            f"{ago(now, ok.time)}</small></div>"
        )
    if tile.day is not None and tile.day.tps_set_aside:
        return '<div class="headline none">tok/s set aside: host busy</div>'
    return '<div class="headline none">no ok run yet</div>'


def uptime_band(uptime: float | None) -> str | None:
    """full (UPTIME_GOOD and above), some (UPTIME_FAIR to UPTIME_GOOD), low (below), None without runs."""
    if uptime is None:
        return None
    if uptime >= UPTIME_GOOD:
        return "full"
    return "some" if uptime >= UPTIME_FAIR else "low"


def _uptime_cell(day: WindowFigures | None, tag: str = "td") -> str:
    band = uptime_band(day.uptime if day else None) or "none"
    if day is None or day.uptime is None:
        text, runs = "—", ""
    else:
        text = f"{day.uptime * 100:.1f} %"
        runs = (
            f' title="{day.ok_runs} of {counted(day.runs, "run")} ok" data-ok="{day.ok_runs}" '
            f'data-runs="{day.runs}"'
        )
    return f'<{tag} class="num uptime ub-{band}" data-uptime-band="{band}"{runs}>{text}</{tag}>'


def _cv_cell(day: WindowFigures | None) -> str:
    band = (cv_band(day.cv) if day else None) or "none"
    if day is None or day.cv is None:
        return f'<td class="num cv band-{band}" data-band="{band}" title="from 2 ok runs">—</td>'
    sd = day.stddev or 0.0
    return (
        f'<td class="num cv band-{band}" data-band="{band}" data-stddev="{sd:.3f}" '
        f'title="stddev ±{sd:.1f} tok/s">{day.cv * 100:.1f} %</td>'
    )


def _ttft_cell(day: WindowFigures | None) -> str:
    """TTFT p50, and the p90 once it has MIN_SAMPLES[0.9] samples (in ms)."""
    pct = day.ttft_percentiles if day else None
    if pct is None or pct.p50 is None:
        return '<td class="num ttft">—</td>'
    p90 = (
        f"<small> · {pct.p90 * 1000:,.0f}</small>"
        if pct.p90 is not None
        else f'<small class="muted" title="p90 from {MIN_SAMPLES[0.9]} runs"> (n={pct.samples})</small>'
    )
    p90_attr = "" if pct.p90 is None else f"{pct.p90:.4f}"
    return (
        f'<td class="num ttft" data-p50="{pct.p50:.4f}" data-p90="{p90_attr}">{pct.p50 * 1000:,.0f}{p90}</td>'
    )


def not_prefill(workload: str) -> bool:
    """seed000's prefill figure is no prefill measurement: a dozen prompt tokens over a TTFT of request
    overhead (docs/methodology.md, "Prefill speed")."""
    return workload == DEFAULT_WORKLOAD


NOT_PREFILL_WHY = (
    "Not a prefill measurement: seed000's prompt is a few dozen tokens, so its TTFT is mostly request "
    "overhead (network, queueing, the first decode step) and prompt tokens / TTFT reads far below the "
    "engine's prefill speed. Read prefill on a sized workload (short, medium, long). docs/methodology.md, "
    "Prefill speed."
)


def _prefill_cell(day: WindowFigures | None, workload: str) -> str:
    if not_prefill(workload):
        return f'<td class="num prefill not-prefill" title="{_e(NOT_PREFILL_WHY)}">n/a</td>'
    if day is None or day.prefill_median is None:
        return '<td class="num prefill">—</td>'
    counts = ((day.cache_assisted_runs, "cache-assisted"), (day.prompt_size_missed_runs, "off size"))
    apart = [f"{n} {what}" for n, what in counts if n]
    note = f'<small class="muted"> ({", ".join(apart)})</small>' if apart else ""
    return f'<td class="num prefill">{day.prefill_median:,.0f}{note}</td>'


def _decode_cell(day: WindowFigures | None) -> str:
    """The 24 h p50 of tok/s with the p90 beside it and as a whisker (from MIN_SAMPLES[0.9] runs)."""
    if day is None or day.decode_percentiles.p50 is None:
        return '<td class="num decode">—</td>'
    pct = day.decode_percentiles
    p50 = pct.p50 or 0.0
    if pct.p90 is None:
        p90 = f'<small class="muted" title="p90 from {MIN_SAMPLES[0.9]} runs"> (n={pct.samples})</small>'
    else:
        p90 = f"<small> · {pct.p90:.1f}</small>"
    return (
        f'<td class="num decode"><div class="pct" data-p50="{p50:.3f}" '
        f'data-p90="{"" if pct.p90 is None else f"{pct.p90:.3f}"}" data-n="{pct.samples}">{p50:.1f}{p90}'
        f"{svg.whisker(p50, pct.p90)}</div></td>"
    )


ROW_HEAD = (
    '<tr><th>Series</th><th class="num">Decode tok/s<br>p50 · p90</th>'
    '<th class="num">TTFT ms<br>p50 · p90</th>'
    '<th class="num">Prefill<br>tok/s</th><th class="num">Uptime</th><th class="num">CV</th></tr>'
)


def _series_row(tile: Tile, config: Config, named: bool) -> str:
    """One series of an endpoint's tile: its status and the 24 h figures."""
    name = series_name(tile.key) if named else "24 h"
    return (
        f'<tr class="series" data-endpoint="{_e(tile.endpoint.name)}" '
        f'data-status="{_e(tile.status or "none")}" data-workload="{_e(tile.workload)}" '
        f'data-site="{_e(tile.site)}">'
        f'<td class="what"><a href="{series_href(tile.key, config)}">{_e(name)}</a><br>'
        f"{_pill(tile.status)}</td>"
        f"{_decode_cell(tile.day)}{_ttft_cell(tile.day)}"
        f"{_prefill_cell(tile.day, tile.workload)}{_uptime_cell(tile.day)}{_cv_cell(tile.day)}</tr>"
    )


def series_name(key: SeriesKey) -> str:
    """'short @ eu-west' ('short' without a site)."""
    return key.workload + (f" @ {key.site}" if key.site else "")


def _tile(tiles: Sequence[Tile], now: float, config: Config, many: tuple[bool, bool]) -> str:
    """An endpoint's tile: the primary series' headline, a row per series (workload x site; `many`:
    several workloads, several sites on the page, each then named), the primary series' sparkline."""
    primary = tiles[0]
    ep, last = primary.endpoint, primary.last
    seen = (
        f'last run {ago(now, last.time)} <span title="{_utc(last.time)}">({_utc(last.time)})</span>'
        if last
        else "not probed yet"
    )
    named = any(many)
    rows = "".join(_series_row(t, config, named) for t in tiles)
    notes = "".join(_set_aside(t.day, series_name(t.key) if named else "") for t in tiles)
    spark_of = f'<small class="muted">sparkline: {_e(series_name(primary.key))}</small>' if named else ""
    return (
        f'<article class="tile" data-endpoint="{_e(ep.name)}" data-status="{_e(primary.status or "none")}" '
        f'data-series="{len(tiles)}">'
        f'<header><a class="name" href="{series_href(primary.key, config)}">{_e(ep.name)}</a>'
        f"{_pill(primary.status)}</header>"
        f"{_chips(ep)}{_headline(primary, now)}"
        f'<div class="scroll"><table class="rows"><thead>{ROW_HEAD}</thead><tbody>{rows}</tbody>'
        f"</table></div>{notes}{svg.sparkline(primary.spark)}{spark_of}"
        f'<small class="muted">{seen}</small></article>'
    )


def _strip(ov: Overview, config: Config) -> str:
    """The primary ranking (with the unranked endpoints), then every other workload's and site's."""
    primary = (ov.ranking.workload, ov.ranking.site)
    others = [r for r in ov.rankings if r.ranked and (r.workload, r.site) != primary]
    if not ov.ranking.ranked and not ov.unranked and not others:
        return ""
    unranked = (
        f'<p class="muted">Not ranked (no ok run in 7 days): {_e(", ".join(ov.unranked))}</p>'
        if ov.unranked
        else ""
    )
    named = bool(others)
    sections = [_ranking(ov.ranking, config, named, unranked, "comparison")]
    sections += [_ranking(r, config, True, "", f"comparison-{r.workload}-{r.site}") for r in others]
    return "".join(sections)


def _ranking(ranking: FleetRanking, config: Config, named: bool, after: str, anchor: str) -> str:
    """One comparison strip: the ranking and the neighbours' ratios (the workload named when `named`)."""
    ranks = "".join(
        f'<li data-endpoint="{_e(name)}">'
        f'<a href="{series_href(SeriesKey(name, ranking.workload, ranking.site), config)}">{_e(name)}</a> '
        f"{median:.1f} tok/s</li>"
        for name, median in ranking.ranked
    )
    pairs = "".join(
        f'<li class="pair">{_e(c.fastest)} is {c.percent_faster:.0f} % faster than {_e(c.slowest)}</li>'
        for c in ranking.neighbours()
    )
    what = f" · workload {_e(ranking.workload)}" if named else ""
    where = f" · site {_e(ranking.site)}" if ranking.site else ""
    return (
        f'<section class="strip" id="{_e(anchor)}" data-workload="{_e(ranking.workload)}" '
        f'data-site="{_e(ranking.site)}"><h2>Comparison · 7-day median of ok runs{what}{where}</h2>'
        f'<ol class="ranking">{ranks}</ol><ul class="pairs">{pairs}</ul>{after}</section>'
    )


def methodology(config: Config) -> str:
    """Seed 000-style footnote: what is sent, when, and where each figure comes from."""
    p, s = config.probe, config.schedule
    warm = "one warm-up run (discarded), then one timed run" if p.warmup else "one timed run (no warm-up)"
    delivery = "streamed" if p.stream else "not streamed"
    sources = " → ".join(str(x) for x in p.timing_preference)
    includes = ", ".join(s.window_includes) or "neither"
    unique = ""
    if p.timed_prompt == "unique":
        unique = ", the timed run's prompt led by a fresh three-word sentence so it is no prefix-cache hit"
    interval, offset = config.round_schedule()
    shifted = config.site and "offset" not in s.model_fields_set
    site = f", site {_e(config.site)}'s own share of the interval" if shifted else ""
    return (
        '<footer class="method"><h2>Methodology</h2>'
        f"<p>Every {_e(window_label(interval))} (offset {_e(window_label(offset))}{site}) each enabled "
        f"endpoint gets {warm} of the prompt <q>{_e(p.prompt)}</q> with max_tokens {p.max_tokens}, "
        f"temperature {p.temperature:g}, {delivery}{unique}"
        ". Endpoints may override prompt and max_tokens in the config.</p>"
        f"{_workloads(config)}"
        f"<p>tok/s comes from the first trusted timing source in this order: {_e(sources)}. The headline is "
        "the most recent <code>ok</code> run among the runs the figures below count, so an incident shows "
        "in the status pill, never as a blank. "
        "A tile per endpoint, a row per workload and site it is measured for; figures over the last 24 "
        "hours. Decode p50: median tok/s of ok runs, the p90 drawn as a whisker and shown from "
        f"{MIN_SAMPLES[0.9]} runs (percentiles by linear interpolation). TTFT p50 (and p90 from "
        f"{MIN_SAMPLES[0.9]} runs): time to the first token of the same runs, cache-assisted runs left out. "
        "Prefill p50: not shown for seed000, whose few dozen prompt tokens over a TTFT of request overhead "
        "are no prefill measurement (hover n/a). CV: sample standard deviation / mean of "
        f"the same runs (band: green below {CV_TIGHT * 100:.0f} %, amber {CV_TIGHT * 100:.0f} to "
        f"{CV_TYPICAL * 100:.0f} %, red above), the stddev in tok/s beside it. Uptime: ok runs / runs "
        f"(band: green from {UPTIME_GOOD * 100:.0f} %, amber {UPTIME_FAIR * 100:.0f} to "
        f"{UPTIME_GOOD * 100:.0f} %, red below). "
        f"The sparkline shows the last {SPARK_RUNS} runs: the line breaks at a non-ok run, drawn as a red "
        "dashed tick. The comparison ranks endpoints by their 7-day median; Compare by workload shows them "
        "side by side (sites as columns, grouped by model). A figure the exporter's own "
        "lateness could have moved beyond its tolerance (tok/s "
        f"{p.tolerance.tokens_per_second:.1%}; latencies the larger of {p.tolerance.latency:.0%} and "
        f"{p.tolerance.latency_floor * 1e3:g} ms) is set aside; the run's status and uptime always count. "
        "On-demand (<code>/probe</code>) runs and set-aside tok/s figures count in the headline and these "
        f"figures: {_e(includes)} (schedule.window_includes); the status pill is the newest run of any "
        "kind.</p>"
        "<p>Statuses: OK, TIMEOUT, RATE LIMITED (HTTP 429), PROVIDER ERROR (5xx, malformed or implausible "
        "answers), AUTH FAILURE (401/403), UNREACHABLE (no response), DEGRADED (answered, but short or "
        "without usable timing). Full definitions: docs/methodology.md.</p></footer>"
    )


def _workloads(config: Config) -> str:
    """What the sized workloads send, when the config has any."""
    sized = {w.name: w for ep in config.endpoints for w in config.workloads_for(ep) if w.sized}
    sized.update({w.name: w for w in config.probe.workloads if w.sized})
    if not sized:
        return ""
    listed = ", ".join(f"{_e(w.name)} {w.input_tokens}/{w.output_tokens}" for w in sized.values())
    return (
        f"<p>Workloads (input/output tokens): {listed}. Their timed runs send a fresh natural-language "
        "prompt drawn from the run id, sized to the input tokens as the server counts them. Prefill tok/s is "
        "the engine's own figure where the server reports one, else the prompt tokens it computed over "
        "TTFT; a run the prefix cache served beyond the chat template's preamble (cache-assisted) is "
        "counted apart from the prefill median.</p>"
    )


def _page(title: str, body: str, now: float, refresh: bool = True) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"{meta}<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{body}"
        f'<p class="muted"><small>Generated {_utc(now)} · <a href="/metrics">/metrics</a></small></p>'
        "</main></body></html>"
    )


def fleet_counts(tiles: Sequence[Tile]) -> str:
    """ "5 endpoints · 4 workloads · 2 sites": the distinct endpoints, workloads and sites on the page."""
    endpoints = len({t.endpoint.name for t in tiles})
    workloads = len({t.workload for t in tiles})
    sites = len({t.site for t in tiles})
    return " · ".join(
        (counted(endpoints, "endpoint"), counted(workloads, "workload"), counted(sites, "site"))
    )


def _by_endpoint(tiles: Sequence[Tile]) -> list[list[Tile]]:
    """The tiles grouped by endpoint, in the order the endpoints first appear (config order)."""
    groups: dict[str, list[Tile]] = {}
    for t in tiles:
        groups.setdefault(t.endpoint.name, []).append(t)
    return list(groups.values())


def _compare_nav(workloads: Sequence[str], current: str | None = None) -> str:
    if not workloads:
        return ""
    links = "".join(
        f'<li aria-current="page"><b>{_e(w)}</b></li>'
        if w == current
        else f'<li><a href="{compare_href(w)}">{_e(w)}</a></li>'
        for w in workloads
    )
    return f'<nav class="compare"><span class="muted">Compare by workload:</span><ul>{links}</ul></nav>'


def render_overview(ov: Overview, config: Config, notice: str | None = None) -> str:
    """A tile per endpoint (its series as rows), the comparison strips and the methodology footnote."""
    head = (
        "<header><h1>tokwatch · decode speed</h1>"
        f'<p class="muted" id="counts">{fleet_counts(ov.tiles)} · refreshes every {REFRESH_S} s</p>'
        f"{_compare_nav(fleet_workloads(config))}</header>"
    )
    warn = f'<p class="notice">{_e(notice)}</p>' if notice else ""
    many = (len({t.workload for t in ov.tiles}) > 1, len({t.site for t in ov.tiles}) > 1)
    tiles = "".join(_tile(group, ov.generated_at, config, many) for group in _by_endpoint(ov.tiles))
    empty = "" if ov.tiles else '<p class="muted">No endpoints configured.</p>'
    body = f'{head}{warn}<section class="wall" id="tiles">{tiles}</section>{empty}{_strip(ov, config)}'
    return _page("tokwatch", body + methodology(config), ov.generated_at)


def _incidents(incidents: Sequence[Incident], now: float) -> str:
    if not incidents:
        return f'<p class="muted">No incidents in {HISTORY_DAYS} days.</p>'
    rows = "".join(
        f'<tr><td class="t">{_utc(i.start)}</td>'
        f"<td class='t'>{_utc(i.end) if i.end is not None else '<b>ongoing</b>'}</td>"
        f'<td class="num">{_duration((i.end if i.end is not None else now) - i.start)}</td>'
        f'<td class="num">{i.runs}</td><td>{" ".join(_pill(s) for s in i.statuses)}</td>'
        f'<td class="err">{_e(i.error or "")}</td></tr>'
        for i in incidents
    )
    return (
        '<div class="scroll"><table id="incidents"><thead><tr><th>Start</th><th>End (next ok run)</th>'
        '<th class="num">Duration</th><th class="num">Runs</th><th>Status</th><th>First error</th></tr>'
        f"</thead><tbody>{rows}</tbody></table></div>"
    )


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


_RUN_FLAGS = (
    ("cache_assisted", "cache-assisted", "the prefix cache served more than the chat template's preamble"),
    ("prompt_size_missed", "off size", "the server counted the prompt off the workload's size"),
)


def _run_row(r: RunPoint) -> str:
    figures = r.set_aside.replace(",", ", ") if r.set_aside else "client timing"
    title = "a client stall bounds the error of these figures above their tolerance"
    disturbed = f" <small title='{title}'>set aside: {_e(figures)}</small>" if r.timing_disturbed else ""
    flags = disturbed + "".join(
        f" <small class='flag' title='{why}'>{label}</small>"
        for attr, label, why in _RUN_FLAGS
        if getattr(r, attr)
    )
    error = ": ".join(x for x in (r.error_class, r.error_message) if x)
    prompt = "—" if r.prompt_tokens is None else str(r.prompt_tokens)
    if r.cached_tokens:
        cached = f"({r.cached_tokens} cached)"
        prompt += f" <small class='muted' title='served from the prefix cache'>{cached}</small>"
    prefill = "—" if r.prefill_tokens_per_second is None else f"{r.prefill_tokens_per_second:,.0f}"
    prefill_cell = (
        f'<td class="num not-prefill" title="{_e(NOT_PREFILL_WHY)}">n/a</td>'
        if not_prefill(r.workload) and r.prefill_tokens_per_second is not None
        else f'<td class="num">{prefill}</td>'
    )
    return (
        f'<tr><td class="t">{_utc(r.time)}</td><td>{_e(r.triggered_by)}</td><td>{_pill(r.status)}{flags}</td>'
        f'<td class="num">{_tps(r.tokens_per_second)}</td><td>{_e(r.timing_source or "—")}</td>'
        f'<td class="num">{_ms(r.ttft_s)}</td><td class="num">{prompt}</td>{prefill_cell}'
        f'<td class="num">{_ms(r.itl_p50_s)}</td>'
        f'<td class="num">{_ms(r.itl_p99_s)}</td><td class="err">{_e(error)}</td></tr>'
    )


def _series_links(page: EndpointPage, config: Config) -> str:
    """Links to the endpoint's other series (its workloads, from every site), the shown one marked."""
    if len(page.series) < 2:
        return ""
    items = []
    for key in page.series:
        text = key.workload + (f" @ {key.site}" if key.site else "")
        if (key.workload, key.site) == (page.workload, page.site):
            items.append(f'<li aria-current="page"><b>{_e(text)}</b></li>')
        else:
            items.append(f'<li><a href="{series_href(key, config)}">{_e(text)}</a></li>')
    return f'<nav class="series"><ul>{"".join(items)}</ul></nav>'


_PCT_FIGURES = (
    ("decode tok/s", "decode_percentiles", ".1f", 1.0),
    ("prefill tok/s", "prefill_percentiles", ",.0f", 1.0),
    ("TTFT ms", "ttft_percentiles", ".0f", 1000.0),
)


_NOT_PREFILL_SPAN = f'<td colspan="4" class="num not-prefill" title="{_e(NOT_PREFILL_WHY)}">n/a</td>'


def _pct_cells(p: Percentiles, fmt: str, scale: float) -> str:
    values = "".join(
        f'<td class="num">{"—" if v is None else format(v * scale, fmt)}</td>' for v in (p.p50, p.p90, p.p99)
    )
    return f'{values}<td class="num muted">{p.samples}</td>'


def _percentile_tables(page: EndpointPage) -> str:
    """One table per workload (and site) of the endpoint: each window's uptime and p50/p90/p99 with counts."""
    if not page.windows:
        return ""
    shown = ", ".join(f"p{round(q * 100)} from {n}" for q, n in MIN_SAMPLES.items())
    heads = "".join(f'<th colspan="4">{_e(name)}</th>' for name, _, _, _ in _PCT_FIGURES)
    sub = '<th class="num">p50</th><th class="num">p90</th><th class="num">p99</th><th class="num">n</th>'
    tables = []
    for key, figures in page.windows.items():
        rows = "".join(
            f'<tr data-window="{_e(f.window)}"><td class="win">{_e(f.window)}</td>'
            f'<td class="num">{"—" if f.uptime is None else f"{f.uptime * 100:.1f} %"}</td>'
            f'<td class="num muted">{f.runs}</td>'
            + "".join(
                _NOT_PREFILL_SPAN
                if attr == "prefill_percentiles" and not_prefill(key.workload)
                else _pct_cells(getattr(f, attr), fmt, k)
                for _, attr, fmt, k in _PCT_FIGURES
            )
            + "</tr>"
            for f in figures
        )
        title = f"workload {key.workload}" + (f" · site {key.site}" if key.site else "")
        tables.append(
            f"<h3>{_e(title)}</h3>"
            f'<div class="scroll"><table class="pct" data-workload="{_e(key.workload)}" '
            f'data-site="{_e(key.site)}"><thead><tr><th rowspan="2">Window</th><th rowspan="2" class="num">'
            f'Uptime</th><th rowspan="2" class="num">Runs</th>{heads}</tr><tr>{sub * len(_PCT_FIGURES)}</tr>'
            f"</thead><tbody>{rows}</tbody></table></div>"
        )
    note = (
        f'<p class="muted"><small>Percentiles by linear interpolation over the runs each window counts, '
        f"shown from a number of samples ({shown}); n: samples. TTFT and prefill leave out cache-assisted "
        "runs.</small></p>"
    )
    return f'<h2>Percentiles by workload</h2><section id="percentiles">{"".join(tables)}{note}</section>'


def render_endpoint(page: EndpointPage, config: Config) -> str:
    """An endpoint's daily medians and uptime, incidents and last runs."""
    ep = page.endpoint
    status = page.runs[0].status if page.runs else None
    formerly = (
        f'<p class="muted">Formerly: {_e(", ".join(ep.renamed_from))} (one history)</p>'
        if ep.renamed_from
        else ""
    )
    runs = "".join(_run_row(r) for r in page.runs)
    several = len({k.workload for k in page.series}) > 1 or len({k.site for k in page.series}) > 1
    chips = _chips(ep, page.workload if several else None, page.site if several and page.site else None)
    body = (
        '<p><a href="/">← all endpoints</a></p>'
        f'<header><h1 data-endpoint="{_e(ep.name)}" data-workload="{_e(page.workload)}" '
        f'data-site="{_e(page.site)}">{_e(ep.name)} {_pill(status)}</h1>{chips}{formerly}'
        f"{_series_links(page, config)}</header>{_percentile_tables(page)}"
        f"<h2>Network vs server time · {_e(series_name(SeriesKey(ep.name, page.workload, page.site)))}</h2>"
        f"{_network(page.network)}{_cost_section(page.cost)}"
        f"<h2>Daily median tok/s · {HISTORY_DAYS} days (UTC)</h2>{svg.daily_medians(page.days)}"
        f"<h2>Daily uptime</h2>{svg.daily_uptime(page.days)}"
        f"<h2>Incidents</h2>{_incidents(page.incidents, page.generated_at)}"
        f"<h2>Last {LAST_RUNS} runs</h2>"
        '<div class="scroll"><table id="runs"><thead><tr><th>Time (UTC)</th><th>Trigger</th><th>Status</th>'
        '<th class="num">tok/s</th><th>Source</th><th class="num">TTFT ms</th>'
        '<th class="num">Prompt tokens</th><th class="num">Prefill tok/s</th><th class="num">ITL p50 ms</th>'
        f'<th class="num">ITL p99 ms</th><th>Error</th></tr></thead><tbody>{runs}</tbody></table></div>'
    )
    if not page.runs:
        body += '<p class="muted">No runs stored yet.</p>'
    return _page(f"tokwatch · {ep.name}", body + methodology(config), page.generated_at)


def _cost_section(cost: SeriesCost) -> str:
    """The shown series' prices and energy over its last 24 h (docs/methodology.md, Cost and energy); nothing
    for an endpoint without prices or a power source."""
    money, energy = cost
    if money is None and energy is None:
        return ""
    rows: list[tuple[str, str, str]] = []  # (key, label, value)
    if money is not None:
        unit = f"{money.currency}/Mtok"
        how = "list price" if money.allocation_method == "list_price" else "compute time, newest run"

        def price(v: float | None) -> str:
            return "—" if v is None else f"{v:,.3f} {unit}"

        share, run_cost = money.cache_hit_share, money.last_run_cost
        rows += [
            ("prompt", f"Prompt ({how})", price(money.prompt_per_mtok)),
            ("generation", f"Generation ({how})", price(money.generation_per_mtok)),
            ("blended", "Blended", price(money.blended_per_mtok)),
            ("effective", "Effective at the cache-hit share", price(money.effective_per_mtok)),
            ("share", "Cache-hit share", "—" if share is None else f"{share:.1%}"),
            ("run-cost", "Newest priced run cost", "—" if run_cost is None else f"{run_cost:.6f} {unit[:3]}"),
            ("source", "Prices from", money.source),
        ]
    if energy is not None:
        jpt, idle, joules = energy.joules_per_output_token, energy.idle_watts, energy.joules_last_run
        rows += [
            ("jpt", "J / output token (median, above idle)", "—" if jpt is None else f"{jpt:.3f}"),
            ("idle", "Idle baseline", "—" if idle is None else f"{idle:,.0f} W"),
            ("joules", "Newest run's energy", "—" if joules is None else f"{joules:,.0f} J"),
        ]
    cells = "".join(
        f'<tr data-cost="{_e(k)}"><th>{_e(label)}</th><td class="num">{_e(v)}</td></tr>'
        for k, label, v in rows
    )
    return f'<h2>Cost and energy · last 24 h</h2><div class="scroll"><table id="cost">{cells}</table></div>'


# The comparison's sortable columns: (key, heading, what it reads, larger is better).
SORTS = (
    ("decode", "Decode p50 tok/s", "decode", True),
    ("ttft", "TTFT p50 ms", "ttft", False),
    ("prefill", "Prefill p50 tok/s", "prefill", True),
    ("uptime", "Uptime", "uptime", True),
    ("samples", "Samples", "samples", True),
)


def _sort_value(f: WindowFigures | None, key: str) -> float | None:
    if f is None:
        return None
    return {
        "decode": f.decode_percentiles.p50,
        "ttft": f.ttft_percentiles.p50,
        "prefill": f.prefill_percentiles.p50,
        "uptime": f.uptime,
        "samples": float(f.decode_percentiles.samples),
    }[key]


def sort_rows(
    rows: Sequence[ComparisonRow], key: str, site: str, descending: bool
) -> list[tuple[str, list[ComparisonRow]]]:
    """Rows grouped by model (models by name), each group sorted by `key` at `site`; rows without the
    figure last, ties by endpoint name."""
    groups: dict[str, list[ComparisonRow]] = {}
    for row in rows:
        groups.setdefault(row.endpoint.model, []).append(row)

    def order(row: ComparisonRow) -> tuple[bool, float, str]:
        v = _sort_value(row.by_site.get(site), key)
        return (v is None, 0.0 if v is None else (-v if descending else v), row.endpoint.name)

    return [(model, sorted(groups[model], key=order)) for model in sorted(groups, key=str.lower)]


def _cmp_cell(f: WindowFigures | None, key: str, workload: str) -> str:
    v = _sort_value(f, key)
    if key == "prefill" and not_prefill(workload):
        return f'<td class="num not-prefill" title="{_e(NOT_PREFILL_WHY)}">n/a</td>'
    if v is None:
        return '<td class="num">—</td>'
    if key == "uptime":
        return _uptime_cell(f)
    text = {"decode": f"{v:.1f}", "ttft": f"{v * 1000:,.0f}", "prefill": f"{v:,.0f}", "samples": f"{v:.0f}"}
    return f'<td class="num" data-{key}="{v:.4f}">{text[key]}</td>'


# The comparison table's cost columns, shown when some endpoint of the workload has prices or a power source.
COST_COLUMNS = ("Blended /Mtok", "Effective /Mtok", "J/out tok")


def _row_cost(cmp: Comparison, endpoint: str, site: str) -> SeriesCost:
    """An endpoint's cost at `site`, else at any site (prices do not depend on where they were probed)."""
    found = cmp.costs.get(SeriesKey(endpoint, cmp.workload, site))
    if found is None:
        found = next((c for k, c in cmp.costs.items() if k.endpoint == endpoint), None)
    return found or (None, None)


def _cost_cells(cost: SeriesCost) -> str:
    money, energy = cost
    cells = []
    for key, v in (
        ("blended", money.blended_per_mtok if money else None),
        ("effective", money.effective_per_mtok if money else None),
    ):
        if v is None or money is None:
            cells.append(f'<td class="num cost" data-{key}="">—</td>')
        else:
            how = "list price" if money.allocation_method == "list_price" else "compute time"
            cells.append(
                f'<td class="num cost" data-{key}="{v:.6g}" title="{_e(how)}, source {_e(money.source)}">'
                f"{v:,.3f} {_e(money.currency)}</td>"
            )
    jpt = energy.joules_per_output_token if energy else None
    none = '<td class="num cost">—</td>'
    cells.append(none if jpt is None else f'<td class="num cost" data-jpt="{jpt:.6g}">{jpt:.3f}</td>')
    return "".join(cells)


def render_comparison(
    cmp: Comparison, config: Config, sort: str = "decode", site: str | None = None, order: str | None = None
) -> str:
    """A workload's comparison: the sortable table (sites as columns, grouped by model) and the charts."""
    chosen: str = site if site is not None and site in cmp.sites else (cmp.sites[0] if cmp.sites else "")
    best_high = {k: high for k, _, _, high in SORTS}
    sort = sort if sort in best_high else "decode"
    descending = best_high[sort] if order not in ("asc", "desc") else order == "desc"
    site_name = {s: s or "this exporter" for s in cmp.sites}

    def head_link(key: str, title: str, at: str) -> str:
        now_sorted = key == sort and at == chosen
        flip = "asc" if descending else "desc"
        query = {"sort": key, "site": at, **({"order": flip} if now_sorted else {})}
        arrow = (" ▼" if descending else " ▲") if now_sorted else ""
        current = ' aria-sort="descending"' if now_sorted and descending else ""
        current = ' aria-sort="ascending"' if now_sorted and not descending else current
        return (
            f'<th class="num"{current}><a href="{_e(compare_href(cmp.workload, **query))}">{_e(title)}'
            f"{arrow}</a></th>"
        )

    priced = bool(cmp.costs)
    price_head = "".join(f'<th rowspan="2" class="num cost">{_e(t)}</th>' for t in COST_COLUMNS) * priced
    top = "".join(f'<th colspan="{len(SORTS)}" class="site">{_e(site_name[s])}</th>' for s in cmp.sites)
    top += price_head
    sub = "".join(head_link(k, title, s) for s in cmp.sites for k, title, _, _ in SORTS)
    body = []
    span = 1 + len(SORTS) * len(cmp.sites) + len(COST_COLUMNS) * priced
    for model, rows in sort_rows(cmp.rows, sort, chosen, descending):
        body.append(f'<tr class="model"><th colspan="{span}">{_e(model)}</th></tr>')
        for row in rows:
            key = SeriesKey(row.endpoint.name, cmp.workload, chosen)
            cells = "".join(
                _cmp_cell(row.by_site.get(s), k, cmp.workload) for s in cmp.sites for k, _, _, _ in SORTS
            )
            if priced:
                cells += _cost_cells(_row_cost(cmp, row.endpoint.name, chosen))
            body.append(
                f'<tr data-endpoint="{_e(row.endpoint.name)}" data-model="{_e(model)}">'
                f'<td><a href="{series_href(key, config)}">{_e(row.endpoint.name)}</a></td>{cells}</tr>'
            )
    table = (
        f'<div class="scroll"><table id="compare" data-sort="{_e(sort)}" data-site="{_e(chosen)}" '
        f'data-order="{"desc" if descending else "asc"}"><thead><tr><th rowspan="2">Endpoint</th>{top}</tr>'
        f"<tr>{sub}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )
    if not cmp.rows:
        table = f'<p class="muted">No endpoint runs workload {_e(cmp.workload)}.</p>'
    # Charts: every workload by prompt size, and this workload's decode against TTFT.
    ordered = sorted(cmp.workloads, key=lambda w: (cmp.input_tokens.get(w) or 0, w))
    names = [r.endpoint.name for r in cmp.rows]
    lines = []
    for name in names:
        for s in cmp.sites:
            vs = [
                f.ttft_percentiles.p50 if (f := cmp.every_workload.get(SeriesKey(name, w, s))) else None
                for w in ordered
            ]
            if any(v is not None for v in vs):
                lines.append((name + (f" @ {s}" if s else ""), vs))
    labels = [w + (f" ({cmp.input_tokens[w]:,})" if cmp.input_tokens.get(w) else "") for w in ordered]
    points = [
        (r.endpoint.name + (f" @ {s}" if s else ""), f.ttft_percentiles.p50, f.decode_percentiles.p50)
        for r in cmp.rows
        for s in cmp.sites
        if (f := r.by_site.get(s)) is not None
        and f.ttft_percentiles.p50 is not None
        and f.decode_percentiles.p50 is not None
    ]
    nav = _compare_nav(cmp.workloads, cmp.workload)
    price_chart = ""
    if priced:
        price_points = [
            (r.endpoint.name + (f" @ {s}" if s else ""), price, f.decode_percentiles.p50, cost.currency)
            for r in cmp.rows
            for s in cmp.sites
            if (f := r.by_site.get(s)) is not None
            and f.decode_percentiles.p50 is not None
            and (cost := _row_cost(cmp, r.endpoint.name, s)[0]) is not None
            and (price := cost.blended_per_mtok) is not None
        ]
        price_chart = (
            f"<h2>Decode tok/s against blended price · {_e(cmp.workload)}</h2>"
            f'<p class="muted">Blended: {_e(config.pricing.blend)} input:output tokens at list price '
            "(hosted) or the newest run's compute-time price (self-hosted); docs/methodology.md, Cost and "
            "energy.</p>"
            f"{svg.decode_vs_price(price_points)}"
        )
    body_html = (
        '<p><a href="/">← all endpoints</a></p>'
        f'<header><h1 data-workload="{_e(cmp.workload)}">Comparison · workload {_e(cmp.workload)}</h1>'
        f'<p class="muted">{cmp.window} window: p50 of the runs each series counts, uptime, samples (decode '
        "tok/s samples); sites as columns, endpoints grouped by model. Sort by a column's heading.</p>"
        f"{nav}</header>{table}"
        f"<h2>TTFT p50 by prompt size (workloads, input tokens)</h2>{svg.ttft_by_prompt(labels, lines)}"
        f"<h2>Decode tok/s against TTFT · {_e(cmp.workload)}</h2>{svg.decode_vs_ttft(points)}"
        f"{price_chart}"
    )
    return _page(f"tokwatch · compare {cmp.workload}", body_html + methodology(config), cmp.generated_at)


def _network(net: NetworkTime | None) -> str:
    """Where the shown series' time went over 24 h: the connection's set-up (new connections only), then
    TTFT as one network round trip and the server's time."""
    if net is None:
        return '<p class="muted">No ok run with a TTFT in 24 h.</p>'
    bar = (
        ("DNS resolve", net.resolve_s, "set-up of a new connection, before TTFT starts"),
        ("TCP connect", net.connect_s, "set-up of a new connection, before TTFT starts"),
        ("TLS handshake", net.tls_s, "set-up of a new connection; 0 over plain HTTP"),
        ("Network round trip", net.network_rtt_s, "the connect's SYN → SYN-ACK: TTFT's network share"),
        ("Server time", net.server_s, "TTFT less one round trip: queueing, prefill, the first decode step"),
    )
    more = (
        ("TTFT of the same runs", net.measured_ttft_s, "about round trip + server time"),
        ("TTFT, every run", net.ttft_s, "request sent → first token (the TTFT p50)"),
        ("Processing", net.processing_s, "request sent → response headers"),
    )
    shown = [(i, name, v) for i, (name, v, _) in enumerate(bar) if v is not None]
    swatch = {name: svg.PALETTE[n % len(svg.PALETTE)] for n, (_, name, _) in enumerate(shown)}
    cells = "".join(
        f'<tr data-phase="{_e(name)}"><td>'
        + (f'<span class="sw" style="background:{swatch[name]}"></span>' if name in swatch else "")
        + f'{_e(name)}</td><td class="num">{_ms(v)}</td><td class="muted">{_e(why)}</td></tr>'
        for name, v, why in (*bar, *more)
    )
    share = "" if net.network_share is None else f" Network share of TTFT: {net.network_share * 100:.0f} %."
    return (
        f'<section id="network" data-runs="{net.runs}" data-measured="{net.measured}">'
        f"{svg.network_split([(name, v) for _, name, v in shown])}"
        '<div class="scroll"><table><thead><tr><th>Phase (median, 24 h)</th><th class="num">ms</th>'
        f"<th>What</th></tr></thead><tbody>{cells}</tbody></table></div>"
        f'<p class="muted"><small>Medians over {counted(net.runs, "ok run")} with a TTFT (not '
        f"cache-assisted); the set-up, round trip and server time over the {net.measured} whose round "
        f"opened its connection (a connection kept from an earlier round measures none).{share} "
        'docs/methodology.md, "Network phases".</small></p></section>'
    )


def render_message(title: str, message: str, now: float, config: Config | None = None) -> str:
    """A plain page for a missing endpoint or storage that is switched off."""
    body = f'<p><a href="/">← all endpoints</a></p><h1>{_e(title)}</h1><p class="notice">{_e(message)}</p>'
    return _page(f"tokwatch · {title}", body + (methodology(config) if config else ""), now, refresh=False)
