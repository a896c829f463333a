"""One log line per round instead of one per run: the runs that were not ok and the client-timed figures
set aside, summed over the round (issue 36: at fleet size per-run lines drowned everything else). Each run
still has its own line at DEBUG."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from tokwatch.figures.result import RunResult
from tokwatch.figures.series import run_name

log = logging.getLogger("tokwatch")

NAMED = 5  # failed runs named in the round's line; the rest counted


@dataclass
class RoundTally:
    """What the runs recorded since the last summary had worth an operator's eye."""

    runs: int = 0
    failed: list[str] = field(default_factory=list)  # "name: status (error class)"
    statuses: Counter[str] = field(default_factory=Counter)
    set_aside: Counter[str] = field(default_factory=Counter)  # figures set aside per endpoint

    def add(self, result: RunResult) -> None:
        """Count one recorded run and log its details at DEBUG."""
        name = run_name(result.endpoint, result.workload)
        self.runs += 1
        if not result.ok:
            detail = f" ({result.error_class})" if result.error_class else ""
            self.failed.append(f"{name}: {result.status.value}{detail}")
            self.statuses[result.status.value] += 1
            log.debug(
                "endpoint %s: %s%s%s",
                name,
                result.status.value,
                detail,
                f": {result.error_message}" if result.error_message else "",  # redacted by the probe
            )
        if result.timing_disturbed:
            self.set_aside[result.endpoint] += len(result.set_aside)
            log.debug(
                "endpoint %s: %s set aside (the exporter's own lateness bounds their error above the "
                "tolerance; the measurement loop stalled up to %.1f ms; the run's status counts)",
                name,
                ", ".join(result.set_aside),
                (result.max_stall_s or 0.0) * 1e3,
            )

    def flush(self, round_no: int) -> None:
        """Log the round's summary lines (none for a round without a failed run or a figure set aside) and
        start counting anew."""
        if self.failed:
            named = ", ".join(self.failed[:NAMED])
            more = f" and {len(self.failed) - NAMED} more" if len(self.failed) > NAMED else ""
            log.info(
                "round %d: %d of %d runs not ok: %s%s",
                round_no,
                len(self.failed),
                self.runs,
                named,
                more,
                extra={
                    "round": round_no,
                    "runs": self.runs,
                    "runs_not_ok": len(self.failed),
                    "statuses": dict(self.statuses),
                },
            )
        if self.set_aside:
            figures = sum(self.set_aside.values())
            log.info(
                "round %d: %d figures set aside on %d endpoints (client timing disturbed)",
                round_no,
                figures,
                len(self.set_aside),
                extra={
                    "round": round_no,
                    "figures_set_aside": figures,
                    "endpoints_disturbed": len(self.set_aside),
                },
            )
        self.runs = 0
        self.failed = []
        self.statuses = Counter()
        self.set_aside = Counter()
