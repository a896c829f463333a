-- tokwatch schema v11 (PostgreSQL and TimescaleDB): through a proxy, the set-up of the timed run's
-- connection's CONNECT tunnel (docs/methodology.md, "Network phases": its own phase, `proxy_connect`, never
-- part of TTFT). Nullable, no default: existing rows and compressed TimescaleDB chunks need no rewrite.
ALTER TABLE runs ADD COLUMN phase_proxy_connect_s double precision;
