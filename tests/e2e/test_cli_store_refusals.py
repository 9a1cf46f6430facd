"""A store is opened only as its settings say (README "Stored mail: file modes,
encryption, daemon names"): eventsourcing's own environment variables are refused by
name, and a key file that does not fit the store is refused naming
`store.encryption_key_file`; both exit 2 with one line, before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.utils import get_topic

from ledger.stores.cipher import KeyRingCipher, new_key

JOB = {"channel": "receipts", "key": "k-1", "to": "a@example.com", "subject": "s", "body": "b"}


@pytest.mark.parametrize(
    "env",
    [
        {"COMPRESSOR_TOPIC": get_topic(ZlibCompressor)},
        {"CIPHER_TOPIC": get_topic(KeyRingCipher), "CIPHER_KEY": new_key()},
        {"PERSISTENCE_MODULE": "eventsourcing.popo"},
        {"SQLITE_DBNAME": "/tmp/elsewhere.sqlite"},
        {"AGGREGATE_CACHE_MAXSIZE": "1000"},
    ],
    ids=lambda env: "+".join(env),
)
def test_eventsourcing_variables_are_refused_by_name_and_nothing_is_written(
    cli: Any, env: dict[str, str]
) -> None:
    store = cli.root / "ledger.sqlite"
    refused = cli.submit(JOB, env=env)
    assert refused.code == 2, refused.stderr
    assert len(refused.error_lines) == 1 and sorted(env)[0] in refused.stderr
    assert not store.exists()
    # Without them the job is written, and read back by a process that has none of them.
    assert cli.submit(JOB).code == 0
    assert cli.run("status", "k-1", "--json", env=env).code == 2
    status = cli.run("status", "k-1", "--json")
    assert status.code == 0 and status.json()["state"] == "requested"
