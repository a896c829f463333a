"""The exporter's HTTP face: the server's routes (status page, /metrics, /probe, health), the status API
and its schema."""
