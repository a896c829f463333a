"""Grafana's PostgreSQL datasource macros and template variables, expanded the way Grafana expands them
before a panel's SQL reaches the server (no Grafana runs in the tests)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def expand_sql(
    sql: str,
    start: datetime,
    end: datetime,
    variables: Mapping[str, str | Sequence[str]],
    interval_s: int = 3600,
) -> str:
    """`sql` with $__interval, $__timeFilter(col) and $__timeGroupAlias(col, $__interval) expanded over
    [start, end], and each `$name`: a multi-value variable (a sequence) as Grafana's quoted, comma-separated
    list, a single value (a str) as is. Fails on anything left unexpanded."""
    sql = sql.replace("$__interval", f"'{interval_s}s'")
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)", rf"\1 BETWEEN '{start.isoformat()}' AND '{end.isoformat()}'", sql
    )
    sql = re.sub(
        r"\$__timeGroupAlias\(([^,]+),\s*'\d+s'\)",
        rf'floor(extract(epoch from \1)/{interval_s})*{interval_s} AS "time"',
        sql,
    )
    for name in sorted(variables, key=len, reverse=True):  # `$endpoints` before `$endpoint`
        value = variables[name]
        sql = sql.replace(f"${name}", value if isinstance(value, str) else ",".join(map(_quoted, value)))
    assert "$" not in sql, f"unexpanded Grafana macro or variable in: {sql}"
    return sql
