"""SGLang probe: the OpenAI route plus the server-counter window around the timed run."""

from __future__ import annotations

from tokwatch.probes.openai import OpenAIProbe


class SGLangProbe(OpenAIProbe):
    """OpenAI-compatible answers; tok/s from /metrics counters when a counter window is configured."""

    kind = "sglang"
    uses_counters = True
