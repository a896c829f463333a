"""Incremental parsers for streamed LLM answers, one module per job (import a name from its module).

- `events`: what parsers emit (`TextDelta`, `Usage`, ...), `StreamProtocolError`, the `StreamParser` protocol.
- `framing`: bytes -> SSE `data` payloads or NDJSON lines, strict UTF-8 (`decode_utf8`).
- `think`: `<think>` tag splitting, text -> `TextDelta` events per phase.
- `payload`: JSON parsing and typed field reads shared by the dialects.
- `shape`: a stream's repeated chunk bytes, so a plain token chunk's text is read without parsing it again.
- `openai`, `ollama`: the dialect parsers (SSE chat chunks and the non-streamed answer; Ollama NDJSON).
- `collector`: `StreamCollector`, one answer's events for the timing math.
"""
