"""A store remembers how it is encrypted (`ledger.stores.keycheck`, docs/configuration.md "Stored
mail: file modes, encryption, daemon names"): a wrong or missing key, or a key added to a plain
store, is refused at open naming `store.encryption_key_file`, before anything is written; key
rotation keeps opening; stores from before key checks are proved on their events and then
remembered. SQLite and PostgreSQL (`store_url`), and the memory store."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from tests.integration.test_ledger_store import SENDER, content

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.stores.cipher import EventKeyMissing, new_key
from ledger.stores.keycheck import (
    AES_256_GCM,
    DIGEST_SECRET,
    KEY_TABLE,
    PLAINTEXT,
    STORE_CHECK,
    KeyCheck,
    StoreKeyRefused,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store-v1"
SETTING = r"store\.encryption_key_file"


def checks(url: str, keys: list[str]) -> list[KeyCheck]:
    """The store's key checks, oldest first (the digest secret's rows aside)."""
    with Ledger(url, encryption_keys=keys) as ledger:
        found = ledger.recorder.key_checks()  # type: ignore[attr-defined]
    kept = [c for c in found if c.kind != DIGEST_SECRET]
    return sorted(kept, key=lambda c: c.created_at)


def event_count(url: str, keys: list[str]) -> int:
    with Ledger(url, encryption_keys=keys) as ledger:
        return ledger.recorder.max_notification_id() or 0


def drop_key_table(url: str, *, purged_at: bool = False) -> None:
    """What a store written before key checks looks like (and, with `purged_at`,
    before the index's purge column)."""
    statements = [f"DROP TABLE IF EXISTS {{s}}{KEY_TABLE}"]
    if purged_at:
        statements.append("ALTER TABLE {s}sendledger_jobs DROP COLUMN purged_at")
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            for statement in statements:
                conn.execute(statement.format(s=""))
            conn.commit()
        return
    import psycopg

    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.format(s=f'"{schema}".'))


def index_columns(url: str) -> set[str]:
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            return {row[1] for row in conn.execute("PRAGMA table_info(sendledger_jobs)")}
    import psycopg

    base, schema = url.split("?schema=")
    with psycopg.connect(base) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'sendledger_jobs'",
            (schema,),
        ).fetchall()
        return {row[0] for row in rows}


def key_table_exists(url: str) -> bool:
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = ?", (KEY_TABLE,)
            ).fetchone()
            return found is not None
    import psycopg

    base, schema = url.split("?schema=")
    with psycopg.connect(base) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".{KEY_TABLE}',)).fetchone()
        return row is not None and row[0] is not None


def test_a_plain_store_refuses_a_key_and_stays_plain(store_url: str, clock: FakeClock) -> None:
    with Ledger(store_url, clock=clock) as ledger:
        ledger.submit(content("p-1"), SENDER)
    assert [(c.check_id, c.kind) for c in checks(store_url, [])] == [(STORE_CHECK, PLAINTEXT)]
    with pytest.raises(StoreKeyRefused, match=rf"^{SETTING} is set, but .* without encryption"):
        Ledger(store_url, clock=clock, encryption_keys=[new_key()])
    assert event_count(store_url, []) == 1 and len(checks(store_url, [])) == 1
    with Ledger(store_url, clock=clock) as ledger:
        assert ledger.get_job("p-1").content.subject == content("p-1").subject


def test_an_encrypted_store_refuses_another_key_and_no_key(
    store_url: str, clock: FakeClock
) -> None:
    right, wrong = new_key(), new_key()
    with Ledger(store_url, clock=clock, encryption_keys=[right]) as ledger:
        ledger.submit(content("e-1"), SENDER)
    with pytest.raises(StoreKeyRefused, match=rf"^{SETTING}: no key in the file is a key of"):
        Ledger(store_url, clock=clock, encryption_keys=[wrong])
    with pytest.raises(StoreKeyRefused, match=rf"^{SETTING} is not set, but .* is encrypted"):
        Ledger(store_url, clock=clock)
    # Nothing was written by the refused opens: the right key reads everything still.
    assert event_count(store_url, [right]) == 1
    assert [c.kind for c in checks(store_url, [right])] == [AES_256_GCM]
    with Ledger(store_url, clock=clock, encryption_keys=[right]) as ledger:
        ledger.submit(content("e-2"), SENDER)
        assert ledger.get_job("e-1").content.body == content("e-1").body


def test_rotation_remembers_the_new_first_key_once(store_url: str, clock: FakeClock) -> None:
    old, new = new_key(), new_key()
    with Ledger(store_url, clock=clock, encryption_keys=[old]) as ledger:
        ledger.submit(content("r-1"), SENDER)
    # Step 1: the new key appended on every host: nothing to remember.
    assert len(checks(store_url, [old, new])) == 1
    # Step 2: the new key first: it is remembered, once, whichever host opens next.
    assert len(checks(store_url, [new, old])) == 2
    assert len(checks(store_url, [new, old])) == 2
    assert len(checks(store_url, [old, new])) == 2  # a host not yet restarted: no flip-flop
    # Step 3: the old key dropped: the store still opens with the new one alone...
    with Ledger(store_url, clock=clock, encryption_keys=[new]) as ledger:
        ledger.submit(content("r-2"), SENDER)
    # ...and a ring without any of its keys is still refused.
    with pytest.raises(StoreKeyRefused, match=SETTING):
        Ledger(store_url, clock=clock, encryption_keys=[new_key(), new_key()])


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_store_from_before_key_checks_is_proved_on_its_events(
    store_url: str, clock: FakeClock, encrypted: bool
) -> None:
    key = new_key()
    keys = [key] if encrypted else []
    with Ledger(store_url, clock=clock, encryption_keys=keys) as ledger:
        for i in range(12):
            ledger.submit(content(f"old-{i}"), SENDER)
    drop_key_table(store_url, purged_at=True)
    refused_with = [] if encrypted else [new_key()]
    with pytest.raises(StoreKeyRefused, match=SETTING):
        Ledger(store_url, clock=clock, encryption_keys=refused_with)
    if encrypted:
        with pytest.raises(StoreKeyRefused, match=SETTING):
            Ledger(store_url, clock=clock, encryption_keys=[new_key()])
    # Refused: nothing written, not the check table, not the index's upgrade.
    assert not key_table_exists(store_url)
    assert "purged_at" not in index_columns(store_url)
    with Ledger(store_url, clock=clock, encryption_keys=keys) as ledger:
        assert ledger.get_job("old-7").key == "old-7"
    assert "purged_at" in index_columns(store_url)
    assert [c.kind for c in checks(store_url, keys)] == [AES_256_GCM if encrypted else PLAINTEXT]
    with pytest.raises(StoreKeyRefused, match=SETTING):  # now from the check row
        Ledger(store_url, clock=clock, encryption_keys=refused_with)


def test_an_old_store_without_events_takes_the_configuration_it_is_opened_with(
    store_url: str,
) -> None:
    Ledger(store_url).close()
    drop_key_table(store_url)
    key = new_key()
    assert [c.kind for c in checks(store_url, [key])] == [AES_256_GCM]
    with pytest.raises(StoreKeyRefused, match=SETTING):
        Ledger(store_url)


def test_the_first_release_store_is_plain_and_refuses_a_key(tmp_path: Path) -> None:
    shutil.copy(FIXTURE / "ledger.sqlite", tmp_path / "ledger.sqlite")
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    with pytest.raises(StoreKeyRefused, match=SETTING):
        Ledger(url, encryption_keys=[new_key()])
    assert not key_table_exists(url)
    assert [c.kind for c in checks(url, [])] == [PLAINTEXT]


@pytest.mark.parametrize("fresh", [True, False], ids=["new-store", "old-store"])
def test_two_processes_creating_one_store_with_other_keys_cannot_both_open_it(
    store_url: str, fresh: bool
) -> None:
    """They race for the store's check row (and its table, and for a new store every
    table); the loser is judged against the winner's row."""
    if not fresh:
        Ledger(store_url).close()
        drop_key_table(store_url)  # tables, but no check yet: the race is for the row
    start = threading.Barrier(2)
    rings: list[list[str]] = [[new_key()], []]
    opened: list[list[str]] = []
    refused: list[list[str]] = []

    def open_with(keys: list[str]) -> None:
        start.wait()
        try:
            Ledger(store_url, encryption_keys=keys).close()
            opened.append(keys)
        except StoreKeyRefused:
            refused.append(keys)

    threads = [threading.Thread(target=open_with, args=(keys,)) for keys in rings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(opened) == 1 and len(refused) == 1
    assert len(checks(store_url, opened[0])) == 1


def test_a_shared_memory_store_checks_its_key_too() -> None:
    from ledger.stores.memory import discard_memory_store

    try:
        with Ledger("memory://keys-shared", encryption_keys=[new_key()]):
            with pytest.raises(StoreKeyRefused, match=SETTING):
                Ledger("memory://keys-shared", encryption_keys=[new_key()])
            with pytest.raises(StoreKeyRefused, match=SETTING):
                Ledger("memory://keys-shared")
    finally:
        discard_memory_store("keys-shared")


def test_an_event_whose_key_left_the_file_is_an_error_naming_the_setting(
    store_url: str, clock: FakeClock
) -> None:
    """Rotation step 3 done too early: the old key left the file while events written
    with it are kept. The store opens (the new key is one of its own), and reading such an
    event says which setting lacks a key, not the cipher's "Invalid cipher tag"."""
    old, new = new_key(), new_key()
    with Ledger(store_url, clock=clock, encryption_keys=[old]) as ledger:
        ledger.submit(content("m-1"), SENDER)
    checks(store_url, [new, old])
    with Ledger(store_url, clock=clock, encryption_keys=[new]) as ledger:
        for read in (lambda: ledger.get_job("m-1"), lambda: ledger.history("m-1")):
            with pytest.raises(EventKeyMissing, match=SETTING) as caught:
                read()
            assert "put back the key" in str(caught.value)
            assert "\n" not in str(caught.value)
        with pytest.raises(EventKeyMissing, match=SETTING):
            ledger.get_jobs(["m-1"])


def test_the_mailbox_digest_outlives_the_key_that_created_the_store(
    store_url: str, clock: FakeClock
) -> None:
    """The index's From mailbox on an encrypted store is a keyed digest; daemons share
    quota scopes by it and the index rows of open jobs keep it. A full rotation (new key
    first, then the old one removed) must not change it: a daemon with the new key alone
    would otherwise name a mailbox's scope apart from the rows already written (their
    jobs' calls waiting on a scope it does not own) and from daemons not yet restarted."""
    old, new = new_key(), new_key()
    mailbox = "support@example.com"
    with Ledger(store_url, clock=clock, encryption_keys=[old]) as ledger:
        ledger.submit(content("d-1"), SENDER)
        first = ledger.mailbox_of(mailbox)
        row = ledger.row("d-1")
        assert row is not None and row.mailbox == first
    for ring in ([old, new], [new, old], [old, new], [new]):
        with Ledger(store_url, clock=clock, encryption_keys=ring) as ledger:
            assert ledger.mailbox_of(mailbox) == first, [[old, new].index(k) for k in ring]


@contextlib.contextmanager
def read_only_role(pg_url: str) -> Iterator[str]:
    """The store's URL for a role that may only read its schema (a report, a replica)."""
    import psycopg

    base, schema = pg_url.split("?schema=")
    role = f"ro_{schema}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
    try:
        parts = urlsplit(pg_url)
        yield urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM "{role}"')
            conn.execute(f'REVOKE ALL ON SCHEMA "{schema}" FROM "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


@pytest.mark.postgres
def test_a_store_only_read_opens_without_writing_its_digest_row(
    pg_url: str, clock: FakeClock
) -> None:
    """The digest secret's row is written by the first open that can: a store opened with
    a role that may only read is read as before."""
    import psycopg

    key = new_key()
    with Ledger(pg_url, clock=clock, encryption_keys=[key]) as ledger:
        ledger.submit(content("ro-1"), SENDER)
        first = ledger.mailbox_of("support@example.com")
    base, schema = pg_url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{schema}".{KEY_TABLE} WHERE kind = %s', (DIGEST_SECRET,))
    with (
        read_only_role(pg_url) as reader,
        Ledger(reader, clock=clock, encryption_keys=[key]) as ledger,
    ):
        assert ledger.get_job("ro-1").key == "ro-1"
        assert ledger.mailbox_of("support@example.com") == first


@pytest.mark.postgres
def test_a_store_only_read_opens_mid_rotation_without_recording_the_new_key(
    pg_url: str, clock: FakeClock
) -> None:
    """Rotation step 2 (the new key first) reached a reader before any daemon: the check
    for the new key is written by the first open that can; the reader reads meanwhile,
    and a later open that may write records it."""
    old, new = new_key(), new_key()
    with Ledger(pg_url, clock=clock, encryption_keys=[old]) as ledger:
        ledger.submit(content("ro-2"), SENDER)
    with (
        read_only_role(pg_url) as reader,
        Ledger(reader, clock=clock, encryption_keys=[new, old]) as ledger,
    ):
        assert ledger.get_job("ro-2").key == "ro-2"
    assert len(checks(pg_url, [new, old])) == 2  # the first open that may write
    with Ledger(pg_url, clock=clock, encryption_keys=[new]):
        pass  # and the store opens with the new key alone
