"""A PostgreSQL server's refusal of a connection, told by its SQLSTATE and given its fix
(`ledger.stores.pg_refusals`), on private PostgreSQL 15 clusters: what the server says
for each cause of a refused password, and a server whose `lc_messages` is German."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import pq
from tests.conftest import IN_CI
from tests.integration.test_store_unavailable import (
    _args,
    _hba_reloaded,
    _private_store,
    _refused_at_open,
)
from tests.pg_cluster import BIN, USER, PrivateCluster, require_private_cluster

from ledger.stores.pg_refusals import NO_PASSWORD_FIX, PASSWORD_FIX, ROLE_FIX
from ledger.stores.postgres import connect_at_open
from ledger.stores.url import PostgresStore

#: The pg_hba.conf of these clusters: the test's superuser trusted, every other role
#: asked a password by SCRAM.
SCRAM_HBA = (
    f"local all all trust\nhost all {USER} 127.0.0.1/32 trust\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
)


def _roles(pg: PrivateCluster) -> None:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE ROLE scrammy LOGIN PASSWORD 'right-one'")
        conn.execute("CREATE ROLE nopass LOGIN")
        conn.execute("CREATE ROLE cannot PASSWORD 'right-one'")  # no LOGIN
        conn.execute("SET password_encryption = 'md5'")
        conn.execute("CREATE ROLE hashed LOGIN PASSWORD 'right-one'")


def test_each_cause_of_a_refused_password_is_named_with_where_to_tell_them_apart() -> None:
    """A wrong password, a role without one, no role of that name and a password stored
    as md5 under a scram-sha-256 line: the server says the same to the client (28P01,
    "password authentication failed"), and the cause only in its log's DETAIL line. The
    line names each and says where to look. Before, each said 'fix the user or password
    in store.url', wrong for three of them; a missing password and a role that may not
    log in said that too, and now say their own fix."""
    require_private_cluster()
    with PrivateCluster() as pg:
        _roles(pg)
        wrong = _private_store(pg, "scrammy", "wrong-one")
        _hba_reloaded(pg, SCRAM_HBA, wrong, "wrong-one")
        causes = {
            "scrammy": ("wrong-one", 'Connection matched pg_hba.conf line 3: "host all all'),
            "nopass": ("right-one", 'User "nopass" has no password assigned.'),
            "nosuch": ("right-one", 'Role "nosuch" does not exist.'),
            "hashed": ("right-one", 'User "hashed" does not have a valid SCRAM secret.'),
        }
        for user, (password, detail) in causes.items():
            logged = pg.log.stat().st_size
            spec = _private_store(pg, user, password)
            _refused_at_open(spec, f'authentication failed for user "{user}"); {PASSWORD_FIX}')
            assert detail in _log_since(pg.log, logged, detail), (user, detail)
        _refused_at_open(
            _private_store(pg, "scrammy", ""), f"no password supplied); {NO_PASSWORD_FIX}"
        )
        _refused_at_open(
            _private_store(pg, "cannot", "right-one"),
            f'role "cannot" is not permitted to log in); {ROLE_FIX}',
        )


def _log_since(log: Path, offset: int, wanted: str) -> str:
    """The server's log from `offset` once it holds `wanted` (it writes a moment after it
    answers), or as it is after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        with log.open(encoding="utf-8", errors="replace") as file:
            file.seek(offset)
            text = file.read()
        if wanted in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


#: A locale other than English whose translations PostgreSQL 15 ships.
GERMAN = "de_DE.UTF-8"


def _require_locale(name: str) -> None:
    """Skip when the system lacks the locale (`make test` makes it as root, with the
    test packages); under CI=true a skip is a failure."""
    listed = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    wanted = name.lower().replace("utf-8", "utf8")
    if wanted in {line.strip().lower() for line in listed.stdout.splitlines()}:
        return
    reason = f"no {name} locale here (localedef -i de_DE -f UTF-8 {name} as root)"
    if IN_CI:
        pytest.fail(f"CI is set, the locale tests must run: {reason}")
    pytest.skip(reason)


def test_a_server_speaking_german_is_told_by_its_codes() -> None:
    """`lc_messages` German: the server's words are German, its codes the same. A refused
    password and a missing pg_hba.conf line get their fixes (the address read from the
    server's »...« quotes). Before, they were recognized by English words only: no fix."""
    require_private_cluster()
    _require_locale(GERMAN)
    if pq.version() < 180000:  # docs/operations.md "Opening the store"
        reason = f"libpq {pq.version()} traces no answer before the password is taken"
        if IN_CI:
            pytest.fail(f"CI is set, the locale tests must run: {reason}")
        pytest.skip(reason)
    with _german_cluster() as pg:
        wrong = _private_store(pg, "scrammy", "wrong-one")
        _hba_reloaded(pg, SCRAM_HBA, wrong, "wrong-one")
        _refused_at_open(
            wrong,
            f"Passwort-Authentifizierung für Benutzer »scrammy« fehlgeschlagen); {PASSWORD_FIX}",
        )
        outsider = _private_store(pg, "outsider", "x")
        _hba_reloaded(
            pg, f"local all all trust\nhost all {USER} 127.0.0.1/32 trust\n", outsider, "x"
        )
        _refused_at_open(
            outsider,
            "kein pg_hba.conf-Eintrag für Host »127.0.0.1«, Benutzer »outsider«, Datenbank "
            "»postgres«, keine Verschlüsselung); the server's pg_hba.conf needs the line 'host "
            "postgres outsider 127.0.0.1/32 scram-sha-256' (above any line",
        )


def test_a_german_server_with_no_free_slot_is_waited_for_at_a_start() -> None:
    """A role at its CONNECTION LIMIT (53300, »zu viele Verbindungen von Rolle«): a
    service's start waits until a slot frees, as for an English server. Before, the
    German words were not recognized and the start ended at once."""
    require_private_cluster()
    _require_locale(GERMAN)
    with _german_cluster() as pg:
        right = _private_store(pg, "scrammy", "right-one")
        (pg.data / "pg_hba.conf").write_text(SCRAM_HBA)
        pg._run(BIN / "pg_ctl", "-D", pg.data, "reload")
        with _connected(right) as held:  # the role's one slot
            freed = threading.Timer(1.5, held.close)
            freed.start()
            started = time.monotonic()
            try:
                starting = dataclasses.replace(right, start_wait=20, connect_timeout=2)
                connect_at_open(starting).close()
            finally:
                freed.join()
        assert 1.0 < time.monotonic() - started < 10, "not waited for the slot"


@contextmanager
def _german_cluster() -> Iterator[PrivateCluster]:
    """A private cluster speaking German, with `_roles`; scrammy may hold one session."""
    with PrivateCluster() as pg:
        _roles(pg)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("ALTER ROLE scrammy CONNECTION LIMIT 1")
            conn.execute(f"ALTER SYSTEM SET lc_messages = '{GERMAN}'")
            conn.execute("SELECT pg_reload_conf()")
        yield pg


def _connected(spec: PostgresStore) -> psycopg.Connection[tuple[object, ...]]:
    """A connection as `spec`, once the server lets it in (a reload is asynchronous)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return psycopg.connect(**_args(spec), password=spec.password)
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "pg_hba.conf not reloaded"
            time.sleep(0.1)


def test_a_running_pool_refused_after_a_pg_hba_reload_says_the_open_s_line() -> None:
    """The operator edits pg_hba.conf and reloads while the daemon runs: its pool's new
    connections are refused. A store call then fails with the line an open gives, the
    pg_hba.conf line to add included, and /healthz says it, and so does the check of the
    daemon's name, whose session was ended too; before, the pool's "couldn't get a
    connection after 2.00 sec" and the driver's bare words, the line only at the next
    start."""
    from daemon.api.health import HealthSources, check_health
    from ledger.application import Ledger
    from ledger.stores.causes import StoreUnavailable
    from ledger.vocabulary import JobState
    from policies.loader import PolicySet

    require_private_cluster()
    with PrivateCluster() as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE outsider LOGIN PASSWORD 'hba-secret'")
            conn.execute("GRANT CREATE ON SCHEMA public TO outsider")
        spec = dataclasses.replace(_private_store(pg, "outsider", "hba-secret"), connect_timeout=2)
        (pg.data / "pg_hba.conf").write_text(SCRAM_HBA)
        pg._run(BIN / "pg_ctl", "-D", pg.data, "reload")
        _connected(spec).close()
        with Ledger(spec) as ledger:
            sources = HealthSources(ledger, lambda: PolicySet({}), lambda: None, [])
            assert check_health(sources)[0]
            name = ledger.hold_identity("refused")  # a session of its own, between ticks
            trusted_only = f"local all all trust\nhost all {USER} 127.0.0.1/32 trust\n"
            _hba_reloaded(pg, trusted_only, spec, "hba-secret")
            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = 'outsider'"
                )
            said: list[str] = []
            for _ in range(3):  # a pooled connection found dead first, maybe
                try:
                    ledger.counts([JobState.REVIEW])
                except StoreUnavailable as exc:
                    said.append(str(exc))
                    break
                except Exception as exc:  # the session the server ended
                    said.append(f"{type(exc).__name__}: {exc}")
            healthy, reasons, _checks = check_health(sources)
            with pytest.raises(StoreUnavailable) as name_check:
                name.check()
            name.release()
        with pytest.raises(StoreUnavailable) as at_open:
            Ledger(spec)
    line = str(at_open.value)
    assert "needs the line 'host postgres outsider 127.0.0.1/32 scram-sha-256'" in line, line
    assert said[-1] == line == str(name_check.value), said
    assert not healthy and reasons == [f"store unreachable: StoreUnavailable: {line}"], reasons
