"""The registry of endpoint kinds: one module per kind under this package, each registered here once.

Everything tokwatch knows about a kind (URL, request body, stream parser, fixed-output fields, server
counters) is a class-level answer of its probe class; the bench client, the request options and the
server-counter readers ask `probe_class(kind)`. The typed configs validate kind names against
`tokwatch.settings.kinds.Kind`, which tests pin to the keys of `PROBES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokwatch.probes.anthropic import AnthropicProbe
from tokwatch.probes.base import Probe
from tokwatch.probes.http import HttpProbe
from tokwatch.probes.llamacpp import LlamaCppProbe
from tokwatch.probes.ollama import OllamaProbe
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.probes.sglang import SGLangProbe
from tokwatch.probes.vllm import VllmProbe

if TYPE_CHECKING:
    from tokwatch.settings.config import EndpointSettings

PROBES: dict[str, type[HttpProbe]] = {
    p.kind: p for p in (OpenAIProbe, OllamaProbe, LlamaCppProbe, VllmProbe, SGLangProbe, AnthropicProbe)
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


def metrics_url(endpoint: EndpointSettings) -> str | None:
    """The server's /metrics URL: the configured `metrics_url`, else its kind's default (None: none)."""
    return endpoint.metrics_url or probe_class(endpoint.kind).default_metrics_url(endpoint.base_url)
