-- tokwatch schema v7 (SQLite): each run's series (the workload it ran, the site it ran from), its prompt
-- (the size asked for; the seed and filler words of its fresh part, which regenerate it; whether the
-- server's count missed the size), the prompt tokens the server served from its cache (and whether that
-- went beyond the chat template's preamble), and its prefill tok/s with the source (docs/methodology.md,
-- "Workloads and fresh prompts", "Prefill speed"). Existing rows are seed000 runs from no site.
ALTER TABLE runs ADD COLUMN workload TEXT NOT NULL DEFAULT 'seed000';
ALTER TABLE runs ADD COLUMN site TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN prompt_seed TEXT;
ALTER TABLE runs ADD COLUMN prompt_target_tokens INTEGER;
ALTER TABLE runs ADD COLUMN prompt_words INTEGER;
ALTER TABLE runs ADD COLUMN prompt_size_missed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cached_tokens INTEGER;
ALTER TABLE runs ADD COLUMN cache_assisted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN prefill_tokens_per_second REAL;
ALTER TABLE runs ADD COLUMN prefill_source TEXT;

-- The hourly rollup per series (SQLite cannot change a primary key in place: the table is rebuilt).
CREATE TABLE runs_hourly_series (
    endpoint_id INTEGER NOT NULL REFERENCES endpoints (id),
    workload TEXT NOT NULL DEFAULT 'seed000',
    site TEXT NOT NULL DEFAULT '',
    bucket REAL NOT NULL,
    runs INTEGER NOT NULL,
    ok_runs INTEGER NOT NULL,
    tps_samples INTEGER NOT NULL,
    tps_median REAL,
    tps_mean REAL,
    tps_stddev REAL,
    tps_min REAL,
    tps_max REAL,
    ttft_median_s REAL,
    e2e_median_s REAL,
    prefill_tps_median REAL,
    PRIMARY KEY (endpoint_id, workload, site, bucket)
);
INSERT INTO runs_hourly_series (endpoint_id, bucket, runs, ok_runs, tps_samples, tps_median, tps_mean, tps_stddev,
                                tps_min, tps_max, ttft_median_s, e2e_median_s)
SELECT endpoint_id, bucket, runs, ok_runs, tps_samples, tps_median, tps_mean, tps_stddev, tps_min, tps_max,
       ttft_median_s, e2e_median_s
FROM runs_hourly;
DROP TABLE runs_hourly;
ALTER TABLE runs_hourly_series RENAME TO runs_hourly;
CREATE INDEX runs_hourly_bucket ON runs_hourly (bucket);

-- Every series with its first and last run time, kept up to date with each write: the status page and the
-- report find an endpoint's series here instead of scanning runs or the rollup. Existing runs: seed000 from
-- no site.
CREATE TABLE run_series (
    endpoint_id INTEGER NOT NULL REFERENCES endpoints (id),
    workload TEXT NOT NULL,
    site TEXT NOT NULL,
    first_time REAL NOT NULL,
    last_time REAL NOT NULL,
    PRIMARY KEY (endpoint_id, workload, site)
);
INSERT INTO run_series (endpoint_id, workload, site, first_time, last_time)
SELECT endpoint_id, 'seed000', '', min(time), max(time) FROM runs GROUP BY endpoint_id;
