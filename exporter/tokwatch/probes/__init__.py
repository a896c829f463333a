"""The registry of endpoint kinds: one module per kind under this package, each registered here once.

Everything tokwatch knows about a kind (URL, request body, stream parser, fixed-output fields, server
counters) is a class-level answer of its probe class; the probe flow and the bench client ask
`probe_class(kind)`.
"""

from __future__ import annotations

from tokwatch.probes.base import Probe
from tokwatch.probes.http import HttpProbe
from tokwatch.probes.llamacpp import LlamaCppProbe
from tokwatch.probes.ollama import OllamaProbe
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.probes.sglang import SGLangProbe
from tokwatch.probes.vllm import VllmProbe

PROBES: dict[str, type[HttpProbe]] = {
    p.kind: p for p in (OpenAIProbe, OllamaProbe, LlamaCppProbe, VllmProbe, SGLangProbe)
}


def probe_class(kind: str) -> type[HttpProbe]:
    """The class of an endpoint kind, which answers for it; raises ValueError naming the known kinds."""
    try:
        return PROBES[kind]
    except KeyError:
        known = ", ".join(sorted(PROBES))
        raise ValueError(f"unknown endpoint kind {kind!r}; known kinds: {known}") from None


def get_probe(kind: str) -> Probe:
    """A probe instance for an endpoint kind; raises ValueError naming the known kinds."""
    return probe_class(kind)()

