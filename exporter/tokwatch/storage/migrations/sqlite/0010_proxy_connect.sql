-- tokwatch schema v10 (SQLite): through a proxy, the set-up of the timed run's connection's CONNECT tunnel
-- (docs/methodology.md, "Network phases": its own phase, `proxy_connect`, never part of TTFT). NULL for runs
-- sent straight and for runs stored before.
ALTER TABLE runs ADD COLUMN phase_proxy_connect_s REAL;
