-- tokwatch schema v6 (SQLite): disturbance by impact (docs/methodology.md, "Disturbance"). Each
-- client-timed figure's error bound from the client's own lateness (relative for tok/s, seconds for
-- latencies), the figures set aside (comma-separated), and whether tok/s is one of them: the window rule takes
-- a run's status always and its tok/s unless set aside. A NULL tps_set_aside (a run stored before) keeps the
-- old judgement (set aside when timing_disturbed and client-sourced; tokwatch.window_rule).
ALTER TABLE runs ADD COLUMN tps_error_ratio REAL;
ALTER TABLE runs ADD COLUMN ttft_error_s REAL;
ALTER TABLE runs ADD COLUMN itl_error_s REAL;
ALTER TABLE runs ADD COLUMN tpot_error_s REAL;
ALTER TABLE runs ADD COLUMN ttot_error_s REAL;
ALTER TABLE runs ADD COLUMN e2e_error_s REAL;
ALTER TABLE runs ADD COLUMN set_aside TEXT;
ALTER TABLE runs ADD COLUMN tps_set_aside INTEGER;
