"""`sendledger submit` (the CLI, without the daemon) judged by the policies a running daemon
loaded, on SQLite and PostgreSQL (daemon/service_layer/loaded.py): a policy file added and
not reloaded is refused (exit 2, one line naming the channel, nothing written), one edited
and not reloaded is accepted with a warning, and after the reload both are as the folder
says. Before, `submit` read the folder alone: the added channel's job was accepted and the
daemon put it in review at once ("no policy for the channel").

A daemon killed -9 has loaded nothing from the moment its name is free (the lock the
operating system or the server drops with the process), not 60 s later when its heartbeat
runs out."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.engine.policy_holder import PolicyHolder
from daemon.from_settings import declare_server, load_policies, settings_for
from daemon.service_layer.loaded import announce_policies
from ledger.application import Ledger
from ledger.stores.identity import file_names_held, names_held
from ledger.stores.loaded_policies import DAEMON

POLICY = (
    'provider = "support"\nfrom = "Support <support@example.com>"\n'
    'message_id_domain = "mail.example.com"\non_unknown = "{on_unknown}"\n'
)


def submit(config: Path, tmp_path: Path, key: str, channel: str) -> int:
    job = {"channel": channel, "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps(job))
    return main(["--config", str(config), "submit", str(path)])


def folder(tmp_path: Path, store_url: str) -> tuple[Path, Path]:
    """The policy folder (`receipts` in it) and the config of a daemon on `store_url`."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "receipts.toml").write_text(POLICY.format(on_unknown="review"))
    (tmp_path / "sa.json").write_text("{}")
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n[daemon]\npolicies_dir = "policies"\n'
        '[providers.support]\ncredentials_file = "sa.json"\n'
    )
    return policies, config


def test_submit_judges_by_what_the_running_daemon_loaded(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    policies, config = folder(tmp_path, store_url)
    settings = settings_for(str(config))
    with Ledger(store_url) as ledger:
        holder = PolicyHolder(lambda: load_policies(settings))
        name = ledger.hold_identity("d1")  # as a running daemon does, before its row
        declare_server(ledger, (DAEMON, "d1"))  # this release's format, as its start does
        announcer = announce_policies(ledger, "d1", holder, DAEMON)
        try:
            # Added to the folder, not reloaded: refused, naming the channel.
            (policies / "invoices.toml").write_text(POLICY.format(on_unknown="review"))
            capsys.readouterr()
            assert submit(config, tmp_path, "k1", "invoices") == 2
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1, err
            assert "'invoices'" in err and "systemctl reload sendledger" in err
            assert ledger.find_job("k1") is None
            # Edited, not reloaded: accepted, with a warning on stderr.
            (policies / "receipts.toml").write_text(POLICY.format(on_unknown="retry"))
            assert submit(config, tmp_path, "k2", "receipts") == 0
            captured = capsys.readouterr()
            assert "created k2" in captured.out
            assert "warning" in captured.err and "'receipts'" in captured.err
            # Reloaded: the folder and the daemon agree again.
            assert holder.reload()  # the row is written before it returns
            assert "invoices" in _live_channels(ledger)
            assert submit(config, tmp_path, "k3", "invoices") == 0
            assert submit(config, tmp_path, "k4", "receipts") == 0
            assert capsys.readouterr().err == ""
        finally:
            announcer.stop()
            name.release()
    # No daemon running: the folder is all there is, as before.
    (policies / "letters.toml").write_text(POLICY.format(on_unknown="review"))
    assert submit(config, tmp_path, "k5", "letters") == 0


def _live_channels(ledger: Ledger) -> set[str]:
    rows = ledger.loaded_policies()
    now = rows.now()
    return {c for row in rows.live(time.time() if now is None else now) for c in row.fingerprints}


#: A daemon as far as the rows go: holds its name, writes its row, waits to be killed.
_DAEMON = """
import sys, time
from daemon.engine.policy_holder import PolicyHolder
from daemon.from_settings import declare_server, load_policies, settings_for
from daemon.service_layer.loaded import announce_policies
from ledger.application import Ledger
from ledger.stores.loaded_policies import DAEMON

settings = settings_for(sys.argv[1])
ledger = Ledger(sys.argv[2])
name = ledger.hold_identity("d1")  # kept: a lock collected is released
declare_server(ledger, (DAEMON, "d1"))  # this release's format, as its start declares it
announce_policies(ledger, "d1", PolicyHolder(lambda: load_policies(settings)), DAEMON)
print("running", flush=True)
time.sleep(120)
"""


def test_a_daemon_killed_stops_counting_once_its_name_is_free(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon that loaded `receipts` is killed -9 with `invoices` added to the folder:
    its row is left, heartbeat fresh, and `invoices` is taken at once, as with no daemon
    running. Before, it was refused naming the dead daemon for up to 60 s."""
    policies, config = folder(tmp_path, store_url)
    daemon = subprocess.Popen(
        [sys.executable, "-c", _DAEMON, str(config), store_url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "running\n"
        (policies / "invoices.toml").write_text(POLICY.format(on_unknown="review"))
        assert submit(config, tmp_path, "k1", "invoices") == 2  # it runs: refused
        capsys.readouterr()
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
        with Ledger(store_url) as ledger:
            rows = ledger.loaded_policies()
            now = rows.now()
            at = time.time() if now is None else now
            # Its row is still there, its heartbeat fresh: only its name is gone.
            assert rows._run(  # type: ignore[attr-defined]
                "SELECT count(*) FROM {t} WHERE seen_until > {p}", [at]
            ) == [(1,)]
            assert rows.live(at) == []
        assert submit(config, tmp_path, "k2", "invoices") == 0
        assert capsys.readouterr().err == ""
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        if daemon.stdout is not None:
            daemon.stdout.close()


_ASK_LOCK = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
request = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 1000, 1, 0) + bytes(8)
answer = fcntl.fcntl(fd, fcntl.F_GETLK, request)
print("held" if struct.unpack_from("@hhqqi", answer)[0] != fcntl.F_UNLCK else "free")
"""


@pytest.mark.parametrize("ask", ["file_names_held", "names_held"])
def test_asking_for_the_names_keeps_this_process_s_sqlite_locks(tmp_path: Path, ask: str) -> None:
    """SQLite keeps POSIX record locks on the store file, and closing any descriptor of
    the file drops them all. The question is asked through a descriptor kept open: before,
    it closed its own after each question, and the daemon's connections lost their shared
    lock at each `POST /v1/jobs` (another process's checkpoint then cut the WAL from under
    them: "disk I/O error", tests/e2e/test_daemon_stalls.py)."""
    store = tmp_path / "ledger.sqlite"
    store.write_bytes(b"\0" * 2048)
    mine = os.open(store, os.O_RDWR)
    try:
        fcntl.lockf(mine, fcntl.LOCK_SH, 1, 1000)  # as SQLite locks its bytes

        def seen_from_another_process() -> str:
            ask = [sys.executable, "-c", _ASK_LOCK, str(store)]
            return subprocess.run(ask, capture_output=True, text=True, check=True).stdout

        assert seen_from_another_process() == "held\n"
        for _ in range(2):
            if ask == "names_held":  # admin copy-store's question, any name
                assert not names_held(store)
            else:
                assert file_names_held(store, ["d1"]) == set()
        assert seen_from_another_process() == "held\n"
    finally:
        os.close(mine)


@pytest.mark.parametrize(
    "schema", ["public_like", "schéma_ü東"], ids=["ascii-schema", "non-ascii-schema"]
)
def test_the_held_name_is_found_whatever_its_letters(pg_url: str, schema: str) -> None:
    """On PostgreSQL the rows' names are looked up in pg_locks by the advisory key computed
    in SQL: it must be the key `AdvisoryIdentityLock` takes (in Python), for names and
    schemas beyond ASCII too, and whichever half of the key's bits is negative."""
    import psycopg

    from ledger.stores.loaded_policies import LoadedPolicies

    base = pg_url.split("?")[0]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{base}?schema={schema}"
    names = ["d1", "dæmon-ü", "東京-1", "a'b\"c\\", "naïve 😀"]
    try:
        with Ledger(url) as ledger:
            rows = ledger.loaded_policies()
            at = rows.now()
            assert at is not None
            for name in names:
                rows.write(LoadedPolicies(name, DAEMON, at, at + 60, {}))
            assert rows.live(at) == []  # no name held: no daemon counts
            locks = [ledger.hold_identity(name) for name in names]
            try:
                assert sorted(row.name for row in rows.live(at)) == sorted(names)
            finally:
                for lock in locks:
                    lock.release()
            assert rows.live(at) == []
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
