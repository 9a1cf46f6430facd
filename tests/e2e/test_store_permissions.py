"""A SQLite store this user may not read or write (docs/cli.md "Exit codes"): the file's or
its folder's mode, as when the daemon runs as a service user and the store was made by
root or another user. One line, `store sqlite:PATH: permission denied: ...`, naming the
path, exit 1, from every door: no traceback, no "unexpected failure", no "no store at"
(exit 2) for a file that is there.

As root file modes stop nothing, so the commands run without root's two capabilities
that ignore them (`setpriv`, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH): root is then held
to the owner's bits of its own files, as any user is to theirs."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import Result, sendledger_command
from tests.file_modes import held_to_file_modes

from ledger.application import Ledger
from testkit.credentials import write_service_account

JOB = {"channel": "receipts", "key": "k-1", "to": "a@example.com", "subject": "s", "body": "b"}


def _run(cli: Any, *args: str, stdin: str = "") -> Result:
    proc = subprocess.run(
        [*held_to_file_modes(), *sendledger_command(), "--config", str(cli.config), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cli.root,
        env=cli.env,
        timeout=60,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _submit(cli: Any, key: str) -> Result:
    return _run(cli, "submit", "--json", "-", stdin=json.dumps({**JOB, "key": key}))


def _denied(result: Result, store: Path, *words: str) -> None:
    assert result.code == 1, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    line = result.error_lines[0]
    assert line.startswith(f"sendledger: store sqlite:{store}: permission denied: "), line
    assert all(word in line for word in words), line


@pytest.fixture
def store(cli: Any) -> Iterator[Path]:
    """A store with one job, made by this user; its modes are put back afterwards so that
    the test's folder can be removed."""
    path = cli.root / "ledger.sqlite"
    assert cli.submit(JOB).code == 0
    try:
        yield path
    finally:
        cli.root.chmod(0o755)
        for each in cli.root.glob("ledger.sqlite*"):
            each.chmod(0o600)


def test_a_store_file_this_user_may_not_write(cli: Any, store: Path) -> None:
    """Reads still answer; a write names the file and says permission denied (it said
    "read-only: it can be read but not written here", which did not say what to fix)."""
    store.chmod(0o400)
    status = _run(cli, "status", "k-1", "--json")
    assert status.code == 0 and json.loads(status.stdout)["state"] == "requested", status.stderr
    _denied(_submit(cli, "k-2"), store, f"may read but not write {store}")


def test_a_store_file_this_user_may_not_read(cli: Any, store: Path) -> None:
    """`status` said "no store at ...; `sendledger submit` creates it" (exit 2) and
    `submit` "cannot open store ...: unable to open database file"."""
    store.chmod(0o000)
    _denied(_run(cli, "status", "k-1"), store, f"may not read {store}")
    _denied(_submit(cli, "k-2"), store, f"may not read {store}")


def test_a_store_folder_this_user_may_not_write(cli: Any, store: Path) -> None:
    """SQLite writes its -wal and -shm files beside the store: a folder the user may not
    write keeps every write out (it said "read-only: it can be read but not written
    here"). A read answers, or says the same."""
    for extra in cli.root.glob("ledger.sqlite-*"):
        extra.unlink()  # as after the last process closed the store
    cli.root.chmod(0o555)
    _denied(_submit(cli, "k-2"), store, f"may not create files in {cli.root}")
    status = _run(cli, "status", "k-1", "--json")
    assert status.code == 0 or "permission denied" in status.stderr, status.stderr


@pytest.mark.parametrize("where", ["new.sqlite", "sub/new.sqlite"])
def test_a_new_store_in_a_folder_this_user_may_not_write(cli: Any, where: str) -> None:
    """It said "cannot open store sqlite:///new.sqlite: [Errno 13] Permission denied:
    '...'", not in the store's one-line form."""
    cli.write_config(f"sqlite:///{where}")
    cli.root.chmod(0o555)
    try:
        _denied(_submit(cli, "k-1"), cli.root / where, f"may not create files in {cli.root}")
    finally:
        cli.root.chmod(0o755)
    assert not (cli.root / where).exists()


def test_a_daemon_whose_store_file_it_may_not_write_stops_with_one_line(
    cli: Any, store: Path
) -> None:
    """The daemon's name lock opens the store file for writing: "unexpected failure:
    PermissionError: [Errno 13] Permission denied: ..." at start-up."""
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:9/token")
    store.chmod(0o400)
    _denied(_run(cli, "run"), store, f"may read but not write {store}")


def test_a_daemon_name_lock_another_user_left_is_named_in_one_line(cli: Any, store: Path) -> None:
    """A daemon run once as root leaves its name's lock file beside the store, root's and
    0600: the service user's daemon then stopped with "unexpected failure:
    PermissionError: [Errno 13] Permission denied: '...daemon-....lock'". Held to file
    modes, a lock file without write permission is another user's as far as this one
    goes."""
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:9/token")
    with Ledger(f"sqlite:///{store}") as ledger:
        ledger.hold_identity(socket.gethostname()).release()
    [lock] = store.parent.glob(f"{store.name}.daemon-*.lock")
    lock.chmod(0o400)
    _denied(_run(cli, "run"), store, f"may not write {lock}, the lock of a daemon.name")


def test_a_store_folder_this_user_may_not_write_is_named_beside_a_daemon_s_lock(
    cli: Any, store: Path
) -> None:
    """Every store a daemon ran on keeps its name's lock file beside it, the daemon
    user's and 0600: a command of another user refused for the folder (no -wal to be
    made) was told to chown the daemon's lock to itself, which would keep the daemon out.
    The folder is named, as without the lock."""
    with Ledger(f"sqlite:///{store}") as ledger:
        ledger.hold_identity(socket.gethostname()).release()
    [lock] = store.parent.glob(f"{store.name}.daemon-*.lock")
    lock.chmod(0o400)
    for extra in cli.root.glob("ledger.sqlite-*"):
        extra.unlink()  # as after the last process closed the store
    cli.root.chmod(0o555)
    _denied(_submit(cli, "k-2"), store, f"may not create files in {cli.root}")


def test_a_store_folder_this_user_may_not_enter(cli: Any) -> None:
    inner = cli.root / "inner"
    inner.mkdir(mode=0o700)
    cli.write_config("sqlite:///inner/ledger.sqlite")
    assert cli.submit(JOB).code == 0
    inner.chmod(0o600)  # no x: nothing in it can be reached
    try:
        for result in (_run(cli, "status", "k-1"), _submit(cli, "k-2")):
            _denied(result, inner / "ledger.sqlite", f"may not enter {inner}")
    finally:
        inner.chmod(0o700)
