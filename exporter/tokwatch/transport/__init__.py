"""Getting bytes and their arrival times: the HTTP client, its wire format, kernel receive stamps, the
receive watcher, and the measurement loop that keeps stamps from waiting behind other work."""
