"""What one measured series is: an endpoint, probed with one workload, from one site (the vantage point).

Every per-run metric, stored run, window figure, status-page tile and report line belongs to one series;
`SeriesKey` is the key they are kept under, so figures of several workloads and sites never mix.
"""

from __future__ import annotations

from typing import NamedTuple

# The workload every endpoint gets unless configured otherwise: seed 000's prompt and 256 output tokens.
DEFAULT_WORKLOAD = "seed000"
# A run stored without a site (an exporter with no `site:` setting) belongs to this one.
NO_SITE = ""


class SeriesKey(NamedTuple):
    """(endpoint, workload, site): the identity of one measured series."""

    endpoint: str
    workload: str = DEFAULT_WORKLOAD
    site: str = NO_SITE

    def label(self) -> str:
        """`endpoint · workload @ site` (the site only when there is one), for logs and pages."""
        where = f" @ {self.site}" if self.site else ""
        return f"{self.endpoint} · {self.workload}{where}"


def run_name(endpoint: str, workload: str) -> str:
    """How logs and the CLI name an endpoint's runs of a workload: the endpoint alone for seed000 (the
    default, so existing log lines stay as they were), `endpoint workload W` for the others."""
    return endpoint if workload == DEFAULT_WORKLOAD else f"{endpoint} workload {workload}"
