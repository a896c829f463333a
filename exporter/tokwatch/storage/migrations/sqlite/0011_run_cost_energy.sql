-- tokwatch schema v11 (SQLite): each timed run's cost and energy (docs/methodology.md, "Cost and energy"):
-- what the run cost in `cost_currency` by `cost_method` (`list_price` hosted, `compute_time` self-hosted),
-- its prices per million tokens by phase, the energy its server's devices drew over the run, the part above
-- the idle baseline and that baseline in watts. NULL for runs of endpoints without prices or a power source
-- and for runs stored before.
ALTER TABLE runs ADD COLUMN cost REAL;
ALTER TABLE runs ADD COLUMN cost_currency TEXT;
ALTER TABLE runs ADD COLUMN cost_method TEXT;
ALTER TABLE runs ADD COLUMN cost_prompt_per_mtok REAL;
ALTER TABLE runs ADD COLUMN cost_generation_per_mtok REAL;
ALTER TABLE runs ADD COLUMN cost_blended_per_mtok REAL;
ALTER TABLE runs ADD COLUMN energy_j REAL;
ALTER TABLE runs ADD COLUMN energy_net_j REAL;
ALTER TABLE runs ADD COLUMN energy_idle_watts REAL;
