"""llama.cpp (llama-server) probe: the OpenAI route, `timings` as the engine source, /metrics counters."""

from __future__ import annotations

from tokwatch.probes.openai import OpenAIProbe


class LlamaCppProbe(OpenAIProbe):
    """`engine` = predicted_n / (predicted_ms / 1000) from the answer's `timings`."""

    kind = "llamacpp"
    uses_counters = True
