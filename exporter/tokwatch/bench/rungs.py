"""Seed 003's paired runs: `--number 10 20 --parallel 5 10` is two runs (rungs), 10 requests at 5 in
parallel, then 20 at 10, as evalscope runs them; each rung writes `parallel_P_number_N/`."""

from __future__ import annotations

from typing import Any

from tokwatch.bench.config import BenchOptions
from tokwatch.settings.strict_yaml import ConfigError

PAIRED = ("number", "parallel")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def paired_rungs(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The (number, parallel) values of every rung, in order; one rung when neither is a list of several.
    Raises ConfigError when both are lists of different lengths."""
    lists = {k: _as_list(values[k]) for k in PAIRED if values.get(k) is not None}
    lengths = {k: len(v) for k, v in lists.items()}
    for k, n in lengths.items():
        if n == 0:
            raise ConfigError(f"--{k}: no value")
    if len(lengths) == 2 and lengths["number"] != lengths["parallel"]:
        n = lengths["number"]
        raise ConfigError(
            f"--number has {n} value{'s' if n != 1 else ''} and --parallel {lengths['parallel']}: give as "
            "many of each (one rung per pair, e.g. --number 10 20 --parallel 5 10)"
        )
    count = max(lengths.values(), default=1)
    return [{k: v[i] for k, v in lists.items()} for i in range(count)]


def rung_dir(opts: BenchOptions) -> str:
    """The rung's directory name, as evalscope names it: parallel_P_number_N."""
    number = opts.number if opts.number is not None else opts.effective_number
    return f"parallel_{opts.closed_loop_workers}_number_{number if number is not None else 'all'}"
