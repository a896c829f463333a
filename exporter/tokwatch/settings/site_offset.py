"""Sites apart in time: each site's rounds start at its own fraction of the interval, derived from its name,
so exporters at several sites never probe one server at the same instant by default (docs/scaling.md,
"Sites"). Two runs on one server at once share its batch: its counter window is no measurement of one run
(docs/methodology.md, "Server counters"), and each run's tok/s reads the other's load."""

from __future__ import annotations

import hashlib


def site_fraction(site: str) -> float:
    """A stable fraction in [0, 1) of the site's name (SHA-256, the same on every host and Python): 0 for no
    site, so an exporter without one keeps the configured offset exactly."""
    if not site:
        return 0.0
    digest = hashlib.sha256(site.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def site_offset(site: str, interval: float, offset: float) -> float:
    """The round offset of `site` on a schedule of `interval` whose configured (or default) offset is
    `offset`: shifted by the site's fraction of the interval, whole milliseconds, within [0, interval)."""
    shifted = (offset + site_fraction(site) * interval) % interval
    return round(shifted, 3) % interval
