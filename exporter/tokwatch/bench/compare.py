"""The statistics of `tokwatch bench compare RUN_A RUN_B`: headline figures side by side with bootstrap
confidence intervals, and a gate that fails (exit 1) when B is worse than A beyond a threshold on chosen
figures. The command itself is in tokwatch.bench.commands.

A run is a result directory (`request_level_metrics.jsonl`, `throughput.json`) or a run stored with
`--config` (tokwatch.bench.compare_store); either way requests are taken in request-id order, so a run
compares the same from its directory and from the store. Confidence intervals come from a request-level
bootstrap: requests are resampled with replacement (a request's per-token gaps stay
together, since they are not independent), the statistic is recomputed, and the 2.5th and 97.5th
percentiles of the resampled statistic bound it (numpy: `tokwatch.bench.arrays.Groups` finds a resample's
percentiles without sorting it). A figure regresses when B is worse than A by more than
the threshold *and* the bootstrap interval of the difference B - A excludes zero, so noise alone does not
fail a CI job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokwatch.bench import arrays
from tokwatch.bench.costing import headline_figures
from tokwatch.bench.load_shape import LoadShape, cache_notes, differences, shape_of
from tokwatch.figures.wording import counted

# figure -> (jsonl key, list of values per request?, higher is better?)
FIGURES: dict[str, tuple[str, bool, bool]] = {
    "ttft": ("ttft_s", False, False),
    "tpot": ("tpot_s", False, False),
    "tbt": ("tbt_s", True, False),
    "e2e": ("e2e_s", False, False),
    "normalized_latency": ("normalized_latency_s", False, False),
    "decode_tokens_per_s": ("decode_tokens_per_s", False, True),
    "fluidity_index": ("fluidity_index", False, True),
}
STATS = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
DEFAULT_GATE = ("ttft:p50", "ttft:p99", "tpot:p50", "tpot:p99", "e2e:p50", "e2e:p99")


class CompareError(ValueError):
    """A run that cannot be read or a figure that does not exist (names the file or the figure)."""


@dataclass(frozen=True, slots=True)
class Run:
    """The measured `ok` requests of one run, by figure (a list per request)."""

    name: str
    values: dict[str, list[list[float]]]
    generated_tokens_per_s: float | None
    missing: tuple[str, ...] = ()  # figures the run's source does not hold (stored before they were)
    shape: LoadShape | None = None  # the load it ran under (None: its summary is not readable)
    # cost and energy figures of its summary (tokwatch.bench.costing.HEADLINES), when it was priced or powered
    cost_energy: dict[str, float] = field(default_factory=dict)

    def count(self) -> int:
        """Requests in the run's figures."""
        return max((len(v) for v in self.values.values()), default=0)


@dataclass(frozen=True, slots=True)
class Row:
    """One figure/statistic of A and B with bootstrap intervals."""

    figure: str
    stat: str
    a: float | None
    a_ci: tuple[float, float] | None
    b: float | None
    b_ci: tuple[float, float] | None
    change: float | None  # (B - A) / A
    diff_ci: tuple[float, float] | None  # bootstrap interval of B - A
    worse: bool  # B worse than A beyond the threshold, and the difference is not noise
    gated: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "figure": self.figure,
            "stat": self.stat,
            "a": self.a,
            "a_ci": self.a_ci,
            "b": self.b,
            "b_ci": self.b_ci,
            "change": self.change,
            "diff_ci": self.diff_ci,
            "worse": self.worse,
            "gated": self.gated,
        }


def load_run(path: str | Path) -> Run:
    """Read a result directory written by `tokwatch bench`; raises CompareError naming the problem."""
    root = Path(path)
    jsonl = root / "request_level_metrics.jsonl"
    if not jsonl.is_file():
        hint = (
            f"is {root} a `tokwatch bench` result directory?"
            if root.is_dir()
            else f"no directory {root}; a stored run id needs --config tokwatch.yml"
        )
        raise CompareError(f"{jsonl}: not found ({hint})")
    requests: list[tuple[tuple[int, int], dict[str, Any]]] = []
    with jsonl.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CompareError(f"{jsonl}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise CompareError(f"{jsonl}:{lineno}: expected an object per line")
            if rec.get("status") != "ok" or rec.get("warmup"):
                continue
            # The file is in completion order; the bootstrap depends on order, and the store reads by id.
            rid = rec.get("request_id")
            requests.append(((0, rid) if isinstance(rid, int) else (1, 0), rec))
    values: dict[str, list[list[float]]] = {f: [] for f in FIGURES}
    for _, rec in sorted(requests, key=lambda item: item[0]):
        for figure, (key, is_list, _) in FIGURES.items():
            raw = rec.get(key)
            if is_list and isinstance(raw, list):
                values[figure].append([float(v) for v in raw])
            elif not is_list and isinstance(raw, int | float):
                values[figure].append([float(raw)])
    throughput = None
    thr_path = root / "throughput.json"
    if thr_path.is_file():
        try:
            overall = json.loads(thr_path.read_text(encoding="utf-8")).get("overall", {})
            throughput = overall.get("generated_tokens_per_s")
        except (json.JSONDecodeError, AttributeError):
            raise CompareError(f"{thr_path}: not the JSON `tokwatch bench` writes") from None
    return Run(root.name, values, throughput if isinstance(throughput, int | float) else None,
               shape=_shape(root / "summary.json"),
               cost_energy=_cost_energy(root / "summary.json"))  # fmt: skip


def _cost_energy(path: Path) -> dict[str, float]:
    """The run's cost and energy figures from its summary.json (none when absent or unreadable)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return headline_figures(summary) if isinstance(summary, dict) else {}


def _shape(path: Path) -> LoadShape | None:
    """The run's load shape from its summary.json (None when absent or unreadable: noted, not fatal)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return shape_of(summary) if isinstance(summary, dict) else None


def parse_gate(items: Sequence[str]) -> list[tuple[str, str]]:
    """`ttft:p99` items -> (figure, stat); raises CompareError for unknown names."""
    out = []
    for item in items:
        figure, _, stat = item.strip().partition(":")
        if figure not in FIGURES:
            raise CompareError(f"unknown figure {figure!r} in {item!r}; known: {', '.join(FIGURES)}")
        if stat not in STATS:
            raise CompareError(f"unknown statistic {stat!r} in {item!r}; known: {', '.join(STATS)}")
        out.append((figure, stat))
    return out


def compare(
    a: Run,
    b: Run,
    *,
    threshold: float = 0.05,
    gate: Sequence[tuple[str, str]] = (),
    resamples: int = 400,
    seed: int = 0,
) -> list[Row]:
    """Every figure and statistic of A and B; `worse` per row, `gated` for the rows that decide.

    Each bootstrap resample draws A's and B's requests with replacement (numpy's generator, seeded) and gives
    every statistic of the figure; percentiles are `stats.percentile`'s (tokwatch.bench.arrays)."""
    rng = np.random.default_rng(seed)
    gated = set(gate)
    qs = list(STATS.values())
    rows = []
    for figure, (_, _, higher_better) in FIGURES.items():
        ga, gb = arrays.Groups(a.values[figure]), arrays.Groups(b.values[figure])
        sa, sb = ga.percentiles(qs), gb.percentiles(qs)
        if sa is None or sb is None:
            for i, stat in enumerate(STATS):
                rows.append(
                    Row(
                        figure, stat, sa[i] if sa else None, None, sb[i] if sb else None,
                        None, None, None, False, (figure, stat) in gated,
                    )
                )  # fmt: skip
            continue
        boot_a: list[list[float]] = []
        boot_b: list[list[float]] = []
        for _ in range(resamples):
            ra = ga.resampled(rng.integers(0, ga.count, ga.count), qs)
            rb = gb.resampled(rng.integers(0, gb.count, gb.count), qs)
            if ra is not None and rb is not None:
                boot_a.append(ra)
                boot_b.append(rb)
        for i, stat in enumerate(STATS):
            va, vb = sa[i], sb[i]
            col_a = [r[i] for r in boot_a]
            col_b = [r[i] for r in boot_b]
            a_ci, b_ci = _interval(col_a), _interval(col_b)
            d_ci = _interval([y - x for x, y in zip(col_a, col_b, strict=True)])
            change = (vb - va) / va if va else None
            if higher_better:
                worse = change is not None and -change > threshold and d_ci is not None and d_ci[1] < 0
            else:
                worse = change is not None and change > threshold and d_ci is not None and d_ci[0] > 0
            rows.append(Row(figure, stat, va, a_ci, vb, b_ci, change, d_ci, worse, (figure, stat) in gated))
    return rows


def _interval(values: Sequence[float]) -> tuple[float, float] | None:
    if not values:
        return None
    low, high = arrays.percentiles_sorted(arrays.as_sorted(values), [2.5, 97.5])
    return low, high


def regressions(rows: Sequence[Row]) -> list[Row]:
    """The gated rows on which B is worse than A."""
    return [r for r in rows if r.gated and r.worse]


def shape_lines(a: Run, b: Run) -> tuple[list[str], list[str]]:
    """(how the two runs' loads differ, notes): a verdict needs the first list empty."""
    if a.shape is None or b.shape is None:
        unknown = ", ".join(run.name for run in (a, b) if run.shape is None)
        return [], [f"load shape not recorded for {unknown} (no readable summary.json): not checked"]
    return differences(a.shape, b.shape), cache_notes(a.shape, b.shape)


def render_table(
    a: Run, b: Run, rows: Sequence[Row], threshold: float, shape_differences: Sequence[str] = ()
) -> str:
    """A Markdown table (seconds shown as ms), the throughput line and the verdict."""
    lines = [
        f"A: {a.name} ({counted(a.count(), 'request')})   B: {b.name} ({counted(b.count(), 'request')})   "
        f"threshold {threshold:.0%}",
        "",
        "| figure | stat | A | A 95 % CI | B | B 95 % CI | change | gate |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    notes = [
        f"{label} {run.name}: {', '.join(run.missing)} not stored for this run (stored before schema "
        "SQLite v5 / PostgreSQL v6); compare its result directory for them"
        for label, run in (("A", a), ("B", b))
        if run.missing
    ]
    notes += shape_lines(a, b)[1]
    if shape_differences:
        notes += ["THE RUNS DIFFER IN LOAD SHAPE (compared with --force): their figures do not compare", *(
            f"  {d}" for d in shape_differences
        )]  # fmt: skip
    if notes:
        lines[1:1] = notes
    for r in rows:
        if r.a is None and r.b is None:
            continue
        unit = 1.0 if FIGURES[r.figure][2] else 1e3  # seconds as ms; rates and indices as they are
        gate = ("WORSE" if r.worse else "ok") if r.gated else ("worse" if r.worse else "")
        lines.append(
            f"| {r.figure} | {r.stat} | {_fmt(r.a, unit)} | {_fmt_ci(r.a_ci, unit)} | {_fmt(r.b, unit)} "
            f"| {_fmt_ci(r.b_ci, unit)} | {_pct(r.change)} | {gate} |"
        )
    if a.generated_tokens_per_s is not None and b.generated_tokens_per_s is not None:
        change = (b.generated_tokens_per_s - a.generated_tokens_per_s) / a.generated_tokens_per_s
        lines += [
            "",
            f"generated throughput: A {a.generated_tokens_per_s:.1f} tok/s, "
            f"B {b.generated_tokens_per_s:.1f} tok/s "
            f"({_pct(change)}; one figure per run, no interval)",
        ]
    bad = regressions(rows)
    lines += [
        "",
        ("verdict (the load shapes differ, see above): " if shape_differences else "verdict: ")
        + (
            "B is worse than A on " + ", ".join(f"{r.figure} {r.stat}" for r in bad)
            if bad
            else "no gated figure is worse beyond the threshold"
        ),
    ]
    return "\n".join(lines)


def _fmt(v: float | None, unit: float) -> str:
    return "-" if v is None else f"{v * unit:.2f}"


def _fmt_ci(ci: tuple[float, float] | None, unit: float) -> str:
    return "-" if ci is None else f"{ci[0] * unit:.2f} to {ci[1] * unit:.2f}"


def _pct(change: float | None) -> str:
    return "-" if change is None else f"{change:+.1%}"
