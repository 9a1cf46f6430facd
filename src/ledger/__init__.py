"""The domain: send jobs as event-sourced aggregates. No network I/O here."""
