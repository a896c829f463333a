"""tokwatch's Grafana dashboards, generated from Python with grafanalib (see docs/dashboards.md)."""
