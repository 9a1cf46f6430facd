"""A store that cannot be written says so in one line naming it (docs/cli.md "Exit codes"):
a full disk, simulated by SQLite's page limit (a real full disk gives the same
SQLITE_FULL)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import PG_URL

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.causes import StoreUnavailable
from ledger.stores.index import INDEX_TABLE
from ledger.stores.private_api import CachingConnectionPool
from ledger.stores.url import PostgresStore, parse_store_url
from ledger.vocabulary import PolicyRef

SENDER = Sender(
    from_addr="Support <support@example.com>",
    message_id_domain="mail.example.com",
    policy=PolicyRef("receipts", "0123456789abcdef"),
)


def claim_now() -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"provider": "support", "deadline": now + timedelta(seconds=30), "at": now}


def job(key: str, body: str = "Thanks") -> JobContent:
    return JobContent(
        channel="receipts", key=key, to=("alice@example.com",), subject="Receipt", body=body
    )


def pg_spec(pg_url: str, lock_timeout: int) -> PostgresStore:
    """The test's PostgreSQL store with its lock waits bounded by `lock_timeout`."""
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    return dataclasses.replace(spec, lock_timeout=lock_timeout)


def test_a_full_disk_is_named_with_the_store_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "full.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        ledger.submit(job("k-1"), SENDER)
    made = CachingConnectionPool._create_connection

    def no_room(pool: CachingConnectionPool) -> Any:
        # As a disk with no free block: the file may not grow by one page.
        connection = made(pool)
        raw = connection._sqlite_conn
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.execute(f"PRAGMA max_page_count = {pages}")
        return connection

    monkeypatch.setattr(CachingConnectionPool, "_create_connection", no_room)
    with Ledger(f"sqlite:///{path}") as ledger:
        with pytest.raises(StoreUnavailable) as refused:
            ledger.submit(job("k-2", body="x" * 200_000), SENDER)
        assert str(refused.value) == (
            f"store sqlite:{path}: disk full: nothing more can be written "
            "(database or disk is full)"
        )
        assert ledger.find_job("k-2") is None
        assert ledger.find_job("k-1") is not None


def test_a_write_lock_never_released_is_waited_for_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the store's write lock and never lets go: the write gives up
    after `Ledger.store_wait` in all, not after 20 busy waits (10 minutes by default)."""
    from ledger.stores import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 1)  # 30 s a wait by default
    monkeypatch.setattr(Ledger, "store_wait", 2.0)  # 60 s by default
    path = tmp_path / "held.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        ledger.submit(job("k-1"), SENDER)
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the write lock, held
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as refused:
                ledger.submit(job("k-2"), SENDER)
            waited = time.monotonic() - started
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert str(refused.value).startswith(f"store sqlite:{path}: locked: ")
        # The busy waits that began within store_wait, each 1 s: not 20 of them.
        assert 2.0 <= waited < 6.0, waited
        assert ledger.find_job("k-2") is None


def test_a_postgres_row_lock_never_released_is_waited_for_a_bounded_time(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: another session holds the job's index row; each try of the write waits
    `[store] lock_timeout` (55P03) and the ledger stops trying after `store_wait`. The
    insert tried its own ten times inside each of the ledger's 20: 17 minutes at 5 s."""
    import psycopg

    monkeypatch.setattr(Ledger, "store_wait", 2.0)  # 60 s by default
    spec = pg_spec(pg_url, lock_timeout=1)
    with Ledger(spec) as ledger:
        ledger.submit(job("k-1"), SENDER)
        with psycopg.connect(PG_URL) as holder:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE',
                ("k-1",),
            )
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as refused:
                ledger.update("k-1", lambda j: j.claim(**claim_now()))
            waited = time.monotonic() - started
            holder.rollback()
        assert str(refused.value).startswith(f"store {spec.describe()}: locked: ")
        # Lock waits of 1 s begun within the 2 s: not ten of them a try.
        assert 2.0 <= waited < 6.0, waited
        assert ledger.get_job("k-1").state == "requested"


def test_a_write_waiting_for_a_held_row_holds_up_no_other_jobs_write(pg_url: str) -> None:
    """PostgreSQL: another session holds one job's index row, and a write of that job waits
    for it (`[store] lock_timeout`, here 20 s). It waits before its turn at the index's
    stamps (`SqlJobIndex._lock_rows`), not holding that turn: a write of any other job goes
    through at once, where it waited behind it for the whole lock_timeout of each try."""
    import threading

    import psycopg

    spec = pg_spec(pg_url, lock_timeout=20)
    with Ledger(spec) as ledger:
        ledger.submit(job("k-1"), SENDER)
        ledger.submit(job("k-2"), SENDER)
        with psycopg.connect(PG_URL) as holder:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE',
                ("k-1",),
            )
            stuck = threading.Thread(
                target=ledger.update, args=("k-1", lambda j: j.claim(**claim_now()))
            )
            stuck.start()
            time.sleep(0.5)  # k-1's write waits for its row
            started = time.monotonic()
            ledger.update("k-2", lambda j: j.claim(**claim_now()))
            waited = time.monotonic() - started
            assert ledger.get_job("k-1").state == "requested"
            holder.rollback()
            stuck.join(10)
        assert waited < 3.0, waited
        assert not stuck.is_alive()
        assert ledger.get_job("k-1").state == "attempted"
        assert ledger.get_job("k-2").state == "attempted"


def test_opening_a_store_locked_for_good_gives_up_in_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the file exclusively (no reader either) and never lets go:
    opening gives up after about `store_wait` too, naming the store, where it asked
    whether the tables exist (30 s) and then created them again ten times over."""
    from ledger.stores import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 1)
    monkeypatch.setattr(Ledger, "store_wait", 2.0)
    path = tmp_path / "held.sqlite"
    Ledger(f"sqlite:///{path}").close()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            Ledger(f"sqlite:///{path}")
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(refused.value).startswith(f"store sqlite:{path}: locked: ")
    assert waited < 8.0, waited


def test_the_api_answers_503_naming_the_store_and_logs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under `POST /v1/jobs`: 503 with the one line, and the line in the log
    (an operator reads the log, not the client's answer); it was a 500 "internal error
    (logged)" with SQLite's traceback."""
    from tests.integration.api_kit import job as api_job
    from tests.integration.api_kit import running_api, write_config

    path = tmp_path / "full.sqlite"
    settings = write_config(tmp_path, f"sqlite:///{path}")
    Ledger(f"sqlite:///{path}").close()
    made = CachingConnectionPool._create_connection

    def no_room(pool: CachingConnectionPool) -> Any:
        connection = made(pool)
        raw = connection._sqlite_conn
        raw.execute(f"PRAGMA max_page_count = {raw.execute('PRAGMA page_count').fetchone()[0]}")
        return connection

    monkeypatch.setattr(CachingConnectionPool, "_create_connection", no_room)
    with running_api(settings) as api, caplog.at_level("ERROR", logger="sendledger.api"):
        answer = api.client.post("/v1/jobs", json=api_job(body="x" * 200_000), headers=api.auth())
    line = f"store sqlite:{path}: disk full: nothing more can be written (database or disk is full)"
    assert answer.status_code == 503, answer.text
    assert answer.json() == {"error": line}
    # The API's own errors only: another test in the same process may have left the
    # loggers at INFO ("Started server process", "API listening on ...").
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "sendledger.api" and r.levelno >= logging.ERROR
    ]
    assert logged == [f"POST /v1/jobs: {line}"]


def test_an_upgrade_behind_a_long_transaction_gives_up_at_lock_timeout(pg_url: str) -> None:
    """A store of an earlier release lacks an index column: the first process of this one
    adds it (ALTER TABLE, an exclusive lock). Behind a long transaction (a pg_dump, an
    open psql session) the ALTER waited with no limit, and every reader and writer of
    the daemons queued behind it; it gives up at `[store] lock_timeout`, naming the
    store, and the next open adds the column."""
    import threading

    import psycopg

    spec = pg_spec(pg_url, lock_timeout=1)
    with Ledger(spec) as ledger:
        ledger.submit(job("k-1"), SENDER)
    table = f'"{spec.schema}".{INDEX_TABLE}'
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN review_since")  # as a v1 store
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            Ledger(spec).close()
            outcome.append(None)
        except Exception as exc:  # what the open ends with
            outcome.append(exc)

    with psycopg.connect(PG_URL) as holder:
        holder.execute(f"SELECT 1 FROM {table} LIMIT 1")  # ACCESS SHARE, till rollback
        opener = threading.Thread(target=open_it, daemon=True)
        started = time.monotonic()
        opener.start()
        opener.join(timeout=10)
        waited = time.monotonic() - started
        holder.rollback()
    opener.join(timeout=10)
    assert waited < 8.0, "the upgrade still waited behind the transaction"
    assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable), outcome
    assert str(outcome[0]).startswith(f"store {spec.describe()}: locked: "), outcome[0]
    assert "lock timeout" in str(outcome[0]), outcome[0]
    Ledger(spec).close()  # nothing in the way now: the column is added
    with Ledger(spec) as ledger:
        assert ledger.get_job("k-1").key == "k-1"


def test_healthz_fails_while_the_store_cannot_be_written_and_recovers_after_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store can be read but a write does not fit (a full disk): `/healthz` read one
    index query and said `store ok`, 200, while every claim the engine saved failed. It
    reports the store failing from the failed write until a write succeeds again."""
    from tests.integration.api_kit import running_api, write_config

    path = tmp_path / "full.sqlite"
    settings = write_config(tmp_path, f"sqlite:///{path}")
    Ledger(f"sqlite:///{path}").close()
    made = CachingConnectionPool._create_connection

    def little_room(pool: CachingConnectionPool) -> Any:
        # Room for a small job, none for a big one.
        connection = made(pool)
        raw = connection._sqlite_conn
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.execute(f"PRAGMA max_page_count = {pages + 16}")
        return connection

    monkeypatch.setattr(CachingConnectionPool, "_create_connection", little_room)
    with running_api(settings) as api:
        assert api.client.get("/healthz").status_code == 200
        with pytest.raises(StoreUnavailable) as refused:  # as an engine worker's save
            api.ledger.submit(job("k-big", body="x" * 200_000), SENDER)
        health = api.client.get("/healthz", headers=api.auth())
        assert health.status_code == 503, health.text
        store = health.json()["checks"]["store"]
        assert store["ok"] is False
        assert store["write_error"] == str(refused.value)
        assert health.json()["reasons"] == [f"store cannot be written: {refused.value}"]
        assert api.client.get("/healthz").json()["checks"]["store"] is False
        api.ledger.submit(job("k-small"), SENDER)  # a write succeeds: the store is back
        health = api.client.get("/healthz", headers=api.auth())
        assert health.status_code == 200, health.text
        assert health.json()["checks"]["store"]["ok"] is True


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _refused_at_open(spec: PostgresStore, why: str) -> list[float]:
    """Both doors that open a store (`Ledger`, and `store_exists` for the read-only
    commands) say in one line the store, host:port, and what the driver said; never the
    password. The seconds each door took."""
    from ledger.stores import store_exists

    took = []
    for door in (lambda: Ledger(spec).close(), lambda: store_exists(spec)):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            door()
        took.append(time.monotonic() - started)
        said = str(refused.value)
        assert said.startswith(f"store {spec.describe()}: cannot connect (connection "), said
        assert why in said and "\n" not in said, said
        assert spec.password == "" or spec.password not in said, said
    return took


def test_an_unreachable_postgres_at_open_names_host_port_and_the_driver_s_cause() -> None:
    """It said only "couldn't get a connection after 10.00 sec" (the pool's timeout),
    after 10 s: neither where nor why. Connections are still tried for connect_timeout
    (a server starting up answers meanwhile), then the last refusal is the line."""
    port = _closed_port()
    spec = PostgresStore(
        dbname="db", host="127.0.0.1", port=port, user="u", password="s3cret", connect_timeout=2
    )
    took = _refused_at_open(spec, f'"127.0.0.1", port {port} failed: Connection refused')
    assert 2 * 2.0 <= sum(took) < 2 * 2.0 + 4.0, took  # two doors, each tried for 2 s


#: A `store.connect_timeout` that a refusal by the server must not wait out: each door
#: answers in less than half of it (it waited all of it, then said the same line).
LONG_CONNECT_TIMEOUT = 20


@pytest.mark.postgres
def test_a_missing_database_at_open_is_named_at_once_with_the_driver_s_words(
    tmp_path: Path,
) -> None:
    from tests.conftest import require_postgres

    require_postgres()
    spec = parse_store_url(PG_URL)
    assert isinstance(spec, PostgresStore)
    missing = dataclasses.replace(
        spec, dbname="sendledger_no_such_db", connect_timeout=LONG_CONNECT_TIMEOUT
    )
    said = 'database "sendledger_no_such_db" does not exist'
    took = _refused_at_open(missing, said)
    assert all(seconds < LONG_CONNECT_TIMEOUT / 2 for seconds in took), took
    # The command line: exit 1, the one line, as soon.
    config = tmp_path / "sendledger.toml"
    url = PG_URL.rsplit("/", 1)[0] + "/sendledger_no_such_db"
    config.write_text(
        f'[store]\nurl = "{url}"\nconnect_timeout = "{LONG_CONNECT_TIMEOUT}s"\n', encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    started = time.monotonic()
    status = subprocess.run(
        [sys.executable, "-m", "daemon", "--config", str(config), "status", "k-1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert time.monotonic() - started < LONG_CONNECT_TIMEOUT / 2
    assert status.returncode == 1, status.stderr
    assert status.stderr.startswith(f"sendledger: store {missing.describe()}: cannot connect (")
    assert said in status.stderr and status.stderr.count("\n") == 1, status.stderr


@pytest.mark.postgres
def test_a_role_the_server_does_not_know_names_store_url() -> None:
    """The driver's words name the role, not the setting that gave it: the line ends
    with the setting to fix (a missing database does not: its words say which)."""
    from tests.conftest import require_postgres

    require_postgres()
    spec = parse_store_url(PG_URL)
    assert isinstance(spec, PostgresStore)
    nobody = dataclasses.replace(
        spec, user="sendledger_no_such_role", connect_timeout=LONG_CONNECT_TIMEOUT
    )
    _refused_at_open(
        nobody,
        'role "sendledger_no_such_role" does not exist); fix the user in store.url, or let '
        "that role log in on the server (CREATE ROLE ... LOGIN, or ALTER ROLE ... LOGIN)",
    )


def test_a_wrong_password_at_open_is_named_at_once_and_never_shown() -> None:
    """A private cluster that asks one role for its password (the session's trusts
    every loopback connection)."""
    import psycopg
    from tests.pg_cluster import PrivateCluster, require_private_cluster

    require_private_cluster()
    with PrivateCluster() as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE secretive LOGIN PASSWORD 'right-one'")
            conn.execute("GRANT CREATE ON SCHEMA public TO secretive")
        hba = pg.data / "pg_hba.conf"
        spec = _private_store(pg, "secretive", "wrong-one")
        # Refused once the server asks for the password.
        _hba_reloaded(
            pg, "host all secretive 127.0.0.1/32 scram-sha-256\n" + hba.read_text(), spec, None
        )
        took = _refused_at_open(
            spec,
            'password authentication failed for user "secretive"); fix the password in '
            "store.url; a right one is refused too when",
        )
        assert all(seconds < LONG_CONNECT_TIMEOUT / 2 for seconds in took), took
        right = dataclasses.replace(spec, password="right-one")
        Ledger(right).close()  # the right one opens it


def test_a_refusal_by_pg_hba_names_the_line_the_server_needs() -> None:
    """A private cluster whose pg_hba.conf has no line for one role and rejects another:
    each refusal ends with the line to add for the URL's database and user from the
    address the server saw, at once, and never the password. Before, the driver's words
    alone, naming no setting and no line."""
    import psycopg
    from tests.pg_cluster import USER, PrivateCluster, require_private_cluster

    require_private_cluster()
    with PrivateCluster() as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE outsider LOGIN PASSWORD 'hba-secret'")
            conn.execute("CREATE ROLE \"all\" LOGIN PASSWORD 'hba-secret'")
        outsider = _private_store(pg, "outsider", "hba-secret")
        hba = f"local all all trust\nhost all {USER} 127.0.0.1/32 trust\n"
        _hba_reloaded(pg, hba + 'host all "all" 127.0.0.1/32 reject\n', outsider, "hba-secret")
        took = _refused_at_open(
            outsider,
            'no pg_hba.conf entry for host "127.0.0.1", user "outsider", database '
            "\"postgres\", no encryption); the server's pg_hba.conf needs the line 'host "
            "postgres outsider 127.0.0.1/32 scram-sha-256' (above any line that rejects it), "
            "then SELECT pg_reload_conf() as a superuser",
        )
        assert all(seconds < LONG_CONNECT_TIMEOUT / 2 for seconds in took), took
        keyword = dataclasses.replace(outsider, user="all")
        _refused_at_open(
            keyword,
            'pg_hba.conf rejects connection for host "127.0.0.1", user "all", database '
            "\"postgres\", no encryption); the server's pg_hba.conf needs the line 'host "
            'postgres "all" 127.0.0.1/32 scram-sha-256\' (above any line that rejects it)',
        )


def test_a_refusal_by_pg_hba_over_a_unix_socket_names_a_local_line() -> None:
    """Over a Unix socket the server names the host "[local]", which only a `local` line
    matches. Before, the line named was 'host postgres outsider [local]/32 ...', which
    pg_hba.conf cannot read (an address) and which would not match if it could."""
    import psycopg
    from tests.pg_cluster import USER, PrivateCluster, require_private_cluster

    require_private_cluster()
    with PrivateCluster() as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE outsider LOGIN PASSWORD 'hba-secret'")
        outsider = dataclasses.replace(
            _private_store(pg, "outsider", "hba-secret"), host=str(pg.root)
        )
        hba = f"local all {USER} trust\nhost all {USER} 127.0.0.1/32 trust\n"
        _hba_reloaded(pg, hba, outsider, "hba-secret")
        _refused_at_open(
            outsider,
            'no pg_hba.conf entry for host "[local]", user "outsider", database '
            "\"postgres\", no encryption); the server's pg_hba.conf needs the line 'local "
            "postgres outsider scram-sha-256' (above any line that rejects it), "
            "then SELECT pg_reload_conf() as a superuser",
        )


def test_a_role_whose_password_is_stored_as_md5_is_told_its_line_asks_md5() -> None:
    """The hint's line asks scram-sha-256, which a role whose password was stored as an
    md5 hash fails once the line is in ("password authentication failed": the password
    in store.url is right, the method is not). The hint says md5 goes there for such a
    role, and an md5 line opens it. Before, the hint did not say so."""
    import psycopg
    from tests.pg_cluster import BIN, USER, PrivateCluster, require_private_cluster

    require_private_cluster()
    with PrivateCluster() as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'md5'")
            conn.execute("CREATE ROLE hashed LOGIN PASSWORD 'md5-secret'")
            conn.execute("GRANT CREATE ON SCHEMA public TO hashed")
        hashed = _private_store(pg, "hashed", "md5-secret")
        trusted = f"local all all trust\nhost all {USER} 127.0.0.1/32 trust\n"
        _hba_reloaded(pg, trusted, hashed, "md5-secret")
        _refused_at_open(
            hashed,
            "'host postgres hashed 127.0.0.1/32 scram-sha-256' (above any line that rejects "
            "it), then SELECT pg_reload_conf() as a superuser (md5 in place of "
            "scram-sha-256 for a role whose password is stored as md5)",
        )
        # Each line in turn, until the server says what it says with it (a reload is
        # asynchronous): the hinted one refuses the password, md5 lets it in.
        for method, said in (("scram-sha-256", "password authentication failed"), ("md5", None)):
            (pg.data / "pg_hba.conf").write_text(
                f"{trusted}host postgres hashed 127.0.0.1/32 {method}\n"
            )
            pg._run(BIN / "pg_ctl", "-D", pg.data, "reload")
            deadline = time.monotonic() + 10
            while not _says(_refusal(hashed), said):
                assert time.monotonic() < deadline, (method, _refusal(hashed))
                time.sleep(0.1)
            if said is not None:
                _refused_at_open(hashed, f'{said} for user "hashed"); fix the password in')
        Ledger(hashed).close()


def _says(got: str | None, said: str | None) -> bool:
    return got is None if said is None else got is not None and said in got


def _refusal(spec: PostgresStore) -> str | None:
    """What the server says to `spec` with its password, None when it lets it in."""
    import psycopg

    try:
        psycopg.connect(**{**_args(spec), "password": spec.password}).close()
    except psycopg.OperationalError as exc:
        return str(exc)
    return None


def test_a_pg_hba_hint_for_a_name_with_a_line_break_stays_one_line() -> None:
    """A role named with a line break (`store.url`'s user `a%0Ab`) is one no pg_hba.conf
    line can name: the hint says so, in the error's one line. Before, it quoted the name,
    line break and all: a line pg_hba.conf cannot read, and an error of two lines."""
    from ledger.stores.pg_refusals import hba_fix

    store = PostgresStore(
        dbname="postgres", host="127.0.0.1", port=5432, user="a\nb", password="s3cret"
    )
    said = (
        'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "a\nb", '
        'database "postgres", no encryption'
    )
    hint = hba_fix(store, said)
    assert "\n" not in hint and "no pg_hba.conf line can name this user" in hint, hint
    assert "s3cret" not in hint and hba_fix(store, "password authentication failed") == ""


def _private_store(pg: Any, user: str, password: str) -> PostgresStore:
    return PostgresStore(
        dbname="postgres",
        host="127.0.0.1",
        port=pg.port,
        user=user,
        password=password,
        connect_timeout=LONG_CONNECT_TIMEOUT,
    )


def _hba_reloaded(pg: Any, hba: str, spec: PostgresStore, password: str | None) -> None:
    """`hba` as the private cluster's pg_hba.conf, once the server refuses `spec` with
    `password` (the reload is asynchronous)."""
    import psycopg
    from tests.pg_cluster import BIN

    (pg.data / "pg_hba.conf").write_text(hba)
    pg._run(BIN / "pg_ctl", "-D", pg.data, "reload")
    deadline = time.monotonic() + 10
    while True:
        try:
            psycopg.connect(**{**_args(spec), "password": password}).close()
        except psycopg.OperationalError:
            return
        assert time.monotonic() < deadline, "pg_hba.conf not reloaded"
        time.sleep(0.1)


def _args(spec: PostgresStore) -> dict[str, Any]:
    return {"dbname": spec.dbname, "host": spec.host, "port": spec.port, "user": spec.user}
