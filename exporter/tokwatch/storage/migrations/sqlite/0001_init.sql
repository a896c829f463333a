-- tokwatch schema v1 (SQLite): endpoints with stable ids and rename aliases, every run, hourly rollup.
-- Times are unix seconds (REAL); the PostgreSQL schema has the same columns as timestamptz.
CREATE TABLE endpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    renamed_at REAL
);

-- Former names of an endpoint (config `renamed_from`): runs under an old name keep the same id.
CREATE TABLE endpoint_aliases (
    name TEXT PRIMARY KEY,
    endpoint_id INTEGER NOT NULL REFERENCES endpoints (id),
    created_at REAL NOT NULL
);

CREATE TABLE runs (
    run_id TEXT NOT NULL PRIMARY KEY,
    time REAL NOT NULL,
    endpoint_id INTEGER NOT NULL REFERENCES endpoints (id),
    status TEXT NOT NULL,
    tokens_per_second REAL,
    timing_source TEXT,
    server_shared INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER,
    think_tokens INTEGER,
    prompt_tokens INTEGER,
    ttft_s REAL,
    ttot_s REAL,
    tpot_s REAL,
    itl_p50_s REAL,
    itl_p95_s REAL,
    itl_p99_s REAL,
    e2e_s REAL,
    http_status INTEGER,
    error_class TEXT,
    error_message TEXT,
    cold INTEGER,
    instance TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_endpoint_time ON runs (endpoint_id, time);
CREATE INDEX runs_time ON runs (time);

-- One row per endpoint and hour, recomputed from `runs` whenever a run lands in that hour.
CREATE TABLE runs_hourly (
    endpoint_id INTEGER NOT NULL REFERENCES endpoints (id),
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
    PRIMARY KEY (endpoint_id, bucket)
);
