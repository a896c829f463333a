"""Server-side HTML for the status page: no scripts, no external assets, readable on a phone."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from importlib import resources
from urllib.parse import quote, urlencode

from tokwatch.figures.series import DEFAULT_WORKLOAD, SeriesKey
from tokwatch.settings.config import Config, EndpointSettings
from tokwatch.statuspage import svg
from tokwatch.statuspage.model import (
    HISTORY_DAYS,
    LAST_RUNS,
    SPARK_RUNS,
    EndpointPage,
    Incident,
    Overview,
    Tile,
)
from tokwatch.storage.base import RunPoint
from tokwatch.windows.window import CV_TIGHT, CV_TYPICAL, FleetRanking, WindowFigures, cv_band, window_label
from tokwatch.windows.window_percentiles import MIN_SAMPLES, Percentiles

REFRESH_S = 30
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


def _figures(day: WindowFigures | None) -> str:
    band = cv_band(day.cv) if day else None
    if day is None or day.cv is None:
        cv = '<dd>—<small class="muted"> (2+ ok runs)</small></dd>'
    else:
        cv = f"<dd>{day.cv * 100:.1f} %<small> ±{day.stddev or 0.0:.1f} tok/s</small></dd>"
    if day is None or day.uptime is None:
        uptime = "<dd>—</dd>"
    else:
        uptime = f'<dd>{day.uptime * 100:.1f} %<small class="muted"> {day.ok_runs}/{day.runs}</small></dd>'
    median = "—" if day is None or day.median is None else f"{day.median:.1f}<small> tok/s</small>"
    return (
        '<dl class="figs">'
        f'<div class="median"><dt>24 h median</dt><dd>{median}</dd></div>'
        f'<div class="cv band-{band or "none"}" data-band="{band or "none"}"><dt>CV (stddev)</dt>{cv}</div>'
        f'<div class="uptime"><dt>24 h uptime</dt>{uptime}</div>{_prefill(day)}{_spread(day)}'
        "</dl>"
    )


def _set_aside(day: WindowFigures | None) -> str:
    """How many of the 24 h runs had client-timed figures set aside, and why (nothing when none had)."""
    if day is None or not day.disturbed_runs:
        return ""
    tps = f"; tok/s of {day.tps_set_aside} left out of the median" if day.tps_set_aside else ""
    why = (
        "the exporter ran late (a busy host or a CPU limit): figures it could have moved beyond their "
        "tolerance are set aside, the runs' status and uptime count"
    )
    return (
        f'<p class="set-aside muted" title="{why}" data-runs="{day.disturbed_runs}" '
        f'data-tps="{day.tps_set_aside}">{day.disturbed_runs} of {day.runs} runs\' client timing set '
        f"aside: host busy{tps}</p>"
    )


def _spread(day: WindowFigures | None) -> str:
    """The 24 h p50 of tok/s with the p90 as a whisker, and the runs they are taken over."""
    if day is None or day.decode_percentiles.p50 is None:
        return ""
    pct = day.decode_percentiles
    p50 = pct.p50 or 0.0
    if pct.p90 is None:
        p90 = f'<small class="muted"> · p90 from {MIN_SAMPLES[0.9]} runs (n={pct.samples})</small>'
    else:
        p90 = f"<small> · p90 {pct.p90:.1f} (n={pct.samples})</small>"
    return (
        f'<div class="pct" data-p50="{p50:.3f}" data-p90="{"" if pct.p90 is None else f"{pct.p90:.3f}"}">'
        f"<dt>24 h p50 · p90 tok/s</dt><dd>{p50:.1f}{p90}{svg.whisker(p50, pct.p90)}</dd></div>"
    )


def _prefill(day: WindowFigures | None) -> str:
    """The 24 h prefill median, with the runs counted apart from it (only where there is one)."""
    if day is None or day.prefill_median is None:
        return ""
    counts = ((day.cache_assisted_runs, "cache-assisted"), (day.prompt_size_missed_runs, "off size"))
    apart = [f"{n} {what}" for n, what in counts if n]
    note = f'<small class="muted"> ({", ".join(apart)})</small>' if apart else ""
    return (
        f'<div class="prefill"><dt>24 h prefill</dt><dd>{day.prefill_median:,.0f}<small> tok/s</small>'
        f"{note}</dd></div>"
    )


def _tile(tile: Tile, now: float, config: Config, many: tuple[bool, bool]) -> str:
    """One series' tile; `many`: (several workloads, several sites) on the page, each then named."""
    ep, last, ok = tile.endpoint, tile.last, tile.headline
    if ok is not None and ok.tokens_per_second is not None:
        source = _e(ok.timing_source or "unknown source")
        headline = (
            f'<div class="headline"><span class="tps">{ok.tokens_per_second:.1f}</span> tok/s'
            f'<br><small class="muted src" title="{_utc(ok.time)}">last ok run · {source} · '
            f"{ago(now, ok.time)}</small></div>"
        )
    elif tile.day is not None and tile.day.tps_set_aside:
        headline = '<div class="headline none">tok/s set aside: host busy</div>'
    else:
        headline = '<div class="headline none">no ok run yet</div>'
    seen = (
        f'last run {ago(now, last.time)} <span title="{_utc(last.time)}">({_utc(last.time)})</span>'
        if last
        else "not probed yet"
    )
    workloads, sites = many
    chips = _chips(ep, tile.workload if workloads else None, (tile.site or "(none)") if sites else None)
    return (
        f'<article class="tile" data-endpoint="{_e(ep.name)}" data-status="{_e(tile.status or "none")}" '
        f'data-workload="{_e(tile.workload)}" data-site="{_e(tile.site)}">'
        f'<header><a class="name" href="{series_href(tile.key, config)}">{_e(ep.name)}</a>'
        f"{_pill(tile.status)}</header>"
        f"{chips}{headline}{_figures(tile.day)}{_set_aside(tile.day)}{svg.sparkline(tile.spark)}"
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
    return (
        '<footer class="method"><h2>Methodology</h2>'
        f"<p>Every {_e(window_label(s.interval))} (offset {_e(window_label(s.offset))}) each enabled "
        f"endpoint gets {warm} of the prompt <q>{_e(p.prompt)}</q> with max_tokens {p.max_tokens}, "
        f"temperature {p.temperature:g}, {delivery}{unique}"
        ". Endpoints may override prompt and max_tokens in the config.</p>"
        f"{_workloads(config)}"
        f"<p>tok/s comes from the first trusted timing source in this order: {_e(sources)}. The headline is "
        "the most recent <code>ok</code> run among the runs the figures below count, so an incident shows "
        "in the status pill, never as a blank. "
        "24 h median: median tok/s of ok runs in the last 24 hours. CV: sample standard deviation / mean of "
        f"the same runs (band: green below {CV_TIGHT * 100:.0f} %, amber {CV_TIGHT * 100:.0f} to "
        f"{CV_TYPICAL * 100:.0f} %, red above), the stddev in tok/s beside it. Uptime: ok runs / runs. "
        "p50 · p90: percentiles of the same tok/s by linear interpolation, the p90 drawn as a whisker and "
        f"shown from {MIN_SAMPLES[0.9]} runs. "
        f"The sparkline shows the last {SPARK_RUNS} runs: the line breaks at a non-ok run, drawn as a red "
        "dashed tick. The comparison ranks endpoints by their 7-day median. A figure the exporter's own "
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


def render_overview(ov: Overview, config: Config, notice: str | None = None) -> str:
    """The tile wall, the comparison strip and the methodology footnote."""
    head = (
        "<header><h1>tokwatch · decode speed</h1>"
        f'<p class="muted">{len(ov.tiles)} endpoints · refreshes every {REFRESH_S} s</p></header>'
    )
    warn = f'<p class="notice">{_e(notice)}</p>' if notice else ""
    many = (len({t.workload for t in ov.tiles}) > 1, len({t.site for t in ov.tiles}) > 1)
    tiles = "".join(_tile(t, ov.generated_at, config, many) for t in ov.tiles)
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
    return (
        f'<tr><td class="t">{_utc(r.time)}</td><td>{_e(r.triggered_by)}</td><td>{_pill(r.status)}{flags}</td>'
        f'<td class="num">{_tps(r.tokens_per_second)}</td><td>{_e(r.timing_source or "—")}</td>'
        f'<td class="num">{_ms(r.ttft_s)}</td><td class="num">{prompt}</td><td class="num">{prefill}</td>'
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
            + "".join(_pct_cells(getattr(f, attr), fmt, k) for _, attr, fmt, k in _PCT_FIGURES)
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


def render_message(title: str, message: str, now: float, config: Config | None = None) -> str:
    """A plain page for a missing endpoint or storage that is switched off."""
    body = f'<p><a href="/">← all endpoints</a></p><h1>{_e(title)}</h1><p class="notice">{_e(message)}</p>'
    return _page(f"tokwatch · {title}", body + (methodology(config) if config else ""), now, refresh=False)
