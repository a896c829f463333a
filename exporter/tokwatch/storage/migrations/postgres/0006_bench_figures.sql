-- tokwatch schema v6 (PostgreSQL and TimescaleDB): what `tokwatch bench compare` needs to compare stored
-- runs exactly as it compares result directories: each request's normalized latency, decode tok/s and
-- per-token gaps (TBT, for the bootstrap), and the run's usage-based generated tok/s (throughput.json).
-- The bench tables are plain tables in both flavors, so one file serves both. Nullable, no default: rows
-- stored before this migration keep NULL here and compare reports those figures as not stored.
ALTER TABLE bench_requests ADD COLUMN normalized_latency_s double precision;
ALTER TABLE bench_requests ADD COLUMN decode_tokens_per_s double precision;
ALTER TABLE bench_requests ADD COLUMN tbt_s double precision[];
ALTER TABLE bench_runs ADD COLUMN generated_tokens_per_s double precision;
