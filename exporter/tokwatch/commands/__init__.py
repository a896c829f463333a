"""The command-line commands beyond the parser itself: demo and sim, db and report, healthcheck, and what
the foreground commands share. Each module imports only what its command needs."""
