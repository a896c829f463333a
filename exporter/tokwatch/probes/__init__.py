"""Probe kinds by name: one class per endpoint kind behind the `Probe` interface."""

from __future__ import annotations

from tokwatch.probes.base import Probe
from tokwatch.probes.llamacpp import LlamaCppProbe
from tokwatch.probes.ollama import OllamaProbe
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.probes.sglang import SGLangProbe
from tokwatch.probes.vllm import VllmProbe

PROBES: dict[str, type[Probe]] = {
    p.kind: p for p in (OpenAIProbe, OllamaProbe, LlamaCppProbe, VllmProbe, SGLangProbe)
}


def get_probe(kind: str) -> Probe:
    """A probe instance for an endpoint kind; raises ValueError naming the known kinds."""
    try:
        return PROBES[kind]()
    except KeyError:
        known = ", ".join(sorted(PROBES))
        raise ValueError(f"unknown endpoint kind {kind!r}; known kinds: {known}") from None
