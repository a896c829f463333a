"""tokwatch: measure LLM inference endpoints (tok/s, TTFT, ITL, status) and export them to Prometheus."""

__version__ = "0.1.0"
