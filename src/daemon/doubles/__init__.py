"""Test doubles that implement the daemon's own ports: the in-memory provider and its drafts
variant. They live here, not in ``testkit``, because they subclass the provider port
(``daemon.providers.base``) and ``testkit`` imports nothing of the daemon, so that its
emulators and relays run as plain processes (docs/development.md "Development")."""
