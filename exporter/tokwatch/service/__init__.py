"""The running exporter: the application's wiring and lifecycle, the scheduler, sharding, and the one path
from a configured endpoint to a recorded run."""
