"""Cost and energy over a window of runs, as pure functions over anything with a run's token, cost and
energy fields (a `RunResult` in memory, a stored run): the observed cache-hit share and the median J/output
token (docs/methodology.md, "Cost and energy")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from tokwatch.figures.stats import median


class CostedRun(Protocol):
    """The fields of a run the window figures read."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def cached_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def think_tokens(self) -> int | None: ...
    @property
    def energy_net_j(self) -> float | None: ...


def cache_hit_share(runs: Iterable[CostedRun]) -> float | None:
    """Cached prompt tokens over prompt tokens, summed over the runs whose server counted both; None
    without any."""
    prompt = cached = 0
    for r in runs:
        if r.prompt_tokens and r.cached_tokens is not None:
            prompt += r.prompt_tokens
            cached += min(max(r.cached_tokens, 0), r.prompt_tokens)
    return cached / prompt if prompt else None


def joules_per_output_token(run: CostedRun) -> float | None:
    """A run's energy above the idle baseline per output token (reasoning included); None without both."""
    tokens = (run.output_tokens or 0) + (run.think_tokens or 0)
    if run.energy_net_j is None or tokens <= 0:
        return None
    return run.energy_net_j / tokens


def median_joules_per_output_token(runs: Iterable[CostedRun]) -> float | None:
    """The median of the runs' J/output token; None when no run has one."""
    values = [v for r in runs if (v := joules_per_output_token(r)) is not None]
    return median(values) if values else None
