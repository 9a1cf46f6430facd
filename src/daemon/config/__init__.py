"""The daemon's settings: the TOML file, the ``SENDLEDGER_*`` environment, the secret files
they name, and the values a user writes in them (sizes, durations, moments)."""
