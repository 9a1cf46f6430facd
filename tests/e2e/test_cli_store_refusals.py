"""A store is opened only as its settings say (docs/configuration.md "Stored mail: file modes,
encryption, daemon names"): eventsourcing's own environment variables are refused by
name, and a key file that does not fit the store is refused naming
`store.encryption_key_file`; both exit 2 with one line, before anything is written."""

from __future__ import annotations

import base64
import contextlib
import os
import sqlite3
from typing import Any

import pytest
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.utils import get_topic
from tests.e2e.conftest import config_text

from ledger.stores.cipher import new_key
from ledger.stores.key_ring import KeyRingCipher

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


def _with_key_file(cli: Any, key_text: str | None) -> None:
    """The config names store.key (holding `key_text`), or no key file when None."""
    text = config_text()
    if key_text is not None:
        (cli.root / "store.key").write_text(key_text)
        (cli.root / "store.key").chmod(0o600)
        text = text.replace("[store]\n", '[store]\nencryption_key_file = "store.key"\n')
    cli.config.write_text(text)


def _refused(result: Any, *names: str) -> None:
    assert result.code == 2, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    assert "store.encryption_key_file" in result.stderr
    assert all(name in result.stderr for name in names), result.stderr


def test_a_key_added_to_a_plain_store_is_refused_and_writes_nothing(cli: Any) -> None:
    assert cli.submit(JOB).code == 0
    _with_key_file(cli, new_key() + "\n")
    _refused(cli.run("status", "k-1"), "without encryption")
    _refused(cli.submit({**JOB, "key": "k-2"}))
    _with_key_file(cli, None)
    assert cli.run("status", "k-1").code == 0
    assert cli.run("status", "k-2").code == 4  # never written


def test_a_wrong_or_missing_key_is_refused_and_the_right_one_still_reads(cli: Any) -> None:
    right = new_key()
    _with_key_file(cli, right + "\n")
    assert cli.submit(JOB).code == 0
    _with_key_file(cli, new_key() + "\n")
    _refused(cli.run("status", "k-1"), "no key in the file")
    _refused(cli.submit({**JOB, "key": "k-2"}))
    _with_key_file(cli, None)
    _refused(cli.run("status", "k-1"), "is not set")
    _with_key_file(cli, f"{new_key()}\n{right}\n")  # a rotation: the store's key kept
    assert cli.submit({**JOB, "key": "k-3"}).code == 0
    _with_key_file(cli, right + "\n")  # back to the old key alone: still one of its keys
    assert cli.run("status", "k-1", "--json").json()["state"] == "requested"
    assert cli.run("status", "k-2").code == 4


@pytest.mark.parametrize("size", [16, 24, 31, 33, 64])
def test_a_key_that_is_not_32_bytes_is_refused_naming_the_file(cli: Any, size: int) -> None:
    _with_key_file(cli, base64.b64encode(os.urandom(size)).decode() + "\n")
    result = cli.submit(JOB)
    assert result.code == 2 and len(result.error_lines) == 1, result.stderr
    assert "store.encryption_key_file" in result.stderr and "store.key" in result.stderr
    assert f"a key of {size} bytes" in result.stderr and "AES-256 needs 32" in result.stderr
    assert not (cli.root / "ledger.sqlite").exists()


def test_new_key_prints_a_32_byte_key_the_store_takes(cli: Any) -> None:
    made = cli.run("admin", "new-key", "--json")
    assert made.code == 0
    key = made.json()["key"]
    assert len(base64.b64decode(key, validate=True)) == 32
    _with_key_file(cli, key + "\n")
    assert cli.submit(JOB).code == 0


def _writes_refused(store: Any) -> None:
    """The store's file as SQLite treats one it may not write, even for root (who ignores
    file modes): a "file format write version" above 2 (header byte 18) is read-only."""
    with contextlib.closing(sqlite3.connect(store)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all in the file, still WAL
    header = bytearray(store.read_bytes())
    header[18] = 3
    store.write_bytes(bytes(header))


def test_a_store_that_cannot_be_written_is_named_in_one_line_and_nothing_half_written(
    cli: Any,
) -> None:
    store = cli.root / "ledger.sqlite"
    assert cli.submit(JOB).code == 0
    _writes_refused(store)
    refused = cli.submit({**JOB, "key": "k-2"})
    assert refused.code == 1, refused.stderr
    assert refused.error_lines == [
        f"sendledger: store sqlite:{store}: read-only: it can be read but not written here "
        "(attempt to write a readonly database)"
    ], refused.stderr
    # What only reads still answers.
    assert cli.run("status", "k-1", "--json").json()["state"] == "requested"
    assert cli.run("status", "k-2").code == 4


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("a-folder", "is a directory, not a SQLite file"),
        ("a-file/ledger.sqlite", "a-file is not a directory"),
        ("notes.txt", "is not a SQLite database"),
    ],
)
def test_a_store_path_that_cannot_be_a_store_is_bad_input_naming_store_url(
    cli: Any, where: str, why: str
) -> None:
    """store.url naming a folder, a path under a file, or a file that is no SQLite
    database (the config itself, a note): exit 2 naming store.url, as a store that is
    not there is, and nothing is created or changed."""
    (cli.root / "a-folder").mkdir()
    (cli.root / "a-file").write_text("not a folder\n")
    (cli.root / "notes.txt").write_text("some notes, not a database\n" * 10)
    cli.write_config(f"sqlite:///{where}")
    for result in (cli.submit(JOB), cli.run("status", "k-1")):
        assert result.code == 2, result.stderr
        assert len(result.error_lines) == 1, result.stderr
        assert "store.url" in result.stderr or "no store at" in result.stderr, result.stderr
    refused = cli.submit(JOB)
    assert "store.url" in refused.stderr and why in refused.stderr, refused.stderr
    assert sorted(p.name for p in (cli.root / "a-folder").iterdir()) == []
    assert (cli.root / "notes.txt").read_text() == "some notes, not a database\n" * 10


def test_a_store_that_cannot_be_written_when_opened_is_named_the_same_way(cli: Any) -> None:
    """Read-only and not in WAL mode (copied from a backup, say): opening it must write
    its journal mode, so even `status` fails, and says why in the same one line."""
    store = cli.root / "ledger.sqlite"
    assert cli.submit(JOB).code == 0
    with contextlib.closing(sqlite3.connect(store)) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    _writes_refused(store)
    for result in (cli.run("status", "k-1"), cli.submit({**JOB, "key": "k-2"})):
        assert result.code == 1, result.stderr
        assert result.error_lines == [
            f"sendledger: store sqlite:{store}: read-only: it can be read but not written here "
            "(attempt to write a readonly database)"
        ], result.stderr


@pytest.mark.parametrize("port", ["0", "", "+5432"])
def test_a_postgresql_port_libpq_would_read_otherwise_is_bad_input_naming_store_url(
    cli: Any, port: str
) -> None:
    """`:0` and `:` reached port 5432, the server the URL did not name; now exit 2 in
    one line naming store.url and the port, never the password."""
    cli.write_config(f"postgresql://u:s3cret@127.0.0.1:{port}/db")
    for result in (cli.submit(JOB), cli.run("status", "k-1")):
        assert result.code == 2, result.stderr
        assert len(result.error_lines) == 1, result.stderr
        assert "store.url" in result.stderr and "bad port" in result.stderr, result.stderr
        assert "s3cret" not in result.stderr
