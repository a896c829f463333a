-- tokwatch schema v12 (PostgreSQL and TimescaleDB): each timed run's cost and energy (docs/methodology.md,
-- "Cost and energy"): what the run cost in `cost_currency` by `cost_method` (`list_price` hosted,
-- `compute_time` self-hosted), its prices per million tokens by phase, the energy its server's devices drew
-- over the run, the part above the idle baseline and that baseline in watts. Nullable, no default: existing
-- rows and compressed TimescaleDB chunks need no rewrite.
ALTER TABLE runs ADD COLUMN cost double precision;
ALTER TABLE runs ADD COLUMN cost_currency text;
ALTER TABLE runs ADD COLUMN cost_method text;
ALTER TABLE runs ADD COLUMN cost_prompt_per_mtok double precision;
ALTER TABLE runs ADD COLUMN cost_generation_per_mtok double precision;
ALTER TABLE runs ADD COLUMN cost_blended_per_mtok double precision;
ALTER TABLE runs ADD COLUMN energy_j double precision;
ALTER TABLE runs ADD COLUMN energy_net_j double precision;
ALTER TABLE runs ADD COLUMN energy_idle_watts double precision;
