"""Sharding: which replica probes which endpoint, when several exporters share one fleet and one store.

Each endpoint goes to the replica with the highest hash of (endpoint name, replica index) — rendezvous
hashing — so the split needs no coordination, survives restarts and config reloads, and adding a replica
moves only the endpoints the new replica now wins (about 1/N of them), never one between old replicas.

The fleet-wide figures are exported by one replica: the lowest-numbered one that probes something and is
live. A replica counts as live while the shared store holds a run of one of its endpoints from the last
`TAKEOVER_INTERVALS` probe intervals, so when replica 0 is down replica 1 takes over, and hands back once
replica 0 writes runs again. See docs/scaling.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger("tokwatch")
ENV_SHARD = "TOKWATCH_SHARD"  # "I/N"
ENV_INDEX = "TOKWATCH_SHARD_INDEX"  # "I", or a StatefulSet pod name such as "tokwatch-2"
ENV_COUNT = "TOKWATCH_SHARD_COUNT"  # "N"
_ORDINAL = re.compile(r"(\d+)$")
# A replica without a stored run for this many intervals is taken for down (one missed round is not enough).
TAKEOVER_INTERVALS = 3.0


class ShardError(ValueError):
    """A shard specification that cannot be used (says which and why)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Replica `index` (0-based) of `count`."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ShardError(f"shard {self.index}/{self.count}: needs 0 <= index < count")

    @property
    def primary(self) -> bool:
        """Replica 0: it exports the fleet-wide figures unless it owns no endpoint (`exports_fleet`)."""
        return self.index == 0

    def exports_fleet(self, owners: Iterable[int], live: Collection[int] | None = None) -> bool:
        """Whether this replica exports the fleet-wide figures, so that one replica does and Prometheus sums
        never count them twice: the lowest-numbered replica among those that probe an endpoint (`owners`:
        the owner of every enabled endpoint) and are `live` (None: not known yet, every replica presumed
        live). An unsharded exporter always does."""
        if self.count == 1:
            return True
        probing = set(owners)
        if not probing:
            return self.primary
        if self.index not in probing:
            return False
        return not any(i < self.index and (live is None or i in live) for i in probing)

    @property
    def label(self) -> str:
        """`I/N` as given on the command line."""
        return f"{self.index}/{self.count}"

    def owner(self, endpoint: str) -> int:
        """Index of the replica that probes `endpoint`."""
        return owner_of(endpoint, self.count)

    def owns(self, endpoint: str) -> bool:
        """True when this replica probes `endpoint`."""
        return self.count == 1 or self.owner(endpoint) == self.index


def owner_of(endpoint: str, count: int) -> int:
    """Rendezvous hashing: the replica with the highest hash of (endpoint, replica) wins."""
    if count == 1:
        return 0
    return max(range(count), key=lambda i: _score(endpoint, i))


def _score(endpoint: str, replica: int) -> int:
    digest = hashlib.blake2b(f"{replica}\0{endpoint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def parse_shard(text: str) -> Shard:
    """`I/N` (0-based I) -> Shard; raises ShardError naming the problem."""
    index, sep, count = text.strip().partition("/")
    if not sep or not index.strip().isdigit() or not count.strip().isdigit():
        raise ShardError(f"shard {text!r} must be INDEX/COUNT, e.g. 0/3 (INDEX counts from 0)")
    return Shard(int(index), int(count))


def shard_from_env(env: Mapping[str, str] | None = None) -> Shard | None:
    """TOKWATCH_SHARD=I/N, or TOKWATCH_SHARD_INDEX (a number or a pod name ending in one) with
    TOKWATCH_SHARD_COUNT, as a Kubernetes StatefulSet can set from the pod name; None when unset."""
    env = os.environ if env is None else env
    if spec := env.get(ENV_SHARD, "").strip():
        return parse_shard(spec)
    index, count = env.get(ENV_INDEX, "").strip(), env.get(ENV_COUNT, "").strip()
    if not index and not count:
        return None
    found = _ORDINAL.search(index)
    if found is None or not count.isdigit():
        raise ShardError(
            f"{ENV_INDEX}={index!r} and {ENV_COUNT}={count!r}: need an index (or a pod name ending in one) "
            "and a count"
        )
    return Shard(int(found.group(1)), int(count))


def takeover_after(interval_s: float) -> float:
    """Seconds without a stored run after which a replica is taken for down (fleet figures move on)."""
    return TAKEOVER_INTERVALS * interval_s


class FleetDuty:
    """Whether this replica exports the fleet-wide figures now, kept up to date by `check`.

    The lowest-numbered replica that probes something exports them; while every lower one that probes
    something has written no run to the shared store for `takeover_after(interval)`, the next one takes
    over, and hands them back when a lower one writes runs again. Until this replica has run that long, or
    without a shared store, the lower replicas are presumed live.
    """

    def __init__(self, shard: Shard, owners: Iterable[int], clock: Callable[[], float] = time.time) -> None:
        self.shard = shard
        self.exports = shard.exports_fleet(owners)
        self._clock = clock
        self._since = clock()

    def restart_clock(self) -> None:
        """Count the time this replica has been running from now (start-up)."""
        self._since = self._clock()

    async def check(
        self,
        owners: Mapping[str, int],
        interval_s: float,
        recent: Callable[[float], Awaitable[Collection[str]]] | None,
    ) -> None:
        """Update `exports`. `owners`: the replica probing each enabled endpoint of the fleet; `recent(t)`:
        the endpoints with a run in the shared store since unix time t (None: no shared store)."""
        if self.shard.count == 1:
            return
        live: set[int] | None = None
        after = takeover_after(interval_s)
        now = self._clock()
        lower = any(i < self.shard.index for i in owners.values())
        if lower and recent is not None and now - self._since >= after:
            try:
                written = await recent(now - after)
            except Exception as exc:  # keep the current duty; the next check tries again
                log.warning("shard %s: cannot tell which replicas are live: %s", self.shard.label, exc)
                return
            live = {owners[name] for name in written if name in owners}
        duty = self.shard.exports_fleet(owners.values(), live)
        if duty != self.exports and duty:
            log.warning(
                "shard %s: no lower replica has written a run for %.0fs: exporting the fleet-wide figures",
                self.shard.label,
                after,
            )
        elif duty != self.exports:
            log.warning(
                "shard %s: a lower replica is live again: fleet-wide figures left to it", self.shard.label
            )
        self.exports = duty
