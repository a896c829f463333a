"""Prometheus collectors by subject, each reading in-memory state at scrape time (never I/O).

- `probe`: per-run metrics of each endpoint's timed runs (`tokwatch_probe_*`, latency histograms), and the
  families `/probe` answers with;
- `window`: window and fleet figures (`tokwatch_window_*`, `tokwatch_fleet_*`);
- `exporter`: the exporter's own figures (build, reloads, scheduler, probes in flight).

Server counters (`tokwatch.counters.collector`) and storage self-metrics (`tokwatch.storage.collector`)
live beside the state they read. Every collector is registered once, on the app's `Exposition`.
"""
