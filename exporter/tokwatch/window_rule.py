"""Which runs the window figures take: one rule, rendered as a Python predicate and as SQL.

Window figures (median, stddev and CV of tok/s, the p50/p90/p99 of decode, prefill and TTFT, uptime,
runs, the fleet ranking) are computed over stored
runs by SQL (`tokwatch.storage.window.window_figures`, which the /metrics window gauges, the status page and
`tokwatch report` all read) and over the in-memory window in Python (storage off). Both forms come from
this module: what sets a run aside is the table `_SET_ASIDE`, what makes a counted run a tok/s sample is
`sample` beside `sample_sql`. tests/test_window_rule.py holds the two forms against each other on SQLite
and PostgreSQL. To change which runs count (docs/methodology.md, "Window figures"), change it here: to let
every run count in runs and uptime but set aside an unreliable tok/s figure, drop a `_SET_ASIDE` row and
narrow `sample`/`sample_sql` (with the column they read added to `StoredRun` and the rows that carry it).
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


class PrefillRun(StoredRun, Protocol):
    """A stored run as the prefill median reads it."""

    @property
    def prefill_tokens_per_second(self) -> float | None: ...

    @property
    def cache_assisted(self) -> bool: ...


class TtftRun(StoredRun, Protocol):
    """A stored run as the TTFT percentiles read it."""

    @property
    def ttft_s(self) -> float | None: ...

    @property
    def cache_assisted(self) -> bool: ...


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
    # The exporter's own lateness may have moved the run's client-side stamps (methodology, "Disturbance").
    _SetAside("timing_disturbed", "timing_disturbed", False),
)
# The names `schedule.window_includes` accepts (its Literal restates them; a test holds the two together).
WINDOW_INCLUDABLE = tuple(s.include for s in _SET_ASIDE)


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
        """`counts` as SQL to append to a WHERE clause over `runs {alias}` (SQLite and PostgreSQL alike:
        `timing_disturbed` is INTEGER 0/1 in one and boolean in the other, and both read it as a truth)."""
        return "".join(f" AND {_sql_is(alias, s.column, s.counted)}" for s in self._applied)

    @staticmethod
    def sample(run: StoredRun) -> float | None:
        """The tok/s a counted run gives the median, stddev and CV: that of an ok run, when it has one."""
        return run.tokens_per_second if run.status == "ok" else None

    @staticmethod
    def sample_sql(alias: str = "r") -> str:
        """`sample is not None` as an SQL condition over `runs {alias}`."""
        return f"{alias}.status = 'ok' AND {alias}.tokens_per_second IS NOT NULL"

    @staticmethod
    def prefill_sample(run: PrefillRun) -> float | None:
        """The prefill tok/s a counted run gives the prefill median: that of an ok run the prefix cache did
        not help beyond the chat template's preamble (a cache-assisted run is counted apart)."""
        if run.status != "ok" or run.cache_assisted:
            return None
        return run.prefill_tokens_per_second

    @staticmethod
    def prefill_sample_sql(alias: str = "r") -> str:
        """`prefill_sample is not None` as an SQL condition over `runs {alias}`."""
        return (
            f"{alias}.status = 'ok' AND NOT {alias}.cache_assisted "
            f"AND {alias}.prefill_tokens_per_second IS NOT NULL"
        )

    @staticmethod
    def ttft_sample(run: TtftRun) -> float | None:
        """The TTFT a counted run gives the TTFT percentiles: that of an ok run the prefix cache did not
        help (as for prefill: a cache-assisted TTFT is not what the prompt costs)."""
        if run.status != "ok" or run.cache_assisted:
            return None
        return run.ttft_s

    @staticmethod
    def ttft_sample_sql(alias: str = "r") -> str:
        """`ttft_sample is not None` as an SQL condition over `runs {alias}`."""
        return f"{alias}.status = 'ok' AND NOT {alias}.cache_assisted AND {alias}.ttft_s IS NOT NULL"


def _sql_is(alias: str, column: str, value: str | bool) -> str:
    if isinstance(value, bool):
        return f"{alias}.{column}" if value else f"NOT {alias}.{column}"
    assert "'" not in value  # constants of this module, never input
    return f"{alias}.{column} = '{value}'"
