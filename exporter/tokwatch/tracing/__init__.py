"""OpenTelemetry spans of probe runs, bench requests and simulated server requests (docs/tracing.md).

Built after a request from the stamps it recorded and handed to a batch processor: tracing never adds work
between a token's arrival and its stamp. The OTLP/HTTP export needs the optional `otel` extra.
"""
