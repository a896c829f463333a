-- tokwatch schema v5 (PostgreSQL and TimescaleDB): the timed run's wall time until it completed or failed,
-- so a failed run (which has no e2e latency) still says how long tokwatch waited. Nullable, no default:
-- existing rows and compressed TimescaleDB chunks need no rewrite.
ALTER TABLE runs ADD COLUMN duration_s double precision;
