-- tokwatch schema v10 (PostgreSQL and TimescaleDB): the timed run's network phases (docs/methodology.md,
-- "Network phases"): DNS, TCP connect and TLS handshake of the connection it was sent on (when that round
-- opened it), the time from the request sent to the first response byte, one network round trip (the
-- network's share of TTFT) and whether the connection was already open. Nullable, no default: existing rows
-- and compressed TimescaleDB chunks need no rewrite.
ALTER TABLE runs ADD COLUMN phase_resolve_s double precision;
ALTER TABLE runs ADD COLUMN phase_connect_s double precision;
ALTER TABLE runs ADD COLUMN phase_tls_s double precision;
ALTER TABLE runs ADD COLUMN phase_processing_s double precision;
ALTER TABLE runs ADD COLUMN network_rtt_s double precision;
ALTER TABLE runs ADD COLUMN connection_reused boolean;
