"""Endpoint kinds by name: the vocabulary the typed configs (exporter and bench) validate against.

Only the names live here, below the config; everything a kind does lives in its module under
`tokwatch/probes/`, registered in `tokwatch.probes.PROBES` (tests/probes/test_registry.py pins that the
two list the same kinds).
"""

from typing import Literal

Kind = Literal["openai", "ollama", "llamacpp", "vllm", "sglang", "anthropic"]
