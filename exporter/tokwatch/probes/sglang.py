"""The SGLang kind: the OpenAI route, fixed-length output, counters from SGLang's /metrics."""

from __future__ import annotations

from tokwatch.probes.openai import OpenAIProbe


class SGLangProbe(OpenAIProbe):
    """OpenAI-compatible answers; tok/s from /metrics counters when a counter window is configured."""

    kind = "sglang"
    counter_adapter = "sglang"
    fixed_length = True
