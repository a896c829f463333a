"""What one run is and what it measured: the run record, its series, statuses, token counts and the timing
math (pure functions shared by probe, bench and simulator)."""
