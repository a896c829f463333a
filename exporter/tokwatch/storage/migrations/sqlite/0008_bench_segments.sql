-- tokwatch schema v8 (SQLite): the segments of a `tokwatch bench` run split over processes or machines
-- (`--segment K/N`): one row per segment that finished, written with its requests, which go to
-- `bench_requests` under the one run id. The `bench_runs` row holds the figures merged from every segment
-- stored so far. Times are unix seconds by the segment's own clock; `clock_offset_s` is the store's clock
-- minus it (NULL here: an SQLite file has no clock of its own).
CREATE TABLE bench_segments (
    bench_run_id TEXT NOT NULL REFERENCES bench_runs (id) ON DELETE CASCADE,
    segment INTEGER NOT NULL,
    segments INTEGER NOT NULL,
    instance TEXT NOT NULL,
    start_at REAL NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    start_lag_s REAL,
    clock_offset_s REAL,
    clock_error_s REAL,
    complete INTEGER NOT NULL,
    stop_reason TEXT NOT NULL,
    message TEXT,
    arrivals_planned INTEGER,
    requests_measured INTEGER NOT NULL,
    requests_ok INTEGER NOT NULL,
    cpu_s REAL,
    summary TEXT NOT NULL,
    PRIMARY KEY (bench_run_id, segment)
);
