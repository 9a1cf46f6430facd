"""The runtime: settings, providers, dispatcher, sweeper, CLI."""
