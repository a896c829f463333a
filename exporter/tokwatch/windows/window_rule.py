"""Which runs the window figures take: one rule, rendered as a Python predicate and as SQL.

Window figures (median, stddev and CV of tok/s, the p50/p90/p99 of decode, prefill and TTFT, uptime,
runs, the fleet ranking) are computed over stored
runs by SQL (`tokwatch.storage.window.window_figures`, which the /metrics window gauges, the status page and
`tokwatch report` all read) and over the in-memory window in Python (storage off). Both forms come from
this module: what sets a whole run aside is the table `_SET_ASIDE`, what makes a counted run a tok/s sample
is `sample` beside `sample_sql`. tests/windows/test_window_rule.py holds the two forms against each other on
SQLite
and PostgreSQL. To change which runs count (docs/methodology.md, "Window figures"), change it here.

Disturbance is judged by impact (docs/methodology.md, "Disturbance"): a run whose client stall moved some
figure beyond its tolerance still counts in runs, ok runs and uptime (its status is as true as any), and
only its tok/s stops being a sample when that figure was set aside (`tps_set_aside`); a server-sourced
tok/s is never set aside. Runs stored before figures were judged one by one (`tps_set_aside` NULL) keep the
old judgement for their tok/s: set aside when the run was `timing_disturbed` and its figure came from the
client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class StoredRun(Protocol):
    """A run as the rule reads it: attributes named as the `runs` table's columns (RunRow, RunPoint...)."""

    @property
    def status(self) -> str: ...

    @property
    def tokens_per_second(self) -> float | None: ...

    @property
    def triggered_by(self) -> str: ...

    @property
    def timing_disturbed(self) -> bool: ...

    @property
    def timing_source(self) -> str | None: ...

    @property
    def tps_set_aside(self) -> bool | None: ...


class FigureRun(StoredRun, Protocol):
    """A stored run with the figures it set aside (comma-separated FIGURES names of error_bounds)."""

    @property
    def set_aside(self) -> str | None: ...


class UncachedRun(FigureRun, Protocol):
    """A stored run as the figures that leave cache-assisted runs out read it."""

    @property
    def cache_assisted(self) -> bool: ...


class PrefillRun(UncachedRun, Protocol):
    """A stored run as the prefill median and percentiles read it."""

    @property
    def prefill_tokens_per_second(self) -> float | None: ...


class TtftRun(UncachedRun, Protocol):
    """A stored run as the TTFT percentiles read it."""

    @property
    def ttft_s(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class _SetAside:
    """Runs left out of window figures unless `schedule.window_includes` names `include`: those whose
    `column` does not hold `counted`."""

    include: str
    column: str
    counted: str | bool


_SET_ASIDE = (
    # /probe runs follow a scraper's cadence, not the schedule's: they would weigh some hours more.
    _SetAside("on_demand", "triggered_by", "scheduled"),
)
# Naming this takes set-aside tok/s figures into the median, stddev and CV anyway (the run itself counts
# either way): the client's lateness may have moved them beyond the tolerance (methodology, "Disturbance").
SET_ASIDE_SAMPLES = "timing_disturbed"
# The names `schedule.window_includes` accepts (its Literal restates them; a test holds the two together).
WINDOW_INCLUDABLE = (*(s.include for s in _SET_ASIDE), SET_ASIDE_SAMPLES)
# the stored names of tokwatch.figures.result.CLIENT_SOURCES
_CLIENT_SOURCES = ("client_stream", "client_wall")


@dataclass(frozen=True, slots=True)
class WindowRule:
    """The window rule for one configuration: the default sets aside every kind in `_SET_ASIDE`."""

    include: frozenset[str] = frozenset()

    @classmethod
    def of(cls, includes: Iterable[str]) -> WindowRule:
        """The rule for `schedule.window_includes`; an unknown name is a ValueError naming it."""
        wanted = frozenset(includes)
        if unknown := sorted(wanted - set(WINDOW_INCLUDABLE)):
            known = ", ".join(WINDOW_INCLUDABLE)
            raise ValueError(f"window_includes: unknown {', '.join(unknown)} (known: {known})")
        return cls(wanted)

    @property
    def _applied(self) -> tuple[_SetAside, ...]:
        return tuple(s for s in _SET_ASIDE if s.include not in self.include)

    def counts(self, run: StoredRun) -> bool:
        """Whether the run counts in the window (its runs, ok runs and uptime)."""
        return all(getattr(run, s.column) == s.counted for s in self._applied)

    def where(self, alias: str = "r") -> str:
        """`counts` as SQL to append to a WHERE clause over `runs {alias}` (SQLite and PostgreSQL alike)."""
        return "".join(f" AND {_sql_is(alias, s.column, s.counted)}" for s in self._applied)

    def sample(self, run: StoredRun) -> float | None:
        """The tok/s a counted run gives the median, stddev and CV: that of an ok run, when it has one and it
        was not set aside (or `window_includes` names set-aside figures)."""
        if run.status != "ok" or (SET_ASIDE_SAMPLES not in self.include and tps_set_aside(run)):
            return None
        return run.tokens_per_second

    def sample_sql(self, alias: str = "r") -> str:
        """`sample is not None` as an SQL condition over `runs {alias}`."""
        ok = _ok_tps_sql(alias)
        return ok if SET_ASIDE_SAMPLES in self.include else f"{ok} AND NOT {tps_set_aside_sql(alias)}"

    def set_aside(self, run: StoredRun) -> bool:
        """A counted ok run whose tok/s figure this rule does not take as a sample (it was set aside)."""
        return run.status == "ok" and run.tokens_per_second is not None and self.sample(run) is None

    def set_aside_sql(self, alias: str = "r") -> str:
        """`set_aside` as an SQL condition over `runs {alias}`."""
        if SET_ASIDE_SAMPLES in self.include:
            return "FALSE"
        return f"{_ok_tps_sql(alias)} AND {tps_set_aside_sql(alias)}"

    def prefill_sample(self, run: PrefillRun) -> float | None:
        """The prefill tok/s a counted run gives the prefill median and percentiles: that of an ok run the
        prefix cache did not help beyond the chat template's preamble (a cache-assisted run is counted apart),
        unless it was set aside with the TTFT it came from (or `window_includes` names set-aside figures)."""
        return self._uncached(run, run.prefill_tokens_per_second, "prefill")

    def prefill_sample_sql(self, alias: str = "r") -> str:
        """`prefill_sample is not None` as an SQL condition over `runs {alias}`."""
        return self._uncached_sql(alias, "prefill_tokens_per_second", "prefill")

    def ttft_sample(self, run: TtftRun) -> float | None:
        """The TTFT a counted run gives the TTFT percentiles: that of an ok run the prefix cache did not help
        (as for prefill: a cache-assisted TTFT is not what the prompt costs) and that was not set aside (or
        `window_includes` names set-aside figures)."""
        return self._uncached(run, run.ttft_s, "ttft")

    def ttft_sample_sql(self, alias: str = "r") -> str:
        """`ttft_sample is not None` as an SQL condition over `runs {alias}`."""
        return self._uncached_sql(alias, "ttft_s", "ttft")

    def _uncached(self, run: UncachedRun, value: float | None, figure: str) -> float | None:
        """`value` of an ok, not cache-assisted run whose `figure` this rule does not leave out."""
        if run.status != "ok" or run.cache_assisted or self._aside(run, figure):
            return None
        return value

    def _uncached_sql(self, alias: str, column: str, figure: str) -> str:
        """`_uncached is not None` for the value in `column`, as an SQL condition over `runs {alias}`."""
        return (
            f"{alias}.status = 'ok' AND NOT {alias}.cache_assisted AND {alias}.{column} IS NOT NULL"
            f"{self._aside_sql(alias, figure)}"
        )

    def _aside(self, run: FigureRun, figure: str) -> bool:
        """Whether `figure` of the run was set aside and this rule leaves set-aside figures out."""
        return SET_ASIDE_SAMPLES not in self.include and figure in (run.set_aside or "").split(",")

    def _aside_sql(self, alias: str, figure: str) -> str:
        """`not _aside` as SQL to append to a condition (nothing when set-aside figures are included)."""
        if SET_ASIDE_SAMPLES in self.include:
            return ""
        assert figure.isidentifier()  # a FIGURES name, never input
        # `set_aside` is a comma-separated list of FIGURES names. The doubled % reads the same to SQLite's
        # LIKE and is one % to psycopg, which takes % as a placeholder.
        return f" AND ',' || COALESCE({alias}.set_aside, '') || ',' NOT LIKE '%%,{figure},%%'"


def tps_set_aside(run: StoredRun) -> bool:
    """Whether the run's tok/s figure was set aside (the old judgement for runs stored without one)."""
    if run.tps_set_aside is not None:
        return bool(run.tps_set_aside)
    return bool(run.timing_disturbed) and run.timing_source in _CLIENT_SOURCES


def tps_set_aside_sql(alias: str = "r") -> str:
    """`tps_set_aside` as an SQL truth over `runs {alias}` (SQLite and PostgreSQL alike: booleans are
    INTEGER 0/1 in one and boolean in the other, and both read them as truths)."""
    sources = ", ".join(f"'{s}'" for s in _CLIENT_SOURCES)
    legacy = f"{alias}.timing_disturbed AND {alias}.timing_source IN ({sources})"
    return f"COALESCE({alias}.tps_set_aside, {legacy}, FALSE)"


def _ok_tps_sql(alias: str) -> str:
    return f"{alias}.status = 'ok' AND {alias}.tokens_per_second IS NOT NULL"


def _sql_is(alias: str, column: str, value: str | bool) -> str:
    if isinstance(value, bool):
        return f"{alias}.{column}" if value else f"NOT {alias}.{column}"
    assert "'" not in value  # constants of this module, never input
    return f"{alias}.{column} = '{value}'"
