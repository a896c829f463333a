"""Network vs server time of one series' runs: the medians of the stored network phases beside TTFT and
TTFT less one network round trip, the server's share (docs/methodology.md, "Network phases": "Network or
server"). Shown on the endpoint page, in the status API's endpoint view and in `tokwatch report`.

Over the ok runs with a TTFT that the prefix cache did not help (as the TTFT percentiles). Set-up phases
(`resolve`, `connect`, `tls`) and the round trip exist only for runs whose round opened its connection;
each median is over the runs that have its phase, and says how many those were.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokwatch.figures.stats import median
from tokwatch.storage.base import RunPoint

PHASES = ("resolve", "connect", "tls", "processing")


@dataclass(frozen=True, slots=True)
class NetworkTime:
    """Medians in seconds (None without a sample) and the number of runs behind them."""

    runs: int  # ok runs with a TTFT, not cache-assisted
    measured: int  # of them, runs whose round opened the connection (a round trip measured)
    resolve_s: float | None
    connect_s: float | None
    tls_s: float | None
    processing_s: float | None
    network_rtt_s: float | None
    ttft_s: float | None  # over every run counted (as the TTFT p50)
    server_s: float | None  # median of TTFT - round trip over the measured runs
    measured_ttft_s: float | None = None  # median TTFT of the measured runs: about network_rtt_s + server_s

    network_share: float | None = None  # median of round trip / TTFT over the measured runs

    def as_dict(self) -> dict[str, Any]:
        """JSON form (seconds, counts, the share as a ratio)."""
        return {
            "runs": self.runs,
            "measured_runs": self.measured,
            "resolve_seconds": self.resolve_s,
            "connect_seconds": self.connect_s,
            "tls_seconds": self.tls_s,
            "processing_seconds": self.processing_s,
            "network_rtt_seconds": self.network_rtt_s,
            "ttft_seconds": self.ttft_s,
            "server_seconds": self.server_s,
            "measured_ttft_seconds": self.measured_ttft_s,
            "network_share": self.network_share,
        }


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def network_time(runs: Iterable[RunPoint]) -> NetworkTime | None:
    """The split over `runs` (any order); None when none is an ok run with a TTFT."""
    timed = [r for r in runs if r.status == "ok" and r.ttft_s is not None and not r.cache_assisted]
    if not timed:
        return None
    measured = [r for r in timed if r.network_rtt_s is not None]
    return NetworkTime(
        runs=len(timed),
        measured=len(measured),
        resolve_s=_median(r.phase_resolve_s for r in timed),
        connect_s=_median(r.phase_connect_s for r in timed),
        tls_s=_median(r.phase_tls_s for r in timed),
        processing_s=_median(r.phase_processing_s for r in timed),
        network_rtt_s=_median(r.network_rtt_s for r in measured),
        ttft_s=_median(r.ttft_s for r in timed),
        server_s=_median(r.server_s for r in measured),
        measured_ttft_s=_median(r.ttft_s for r in measured),
        network_share=_median(min(1.0, (r.network_rtt_s or 0.0) / r.ttft_s) for r in measured if r.ttft_s),
    )
