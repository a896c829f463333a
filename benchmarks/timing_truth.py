"""The bench's `client timing` verdict against the truth: is what it flags really wrong beyond tolerance?

`tokwatch bench`'s request records are joined with the reference server's truth log (benchmarks/refserver.py:
the kernel's arrival stamp of each request and every token's write time, perf_counter seconds of one machine)
by request id. Per request this works out the real error of each latency figure the check judges (TTFT, the
ITL p50/p95/p99, TPOT, E2E: client figure - true figure) and whether it is beyond the tolerance the check
uses (the larger of 1 ms and 5 % of the figure, docs/methodology.md "Disturbance"), then counts, per figure:

- **flagged**: requests the check flagged (`beyond_tolerance`);
- **real**: flagged requests whose figure's real error is beyond tolerance (the flag was right);
- **missed**: requests not flagged whose figure's real error is beyond tolerance (a bound smaller than the
  real error: must be 0);

a figure's real error counts as beyond tolerance only against both the server's stamp after each send and
the one before it (a server preempted around a send, on a busy host, makes its own truth late);

and per token the ITL error (client per-token gap - true per-token gap, as benchmarks/measurement_error.py)
and the stamp error (client receive stamp - the server's write), against the request's `stamp_lateness_s`
(the largest lateness the bounds allow any of its stamps): **stamp short** counts requests with a stamp later
than that by more than DELIVERY_SLACK_S (what loopback delivery and the server's own stamp after `send`
take, which no client bound counts).

The check's verdict is about the run's published figures (tokwatch.bench.run_bounds: the mean and
p50/p90/p95/p99 of TTFT, TBT, TPOT and E2E over the joined requests): **published beyond** names those whose
bound exceeds their tolerance (the check FAILs on any), **published really** those whose real error (the
figure of the client's values - the figure of the true ones) is beyond tolerance, **published missed** those
whose real error exceeds their bound by more than DELIVERY_SLACK_S (must be none).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokwatch.bench.aggregate import metric_values, summarize
from tokwatch.bench.request_metrics import RequestRecord
from tokwatch.bench.run_bounds import run_figure_bounds
from tokwatch.figures.result import Status
from tokwatch.figures.stats import percentiles
from tokwatch.settings.config import Tolerance

FIGURES = ("ttft", "itl", "tpot", "e2e")
ITL_PERCENTILES = (50.0, 95.0, 99.0)  # the ones the check judges (tokwatch.probes.error_bounds)
DELIVERY_SLACK_S = 0.0002
TOLERANCE = Tolerance()  # the bench's CLIENT_TOLERANCE: the probe's default


@dataclass(slots=True)
class TimingTruth:
    """One run's client timing verdict and the real errors beside it (seconds)."""

    verdict: str = "-"  # PASS / WARN / FAIL of health_checks.txt's `client timing` line
    joined: int = 0  # requests joined with a complete, kernel-stamped truth record, one token per chunk
    ttft_err: list[float] = field(default_factory=list)
    itl_err: list[float] = field(default_factory=list)  # every token after the first
    flagged_requests: int = 0
    flagged: dict[str, int] = field(default_factory=dict)
    real: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)
    stamp_short: int = 0
    stamp_excess_max_s: float | None = None  # the largest (stamp error - stamp_lateness_s) of any request
    # The published figures (`ttft p99`, ...): bound beyond tolerance, real error beyond it, real error
    # beyond the bound; None when the records carry no bounds (a tree from before run_bounds).
    published_beyond: list[str] | None = None
    published_real: list[str] | None = None
    published_missed: list[str] | None = None


def verdict_of(out_dir: Path) -> str:
    """The `client timing` verdict in a bench output directory's health_checks.txt ("-" without one)."""
    path = out_dir / "health_checks.txt"
    if not path.is_file():
        return "-"
    for line in path.read_text(encoding="utf-8").splitlines():
        if "] client timing:" in line:
            return line[1 : line.index("]")]
    return "-"


def real_errors(
    record: dict[str, Any], truth: dict[str, Any], writes_key: str = "write_perf_s"
) -> dict[str, list[tuple[float, float]]]:
    """(client figure, client figure - true figure) of each latency figure the check judges, by figure; the
    tokens' true times are `writes_key`'s (after each send returned, or right before it)."""
    arrival, writes = truth["arrival_perf_s"], truth[writes_key]
    n = len(writes)
    out: dict[str, list[tuple[float, float]]] = {}
    ttft = record["ttft_s"]
    out["ttft"] = [(ttft, ttft - (writes[0] - arrival))]
    gaps = list(record.get("tbt_s") or [])
    true_gaps = [b - a for a, b in itertools.pairwise(writes)]
    if gaps and true_gaps:
        values = percentiles(gaps, ITL_PERCENTILES)
        truths = percentiles(true_gaps, ITL_PERCENTILES)
        out["itl"] = [(v, v - t) for v, t in zip(values, truths, strict=True)]
    end = truth.get("tail_write_start_perf_s" if writes_key == "write_start_perf_s" else "tail_write_perf_s")
    if end is not None and record.get("e2e_s") is not None:
        out["e2e"] = [(record["e2e_s"], record["e2e_s"] - (end - arrival))]
        if record.get("tpot_s") is not None and n >= 2:
            out["tpot"] = [(record["tpot_s"], record["tpot_s"] - (end - writes[0]) / (n - 1))]
    return out


def beyond(errors: list[tuple[float, float]]) -> bool:
    """Whether any of a figure's real errors exceeds the tolerance of its value."""
    return any(abs(err) > TOLERANCE.latency_limit(value) for value, err in errors)


def judge(
    records: list[dict[str, Any]], truths: dict[str, dict[str, Any]], origin_s: float, out_dir: Path
) -> TimingTruth:
    """Join a bench run's records (request_level_metrics.jsonl lines; `origin_s`: summary.json's
    `client.perf_counter_origin_s`) with the server's truth by request id and count as the module says."""
    result = TimingTruth(verdict=verdict_of(out_dir))
    joined: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for r in records:
        t = truths.get(r.get("server_request_id") or "")
        if r.get("status") != "ok" or r.get("ttft_s") is None or t is None or t["arrival_source"] != "kernel":
            continue
        writes = t.get("write_perf_s") or []
        gaps = r.get("tbt_s") or []
        if not t.get("completed") or not writes or len(gaps) + 1 != len(writes):
            continue  # not one token per chunk, or no complete truth: no per-token join
        result.joined += 1
        joined.append((r, t))
        flagged = list(r.get("beyond_tolerance") or [])
        result.flagged_requests += bool(flagged)
        errors = real_errors(r, t)
        # A write happened between the stamps before and after its send: a figure is beyond tolerance only
        # against both (a server preempted around a send would otherwise pass for a client error).
        before = real_errors(r, t, "write_start_perf_s") if t.get("write_start_perf_s") else errors
        for figure in flagged:
            wrong = beyond(errors.get(figure, [])) and beyond(before.get(figure, []))
            result.flagged[figure] = result.flagged.get(figure, 0) + 1
            result.real[figure] = result.real.get(figure, 0) + wrong
        for figure, errs in errors.items():
            if figure not in flagged and beyond(errs) and beyond(before.get(figure, [])):
                result.missed[figure] = result.missed.get(figure, 0) + 1
        result.ttft_err.append(errors["ttft"][0][1])
        result.itl_err.extend(g - (b - a) for g, (a, b) in zip(gaps, itertools.pairwise(writes), strict=True))
        first = origin_s + r["sent_at_s"] + r["ttft_s"]
        stamps = [first, *(first + s for s in itertools.accumulate(gaps))]
        late = max(s - w for s, w in zip(stamps, writes, strict=True))
        excess = late - (r.get("stamp_lateness_s") or 0.0)
        if result.stamp_excess_max_s is None or excess > result.stamp_excess_max_s:
            result.stamp_excess_max_s = excess
        result.stamp_short += excess > DELIVERY_SLACK_S
    if joined and any("ttft_error_s" in r for r, _ in joined):
        _judge_published(result, joined)
    return result


_BOUNDED = ("ttft_error_s", "tpot_error_s", "ttot_error_s", "e2e_error_s", "tbt_down_s", "tbt_up_s")


def _as_record(line: dict[str, Any]) -> RequestRecord:
    """The figures and bounds of a request_level_metrics.jsonl line on a RequestRecord."""
    r = RequestRecord(int(line.get("request_id") or 0), "chat", status=Status.OK)
    for name in ("ttft_s", "tpot_s", "ttot_s", "e2e_s", "tbt_s", "max_stall_s", *_BOUNDED):
        if line.get(name) is not None:
            setattr(r, name, line[name])
    return r


def _true_record(line: dict[str, Any], truth: dict[str, Any], writes_key: str) -> RequestRecord:
    """The same request with the server's true figures (tokens' times from `writes_key`)."""
    arrival, writes = truth["arrival_perf_s"], truth[writes_key]
    end = truth.get("tail_write_start_perf_s" if writes_key == "write_start_perf_s" else "tail_write_perf_s")
    r = RequestRecord(int(line.get("request_id") or 0), "chat", status=Status.OK)
    r.ttft_s = writes[0] - arrival
    r.tbt_s = [b - a for a, b in itertools.pairwise(writes)]
    if end is not None:
        r.e2e_s = end - arrival
        r.tpot_s = (end - writes[0]) / (len(writes) - 1) if len(writes) >= 2 else None
    return r


def _judge_published(result: TimingTruth, joined: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """The published figures' bounds against their real errors over the joined requests."""
    measured = [_as_record(r) for r, _ in joined]
    after = [_true_record(r, t, "write_perf_s") for r, t in joined]
    before = [
        _true_record(r, t, "write_start_perf_s" if t.get("write_start_perf_s") else "write_perf_s")
        for r, t in joined
    ]
    true_after: dict[str, dict[str, Any]] = {}
    true_before: dict[str, dict[str, Any]] = {}
    result.published_beyond, result.published_real, result.published_missed = [], [], []
    for b in run_figure_bounds(measured, TOLERANCE):
        if b.metric not in true_after:
            true_after[b.metric] = summarize(metric_values(after, b.metric))
            true_before[b.metric] = summarize(metric_values(before, b.metric))
        truths = (true_after[b.metric][b.stat], true_before[b.metric][b.stat])
        errs = [b.value - t for t in truths if t is not None]
        if not errs:
            continue
        if b.beyond:
            result.published_beyond.append(b.name)
        # Against both truths, as the requests' figures: the server's own stamp brackets each write.
        if all(abs(e) > b.limit for e in errs):
            result.published_real.append(b.name)
        if all(abs(e) > b.bound + DELIVERY_SLACK_S for e in errs):
            result.published_missed.append(b.name)


def counts(by_figure: dict[str, int]) -> str:
    """`ttft 3, itl 12` in FIGURES order, `0` when none."""
    return ", ".join(f"{f} {by_figure[f]}" for f in FIGURES if by_figure.get(f)) or "0"
