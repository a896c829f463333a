-- tokwatch schema v5 (SQLite): what `tokwatch bench compare` needs to compare stored runs exactly as it
-- compares result directories: each request's normalized latency, decode tok/s and per-token gaps (TBT, for
-- the bootstrap), and the run's usage-based generated tok/s (throughput.json). `tbt_s` is a BLOB of
-- little-endian float64 values, 8 bytes per gap (JSON text would be about 2.5 times larger). Rows stored
-- before this migration have NULL here: compare reports those figures as not stored.
ALTER TABLE bench_requests ADD COLUMN normalized_latency_s REAL;
ALTER TABLE bench_requests ADD COLUMN decode_tokens_per_s REAL;
ALTER TABLE bench_requests ADD COLUMN tbt_s BLOB;
ALTER TABLE bench_runs ADD COLUMN generated_tokens_per_s REAL;
