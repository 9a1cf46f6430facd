"""The store beyond what eventsourcing's own recorder tests cover (test_recorder_cases.py):
the job index under POSTGRES_ENABLE_DB_FUNCTIONS, an atomic rebuild that never moves a row
back, private files, encryption at rest, and the daemon identity lock.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_ledger_store import (
    SENDER,
    attempt_args,
    content,
    make_mixed_jobs,
)
from tests.unit.engine_rig import DAEMON, EngineRig, policy

from daemon import cli
from daemon.config.secret_files import encryption_keys, warn_exposed_secrets
from daemon.config.settings import ConfigError, settings_from_dict
from daemon.doubles.fake_time import FakeClock
from daemon.engine.recover import OWN_REASON
from daemon.runtime import start_up
from ledger import application
from ledger.application import ConcurrentUpdate, IdentityTaken, Ledger
from ledger.content import JobContent, parse_job
from ledger.decision_types import RetryAt, Review
from ledger.job import SendJob, job_id_for
from ledger.stores.cipher import EventKeyMissing, new_key
from ledger.stores.identity import api_lock_name
from ledger.stores.index import IndexRow, index_row
from ledger.stores.url import SqliteStore, StoreUrlError
from ledger.vocabulary import EscalationReason, JobState, PolicyRef

SRC = Path(__file__).resolve().parents[2] / "src"
SECRET_BODY = "The vault code is 4471-SECRET-BODY"
SECRET_SUBJECT = "Confidential subject line 9931"
SECRET_ADDRESS = "hidden.recipient@private-example.org"


# -- POSTGRES_ENABLE_DB_FUNCTIONS ------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("functions", ["y", "n"])
def test_the_index_row_is_written_whatever_the_insert_mode(
    pg_url: str, clock: FakeClock, functions: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The library reads this from the process environment, as a daemon's unit file sets it.
    monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", functions)
    with Ledger(pg_url, clock=clock) as ledger:
        assert ledger.recorder.datastore.enable_db_functions is (functions == "y")  # type: ignore[attr-defined]
        ledger.submit(content("fn-1"), SENDER)
        assert ledger.row("fn-1") == index_row(ledger.get_job("fn-1"))
        ledger.update("fn-1", lambda j: j.claim(**attempt_args(clock)))
        row = ledger.row("fn-1")
        assert row is not None and (row.state, row.version) == ("attempted", 2)
        assert [r.key for r in ledger.due(JobState.ATTEMPTED, clock() + timedelta(hours=1), 9)] == [
            "fn-1"
        ]
        # Optimistic concurrency still refuses a stale writer, and leaves the row alone.
        stale = ledger.get_job("fn-1")
        ledger.update(
            "fn-1", lambda j: j.record_unknown(reason="t", decision=_review(), at=clock())
        )
        stale.record_unknown(reason="t", decision=_review(), at=clock())
        with pytest.raises(ConcurrentUpdate):
            ledger.save_job(stale)
        assert ledger.row("fn-1") == index_row(ledger.get_job("fn-1"))
        # Several events of one save, one transaction: the row matches the last.
        assert ledger.rebuild_index() == 1
        assert ledger.row("fn-1") == index_row(ledger.get_job("fn-1"))


def _review() -> Review:
    return Review(PolicyRef("receipts", "0123456789abcdef"), EscalationReason.UNKNOWN_OUTCOME)


# -- rebuild-index: one transaction, never backwards ---------------------------------------


def test_rebuild_never_moves_a_row_back_while_a_daemon_writes(
    store_url: str, clock: FakeClock
) -> None:
    """The daemon writes a job after the rebuild has read it and before it writes the
    index (at the progress call after 1000 jobs): the newer row stays."""
    with Ledger(store_url, clock=clock) as ledger, Ledger(store_url, clock=clock) as daemon:
        # One transaction for the thousand (the rebuild reads them as it would a thousand
        # single submits': the same events, a page at a time).
        ledger.submit_many([(content(f"r-{i:04d}"), SENDER) for i in range(1000)])
        writes: list[int] = []

        def daemon_writes(count: int) -> None:
            daemon.update("r-0000", lambda j: j.claim(**attempt_args(clock)))
            daemon.submit(content("r-late"), SENDER)  # created after the projection
            writes.append(count)

        # r-late may be read too: the events are read a page at a time.
        assert ledger.rebuild_index(daemon_writes) in (1000, 1001)
        assert writes == [1000]
        for key in ("r-0000", "r-late", "r-0999"):
            assert ledger.row(key) == index_row(ledger.get_job(key)), key
        row = ledger.row("r-0000")
        assert row is not None and row.version == 2
        assert ledger.rebuild_index() == 1001


@pytest.mark.parametrize(
    "store", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_failed_rebuild_leaves_the_index_as_it_was(
    store: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'l.sqlite'}"
        if store == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    with Ledger(url, clock=clock) as ledger:
        make_mixed_jobs(ledger, clock, count=12)
        before = list(ledger.jobs())
        real = index_row

        def broken(job: Any) -> IndexRow:
            row = real(job)
            # The last key's row cannot be written (NOT NULL): the write fails part-way.
            return IndexRow(**{**row.as_dict(), "channel": None}) if job.key == "mix-011" else row

        monkeypatch.setattr(application, "index_row", broken)
        with pytest.raises(Exception):  # noqa: B017 - the driver's own integrity error
            ledger.rebuild_index()
        monkeypatch.setattr(application, "index_row", real)
        assert list(ledger.jobs()) == before


def test_the_memory_store_rebuilds_as_the_sql_ones(clock: FakeClock) -> None:
    # (store_url, from tests/conftest.py, is SQLite and PostgreSQL.)
    with Ledger("memory://", clock=clock) as ledger:
        ledger.submit(content("m-1"), SENDER)
        stale = list(ledger._projected_rows(None))
        ledger.update("m-1", lambda j: j.claim(**attempt_args(clock)))
        orphan = IndexRow(**{**stale[0].as_dict(), "key": "orphan", "job_id": uuid.uuid4().hex})
        ledger._index.replace_all([*ledger.jobs(), orphan])
        ledger._index.rebuild(stale)
        assert list(ledger.jobs()) == [index_row(ledger.get_job("m-1"))]


def test_a_rebuild_drops_only_rows_without_events(store_url: str, clock: FakeClock) -> None:
    with Ledger(store_url, clock=clock) as ledger:
        ledger.submit(content("kept"), SENDER)
        orphan = IndexRow(
            **{
                **index_row(ledger.get_job("kept")).as_dict(),
                "key": "orphan",
                "job_id": uuid.uuid4().hex,
            }
        )
        ledger._index.replace_all([*ledger.jobs(), orphan])
        assert ledger.rebuild_index() == 1
        assert [r.key for r in ledger.jobs()] == ["kept"]


# -- private files -------------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_store_file_wal_shm_and_folders_are_private_whatever_the_umask(
    tmp_path: Path, clock: FakeClock, open_umask: None
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    path = existing / "new" / "deeper" / "ledger.sqlite"
    with Ledger(f"sqlite:///{path}", clock=clock) as ledger:
        ledger.submit(content("p-1"), SENDER)
        ledger.update("p-1", lambda j: j.claim(**attempt_args(clock)))
        files = [path, path.with_name("ledger.sqlite-wal"), path.with_name("ledger.sqlite-shm")]
        assert all(f.exists() for f in files)
        assert {str(f.name): _mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert _mode(path.parent) == 0o700 and _mode(path.parent.parent) == 0o700
        lock = ledger.hold_identity("perm")
        try:
            assert {_mode(p) for p in path.parent.glob("*.lock")} == {0o600}
        finally:
            lock.release()
    assert _mode(existing) == 0o755  # a folder that existed is left as it was


def test_a_store_reached_by_a_symlink_to_a_file_not_there_yet_is_created_private(
    tmp_path: Path, clock: FakeClock, open_umask: None
) -> None:
    """A store path that is a symlink to a file not made yet (an `admin copy-store --to`
    link to a disk with room, another file system): the file is made at the link's
    target, 0600, its missing folders 0700. Before, the creation saw the link as a file
    there and left it to SQLite, which made the target with the umask's mode (0666 here,
    0644 under the usual umask): bodies and addresses readable by every user."""
    from daemon.service_layer.copy_store import copy_store

    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "copy.sqlite").symlink_to(elsewhere / "new" / "copy.sqlite")
    (tmp_path / "ledger.sqlite").symlink_to(elsewhere / "ledger.sqlite")
    elsewhere.mkdir(mode=0o755)
    with Ledger(SqliteStore(tmp_path / "ledger.sqlite"), clock=clock) as ledger:
        ledger.submit(content("p-1"), SENDER)
        assert copy_store(ledger, SqliteStore(tmp_path / "copy.sqlite")).finished
    made = [elsewhere / "ledger.sqlite", elsewhere / "new" / "copy.sqlite"]
    assert {f.name: _mode(f) for f in made} == {f.name: 0o600 for f in made}
    assert _mode(elsewhere / "new") == 0o700 and _mode(elsewhere) == 0o755


def test_a_store_path_that_is_a_fifo_or_a_link_to_one_is_refused_without_blocking(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A named pipe where the store should be, or a symlink to one (a link put where a
    store on another disk was meant to go): refused naming store.url, at once. Before, the
    open waited in `open()` for a writer that never comes: a daemon's start, a `submit`
    and an `admin copy-store --to` hung for good."""
    pipe = tmp_path / "pipe.sqlite"
    os.mkfifo(pipe)
    link = tmp_path / "link.sqlite"
    link.symlink_to(pipe)

    def open_store(path: Path, said: list[BaseException]) -> None:
        try:
            with Ledger(SqliteStore(path), clock=clock):
                pass
        except BaseException as exc:
            said.append(exc)

    for path in (pipe, link):
        said: list[BaseException] = []
        opening = threading.Thread(target=open_store, args=(path, said))
        opening.start()
        opening.join(5)
        blocked = opening.is_alive()
        if blocked:  # the writer it waits for, with bytes no store begins with, ends it
            writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(writer, b"no SQLite header here")
            os.close(writer)
            opening.join(10)
        assert not blocked, path
        assert [str(exc) for exc in said] == [
            f"store.url: sqlite:{path} is a named pipe (FIFO), not a SQLite file"
        ]
        assert stat.S_ISFIFO(os.stat(pipe).st_mode)  # left as it was


def test_a_copy_destination_that_cannot_be_a_store_is_refused_naming_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`admin copy-store --to` a named pipe, a folder or a path in /proc: the refusal
    begins with `--to`, as one of its URL does. Before, `store.url: sqlite:DEST is ...`,
    the config's setting, which names the source."""
    with Ledger(SqliteStore(tmp_path / "ledger.sqlite")):
        pass
    config = tmp_path / "sendledger.toml"
    config.write_text('[store]\nurl = "sqlite:///ledger.sqlite"\n')
    os.mkfifo(tmp_path / "pipe.sqlite")
    (tmp_path / "a-folder").mkdir()
    for to, why in (
        (tmp_path / "pipe.sqlite", "is a named pipe (FIFO), not a SQLite file"),
        (tmp_path / "a-folder", "is a directory, not a SQLite file"),
        (Path("/proc/sendledger-test.sqlite"), ": cannot make /proc/sendledger-test.sqlite: "),
    ):
        argv = ["--config", str(config), "admin", "copy-store", "--to", f"sqlite:///{to}"]
        assert cli.main(argv) == 2
        said = capsys.readouterr().err
        assert said.startswith(f"sendledger: --to: store.url: sqlite:{to}"), said
        assert why in said, said


def test_a_store_path_that_is_a_socket_is_refused_naming_store_url(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A socket cannot be opened at all (ENXIO): the refusal then said nothing, and
    SQLite's "unable to open database file" reached the command as "unexpected failure",
    exit 1. It is told by its type, as a named pipe is."""
    path = tmp_path / "ledger.sqlite"
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))
        with pytest.raises(StoreUrlError) as refused:
            Ledger(SqliteStore(path), clock=clock)
    assert str(refused.value) == f"store.url: sqlite:{path} is a socket, not a SQLite file"


def test_a_store_path_whose_file_cannot_be_made_there_is_refused_naming_store_url(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A store path (or the target of its symlink) where no file can be made: in /proc,
    or under a folder there. One line naming store.url and what could not be made, exit
    2. Before, the creation's FileNotFoundError (the symlink's, since it is made at its
    target) reached the command as "unexpected failure", exit 1."""
    cases = {
        tmp_path / "in-proc.sqlite": Path("/proc/sendledger-test.sqlite"),
        tmp_path / "under-proc.sqlite": Path("/proc/sendledger-test/ledger.sqlite"),
    }
    for link, target in cases.items():
        link.symlink_to(target)
    direct = Path("/proc/sendledger-test.sqlite")
    for path, made in [*cases.items(), (direct, direct)]:
        first = made if made.parent.exists() else made.parent
        with pytest.raises(StoreUrlError) as refused:
            Ledger(SqliteStore(path), clock=clock)
        assert str(refused.value) == (
            f"store.url: sqlite:{path}: cannot make {first}: No such file or directory"
        )


def test_a_secret_file_others_can_read_gets_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    creds = tmp_path / "gmail-service-account.json"
    creds.write_text("{}")
    key_file = tmp_path / "store.key"
    key_file.write_text(new_key() + "\n")
    os.chmod(creds, 0o644)
    os.chmod(key_file, 0o600)
    settings = settings_from_dict(
        {
            "store": {"encryption_key_file": "store.key"},
            "providers": {"support": {"kind": "gmail", "credentials_file": creds.name}},
        },
        config_path=tmp_path / "sendledger.toml",
    )
    with caplog.at_level(logging.WARNING, logger="sendledger"):
        assert warn_exposed_secrets(settings) == [creds]
    assert str(creds) in caplog.text and "providers.support.credentials_file" in caplog.text
    assert str(key_file) not in caplog.text
    os.chmod(creds, 0o600)
    assert warn_exposed_secrets(settings) == []


# -- encryption at rest --------------------------------------------------------------------


def _secret_job(key: str) -> JobContent:
    return JobContent(
        channel="receipts",
        key=key,
        to=(f"Hidden <{SECRET_ADDRESS}>",),
        subject=SECRET_SUBJECT,
        body=SECRET_BODY,
    )


def _plain_secrets_in(data: bytes) -> list[str]:
    return [s for s in (SECRET_BODY, SECRET_SUBJECT, SECRET_ADDRESS) if s.encode() in data]


def test_an_encrypted_sqlite_store_holds_no_body_subject_or_address(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "ledger.sqlite"
    key = new_key()
    with Ledger(f"sqlite:///{path}", clock=clock, encryption_keys=[key]) as ledger:
        for i in range(20):
            ledger.submit(_secret_job(f"enc-{i}"), SENDER)
        ledger.update("enc-0", lambda j: j.claim(**attempt_args(clock)))
        # While open: the WAL holds the pages too.
        raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
        assert path.with_name("ledger.sqlite-wal").exists()
        assert _plain_secrets_in(raw) == []
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert _plain_secrets_in(raw) == []
    with Ledger(f"sqlite:///{path}", clock=clock, encryption_keys=[key]) as ledger:
        assert ledger.get_job("enc-3").content.body == SECRET_BODY

    # The control: without a key the same content is in the file in plain text.
    plain = tmp_path / "plain"
    with Ledger(f"sqlite:///{plain / 'ledger.sqlite'}", clock=clock) as ledger:
        ledger.submit(_secret_job("plain-1"), SENDER)
    assert _plain_secrets_in((plain / "ledger.sqlite").read_bytes()) != []


def test_an_encrypted_store_keeps_no_address_a_provider_quoted_in_its_index(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A provider's refusal quotes the recipient ("550 5.1.1 <alice@...>: user unknown"),
    and the job's reason is a column of the index: on an encrypted store it must not
    put the address in the file in plain text."""
    path = tmp_path / "ledger.sqlite"
    refusal = f"550 5.1.1 <{SECRET_ADDRESS}>: Recipient address rejected: User unknown"
    with Ledger(f"sqlite:///{path}", clock=clock, encryption_keys=[new_key()]) as ledger:
        ledger.submit(_secret_job("enc-r"), SENDER)
        ledger.update("enc-r", lambda j: j.claim(**attempt_args(clock)))
        ledger.update(
            "enc-r",
            lambda j: j.record_rejection(
                transient=True,
                reason=refusal,
                status=550,
                decision=RetryAt(SENDER.policy, clock() + timedelta(seconds=60)),
                at=clock(),
            ),
        )
        assert ledger.get_job("enc-r").reason == refusal  # the job still says it
        row = ledger.row("enc-r")
        assert row is not None and SECRET_ADDRESS not in (row.reason or "")
        # A reason of ours is kept as the review queue is filtered by it, even when the
        # subject is that very word.
        word = JobContent(
            channel="receipts", key="enc-d", to=("a@b.example",), subject="rejected", body="x"
        )
        ledger.submit(word, SENDER)
        ledger.update("enc-d", lambda j: j.claim(**attempt_args(clock)))
        ledger.update(
            "enc-d",
            lambda j: j.record_rejection(
                transient=False,
                reason="refused",
                status=550,
                decision=Review(SENDER.policy, EscalationReason.REJECTED),
                at=clock(),
            ),
        )
        row = ledger.row("enc-d")
        assert row is not None and row.reason == "rejected"
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert _plain_secrets_in(raw) == []


@pytest.mark.postgres
def test_an_encrypted_postgres_store_holds_no_body_subject_or_address(
    pg_url: str, clock: FakeClock
) -> None:
    import psycopg

    with Ledger(pg_url, clock=clock, encryption_keys=[new_key()]) as ledger:
        ledger.submit(_secret_job("enc-pg"), SENDER)
        schema = ledger.store.schema  # type: ignore[union-attr]
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        states = conn.execute(f'SELECT state FROM "{schema}".sendledger_events').fetchall()
        index = conn.execute(f'SELECT * FROM "{schema}".sendledger_jobs').fetchall()
    assert states and _plain_secrets_in(b"".join(bytes(s[0]) for s in states)) == []
    assert _plain_secrets_in(repr(index).encode()) == []


def test_key_rotation_reads_old_events_and_writes_with_the_new_key(
    tmp_path: Path, clock: FakeClock
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    old, new = new_key(), new_key()
    with Ledger(url, clock=clock, encryption_keys=[old]) as ledger:
        ledger.submit(_secret_job("rot-1"), SENDER)
    # Rotation: the new key first, the old one kept for what it wrote.
    with Ledger(url, clock=clock, encryption_keys=[new, old]) as ledger:
        assert ledger.get_job("rot-1").content.subject == SECRET_SUBJECT
        ledger.update("rot-1", lambda j: j.claim(**attempt_args(clock)))
    with Ledger(url, clock=clock, encryption_keys=[new]) as ledger:
        with pytest.raises(EventKeyMissing, match=r"store\.encryption_key_file"):
            ledger.get_job("rot-1")  # its Requested event needs the old key
        # The Attempted written after the rotation reads with the new key alone.
        (attempted,) = ledger.recorder.select_events(job_id_for("rot-1"), gt=1)
        assert type(ledger.mapper.to_domain_event(attempted)).__name__ == "Attempted"


def test_the_key_file_and_new_key_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["admin", "new-key"]) == 0
    key = capsys.readouterr().out.strip()
    key_file = tmp_path / "store.key"
    key_file.write_text(f"# rotated 2026-11\n{key}\n\n{new_key()}\n")
    config = {"store": {"encryption_key_file": "store.key"}}
    settings = settings_from_dict(config, config_path=tmp_path / "sendledger.toml")
    keys = encryption_keys(settings)
    assert len(keys) == 2 and keys[0] == key
    key_file.write_text("not-a-key\n")
    with pytest.raises(ConfigError, match=r"store\.encryption_key_file .* line 1: not a base64"):
        encryption_keys(settings)
    key_file.write_text("")
    with pytest.raises(ConfigError, match=r"store\.encryption_key_file .*: no key"):
        encryption_keys(settings)
    assert encryption_keys(settings_from_dict({}, config_path=tmp_path / "x.toml")) == []


# -- the daemon identity lock --------------------------------------------------------------


def test_one_live_holder_per_name(store_url: str) -> None:
    with Ledger(store_url) as first, Ledger(store_url) as second:
        held = first.hold_identity("host-a")
        with pytest.raises(IdentityTaken, match=r"daemon\.name 'host-a'"):
            second.hold_identity("host-a")
        other = second.hold_identity("host-b")  # another name is another daemon
        held.release()
        again = second.hold_identity("host-a")
        again.release()
        other.release()


def test_an_api_server_s_name_is_one_per_store_apart_from_the_daemon_s(store_url: str) -> None:
    # `sendledger api` holds its daemon.name under `api_lock_name` (docs/configuration.md
    # "Daemon names"): beside the daemon of its config, and alone among API servers.
    with Ledger(store_url) as first, Ledger(store_url) as second:
        daemon = first.hold_identity("host-a")
        api = second.hold_identity(api_lock_name("host-a"))
        with pytest.raises(IdentityTaken):
            first.hold_identity(api_lock_name("host-a"))
        api.release()
        daemon.release()


HOLDER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {src!r})
    from ledger.application import Ledger
    ledger = Ledger({url!r})
    lock = ledger.hold_identity("host-k")
    print("held", flush=True)
    time.sleep(60)
    """
)


def refused_while_held_free_once_killed(holder_url: str, url: str) -> None:
    """A process holds "host-k" on `holder_url`: a ledger on `url` is refused the name
    until the holder is killed -9, then takes it within 10 s (the lock goes with the dead
    process's files or session)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(src=str(SRC), url=holder_url)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with Ledger(url) as ledger:
            with pytest.raises(IdentityTaken):
                ledger.hold_identity("host-k")
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=10)
            deadline = time.monotonic() + 10
            while True:
                try:
                    ledger.hold_identity("host-k").release()
                    return
                except IdentityTaken:
                    assert time.monotonic() < deadline, "the name stayed locked"
                    time.sleep(0.05)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize(
    "store", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_killed_holder_does_not_keep_its_name(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'l.sqlite'}"
        if store == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    Ledger(url).close()  # the tables, before two processes race to create them
    refused_while_held_free_once_killed(url, url)


# -- a daemon's own claims at start-up ---------------------------------------------------


def test_a_restarted_daemon_recovers_its_own_claims_at_once_and_not_others() -> None:
    rig = EngineRig(policy("receipts"))
    try:
        for key, name in (("mine", "host-a"), ("theirs", "host-b"), ("old", "")):
            job = parse_job(
                {
                    "channel": "receipts",
                    "key": key,
                    "to": "a@example.com",
                    "subject": "s",
                    "body": "b",
                }
            )
            rig.ledger.submit(job, rig.policies.get("receipts").sender)  # type: ignore[union-attr]
            claim = partial(
                SendJob.claim,
                provider="fake",
                deadline=rig.clock() + timedelta(hours=1),
                at=rig.clock(),
                daemon=name,
            )
            rig.ledger.update(key, claim)
        engine = rig.new_engine()
        engine.daemon_name = "host-a"  # as bootstrap sets it from daemon.name
        try:
            report = engine.recover_own_claims()
        finally:
            engine.close()
        assert report.recovered == 1
        states = {k: rig.ledger.get_job(k).state for k in ("mine", "theirs", "old")}
        assert states == {
            "mine": JobState.UNKNOWN,
            "theirs": JobState.ATTEMPTED,
            "old": JobState.ATTEMPTED,
        }
        assert rig.ledger.get_job("theirs").claimed_by == "host-b"
    finally:
        rig.close()


def test_on_postgresql_a_restarted_daemon_takes_at_once_only_its_claims_past_their_deadline(
    pg_url: str,
) -> None:
    """The name's lock there can end under a live daemon still finishing a call: a claim
    whose deadline is ahead waits for it (tests/unit/test_recover_own_claims.py)."""
    with EngineRig(policy("receipts"), store=pg_url) as rig:
        for key, lease in (("lapsed", 10), ("ahead", 100)):
            rig.submit("receipts", key)
            claim = partial(
                SendJob.claim,
                provider="fake",
                deadline=rig.clock() + timedelta(seconds=lease),
                at=rig.clock(),
                daemon=DAEMON,
            )
            rig.ledger.update(key, claim)
        rig.clock.advance(50)
        identity = start_up(rig.service)
        assert identity is not None
        try:
            assert not identity.ends_only_with_holder
            assert rig.job("lapsed").state is JobState.UNKNOWN
            assert rig.job("lapsed").reason == OWN_REASON
            assert rig.job("ahead").state is JobState.ATTEMPTED
        finally:
            identity.release()
