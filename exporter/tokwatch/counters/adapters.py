"""Pick the adapter for a scrape: the one the endpoint's kind names, or by the families the server exposes.

A kind names its adapter in its probe module (`HttpProbe.counter_adapter`); tests pin that each one is here.
"""

from __future__ import annotations

from collections.abc import Callable

from tokwatch.counters.llamacpp import read_llamacpp
from tokwatch.counters.parse import MetricsSnapshot
from tokwatch.counters.reading import CounterReading
from tokwatch.counters.sglang import PREFIXES as SGLANG_PREFIXES
from tokwatch.counters.sglang import read_sglang
from tokwatch.counters.vllm import read_vllm

Adapter = Callable[[MetricsSnapshot, "str | None"], CounterReading]

ADAPTERS: dict[str, Adapter] = {"vllm": read_vllm, "llamacpp": read_llamacpp, "sglang": read_sglang}
# The family-name prefixes each server's scrape is recognised by.
_PREFIXES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:",),
    "llamacpp": ("llamacpp:",),
    "sglang": SGLANG_PREFIXES,
}


def detect_server(snap: MetricsSnapshot, hint: str | None = None) -> str | None:
    """The server whose families the scrape holds; the hinted adapter wins when its families are present."""
    names = list(snap.names())
    present = [s for s, prefixes in _PREFIXES.items() if any(n.startswith(prefixes) for n in names)]
    if hint in present:
        return hint
    return present[0] if present else None


def read_counters(snap: MetricsSnapshot, adapter: str | None, model: str | None) -> CounterReading | None:
    """The server-neutral reading of one scrape, or None when it holds no known server's families.

    `adapter` is the one the endpoint's kind names (None: whichever server's families are present).
    """
    server = detect_server(snap, adapter)
    if server is None:
        return None
    return ADAPTERS[server](snap, model)
