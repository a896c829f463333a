"""Server-side counters: vLLM, llama.cpp and SGLang /metrics, and Ollama's /api/ps and reload signals.

- `ServerCounters` (scraper.py): per endpoint with a metrics URL; scrape loop, `.state`, `.window`.
- `OllamaSignals` (ollama.py): per Ollama endpoint; reloads from run results, VRAM share from /api/ps.
- `ServerCollector` (collector.py): one per registry; exports `tokwatch_server_*` from the states.
- `ServerCounterWindow` (window.py): the probe's `CounterWindow` (counter-delta decode tok/s).
- `ServerWatchers` (watchers.py): the app's scrapers and pollers, kept in step with the config.
"""

from tokwatch.counters.collector import ServerCollector
from tokwatch.counters.ollama import OllamaSignals
from tokwatch.counters.scraper import ServerCounters
from tokwatch.counters.window import ServerCounterWindow

__all__ = ["OllamaSignals", "ServerCollector", "ServerCounterWindow", "ServerCounters"]
