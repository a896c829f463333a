-- tokwatch schema v4 (PostgreSQL and TimescaleDB): what started a run and whether its timing could have
-- been disturbed (docs/methodology.md, "Disturbance"); window figures leave out on-demand and disturbed
-- runs by default. Constant defaults, so existing rows (and compressed TimescaleDB chunks) need no rewrite.
ALTER TABLE runs ADD COLUMN triggered_by text NOT NULL DEFAULT 'scheduled';
ALTER TABLE runs ADD COLUMN timing_disturbed boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN max_stall_s double precision;
ALTER TABLE runs ADD COLUMN merged_reads integer;
ALTER TABLE runs ADD COLUMN send_delay_s double precision;
