-- tokwatch schema v8 (PostgreSQL and TimescaleDB): each run's series (the workload it ran, the site it ran
-- from), its prompt (the size asked for; the seed and filler words of its fresh part, which regenerate it;
-- whether the server's count missed the size), the prompt tokens the server served from its cache (and
-- whether that went beyond the chat template's preamble), and its prefill tok/s with the source
-- (docs/methodology.md, "Workloads and fresh prompts", "Prefill speed"). Constant defaults or NULL: existing
-- rows are seed000 runs from no site, and compressed TimescaleDB chunks need no rewrite.
ALTER TABLE runs ADD COLUMN workload text NOT NULL DEFAULT 'seed000';
ALTER TABLE runs ADD COLUMN site text NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN prompt_seed text;
ALTER TABLE runs ADD COLUMN prompt_target_tokens integer;
ALTER TABLE runs ADD COLUMN prompt_words integer;
ALTER TABLE runs ADD COLUMN prompt_size_missed boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN cached_tokens integer;
ALTER TABLE runs ADD COLUMN cache_assisted boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN prefill_tokens_per_second double precision;
ALTER TABLE runs ADD COLUMN prefill_source text;

-- The hourly rollup per series: one row per endpoint, workload, site and hour (a plain table, also under
-- TimescaleDB), with the prefill median beside the decode one.
ALTER TABLE runs_hourly ADD COLUMN workload text NOT NULL DEFAULT 'seed000';
ALTER TABLE runs_hourly ADD COLUMN site text NOT NULL DEFAULT '';
ALTER TABLE runs_hourly ADD COLUMN prefill_tps_median double precision;
ALTER TABLE runs_hourly DROP CONSTRAINT runs_hourly_pkey;
ALTER TABLE runs_hourly ADD PRIMARY KEY (endpoint_id, workload, site, bucket);
CREATE INDEX runs_hourly_bucket ON runs_hourly (bucket);

-- Every series with its first and last run time, kept up to date with each write: the status page and the
-- report find an endpoint's series here instead of scanning runs or the rollup. Existing runs: seed000 from
-- no site.
CREATE TABLE run_series (
    endpoint_id bigint NOT NULL REFERENCES endpoints (id),
    workload text NOT NULL,
    site text NOT NULL,
    first_time timestamptz NOT NULL,
    last_time timestamptz NOT NULL,
    PRIMARY KEY (endpoint_id, workload, site)
);
INSERT INTO run_series (endpoint_id, workload, site, first_time, last_time)
SELECT endpoint_id, 'seed000', '', min(time), max(time) FROM runs GROUP BY endpoint_id;
