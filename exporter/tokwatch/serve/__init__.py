"""The exporter's HTTP face: /metrics exposition, the status API and its schema, the server's routes."""
