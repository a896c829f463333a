-- tokwatch schema v4 (SQLite): the timed run's wall time until it completed or failed, so a failed run
-- (which has no e2e latency) still says how long tokwatch waited (a timeout's duration is its timeout).
ALTER TABLE runs ADD COLUMN duration_s REAL;
