-- tokwatch schema v12 (SQLite): the result of each stored `tokwatch bench --search fluid|slo` capacity search
-- (capacity.json): the highest passing request rate and the output tokens/s measured at it, so the exporter
-- can price a self-hosted endpoint's tokens at capacity (docs/methodology.md, "Cost and energy").
CREATE TABLE bench_capacity (
    id TEXT PRIMARY KEY,
    finished_at REAL NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    result_rate REAL,
    output_tokens_per_s REAL,
    lower_bound INTEGER NOT NULL,
    instance TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX bench_capacity_endpoint ON bench_capacity (endpoint, finished_at DESC);
