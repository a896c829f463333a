-- tokwatch schema v2 (plain PostgreSQL): runs, range-partitioned by month. The exporter creates monthly
-- partitions ahead of time (and for any month a replayed run needs) and drops them past retention.
CREATE TABLE runs (
    time timestamptz NOT NULL,
    run_id text NOT NULL,
    endpoint_id bigint NOT NULL REFERENCES endpoints (id),
    status text NOT NULL,
    tokens_per_second double precision,
    timing_source text,
    server_shared boolean NOT NULL DEFAULT false,
    output_tokens integer,
    think_tokens integer,
    prompt_tokens integer,
    ttft_s double precision,
    ttot_s double precision,
    tpot_s double precision,
    itl_p50_s double precision,
    itl_p95_s double precision,
    itl_p99_s double precision,
    e2e_s double precision,
    http_status integer,
    error_class text,
    error_message text,
    cold boolean,
    instance text NOT NULL DEFAULT '',
    -- A partitioned table or hypertable needs the partitioning column in every unique key; time is the
    -- run start, fixed for a run id, so (run_id, time) still stores a replayed run once.
    PRIMARY KEY (run_id, time)
) PARTITION BY RANGE (time);
CREATE INDEX runs_endpoint_time ON runs (endpoint_id, time DESC);
CREATE INDEX runs_time ON runs (time DESC);
