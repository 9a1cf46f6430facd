"""sendledger's Python client for programs that talk to its HTTP API (docs/http-api.md "Python
client"): `from sendledger.client import Client`. It imports nothing of the daemon, only
the standard library, so a program can use it without the daemon's dependencies."""

from sendledger.client import Client

__all__ = ["Client"]
