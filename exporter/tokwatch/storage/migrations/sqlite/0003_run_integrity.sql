-- tokwatch schema v3 (SQLite): what started a run and whether its timing could have been disturbed
-- (docs/methodology.md, "Disturbance"); window figures leave out on-demand and disturbed runs by default.
ALTER TABLE runs ADD COLUMN triggered_by TEXT NOT NULL DEFAULT 'scheduled';
ALTER TABLE runs ADD COLUMN timing_disturbed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN max_stall_s REAL;
ALTER TABLE runs ADD COLUMN merged_reads INTEGER;
ALTER TABLE runs ADD COLUMN send_delay_s REAL;
