"""`tokwatch bench`: load generator with exact client-side latency metrics, SLOs and run reports."""
