"""Channel policies: what to do when a send's outcome is unknown, per channel."""
