-- tokwatch schema v9 (PostgreSQL and TimescaleDB): the segments of a `tokwatch bench` run split over
-- processes or machines (`--segment K/N`): one row per segment that finished, written with its requests,
-- which go to `bench_requests` under the one run id. The `bench_runs` row holds the figures merged from
-- every segment stored so far. Times are by the segment's own clock; `clock_offset_s` is this server's
-- clock minus it, within +- `clock_error_s` (half the round trip of the best of a few reads). A plain table
-- in both flavors, like the other bench tables.
CREATE TABLE bench_segments (
    bench_run_id text NOT NULL REFERENCES bench_runs (id) ON DELETE CASCADE,
    segment integer NOT NULL,
    segments integer NOT NULL,
    instance text NOT NULL,
    start_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    start_lag_s double precision,
    clock_offset_s double precision,
    clock_error_s double precision,
    complete boolean NOT NULL,
    stop_reason text NOT NULL,
    message text,
    arrivals_planned integer,
    requests_measured integer NOT NULL,
    requests_ok integer NOT NULL,
    cpu_s double precision,
    summary jsonb NOT NULL,
    PRIMARY KEY (bench_run_id, segment)
);
