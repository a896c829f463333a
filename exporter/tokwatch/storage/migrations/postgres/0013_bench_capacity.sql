-- tokwatch schema v13 (PostgreSQL and TimescaleDB): the result of each stored `tokwatch bench --search
-- fluid|slo` capacity search (capacity.json): the highest passing request rate and the output tokens/s
-- measured at it, so the exporter can price a self-hosted endpoint's tokens at capacity
-- (docs/methodology.md, "Cost and energy"). A plain table in both flavors.
CREATE TABLE bench_capacity (
    id text PRIMARY KEY,
    finished_at timestamptz NOT NULL,
    endpoint text NOT NULL,
    model text NOT NULL,
    mode text NOT NULL,
    result_rate double precision,
    output_tokens_per_s double precision,
    lower_bound boolean NOT NULL,
    instance text NOT NULL,
    summary jsonb NOT NULL
);
CREATE INDEX bench_capacity_endpoint ON bench_capacity (endpoint, finished_at DESC);
