"""A SQLite store on a file system mounted read-only (a snapshot, a read-only bind mount,
or a systemd unit whose `ProtectSystem=strict` leaves the store's folder out of
`ReadWritePaths=`): one line naming the mount, exit 1, from every command that writes.
Before, `os.access` answering "no" for the mount was taken for the file's mode:
`permission denied: user NAME may read but not write PATH`, sending the operator to
chmod a file whose mode was right; a new store's was `cannot open store ...: [Errno 30]`.

The mount needs root (CAP_SYS_ADMIN): elsewhere the test is skipped, and under CI=true,
where nothing may skip, it fails."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.conftest import skip_unless_ci
from tests.e2e.conftest import CliEnv

JOB = {"channel": "receipts", "key": "k-1", "to": "a@example.com", "subject": "s", "body": "b"}


@contextmanager
def mounted_read_only(folder: Path) -> Iterator[None]:
    """`folder` bind-mounted read-only over itself, unmounted afterwards."""
    root = str(folder)
    if subprocess.run(["mount", "--bind", root, root], capture_output=True).returncode:
        skip_unless_ci("a bind mount needs root (CAP_SYS_ADMIN)")
    try:
        remount = ["mount", "-o", "remount,bind,ro", root]
        if subprocess.run(remount, capture_output=True).returncode:
            skip_unless_ci("a read-only remount is not allowed here")
        yield
    finally:
        subprocess.run(["umount", root], check=True)


def _said_read_only(line: str, store: Path) -> None:
    assert line.startswith(f"sendledger: store sqlite:{store}: read-only file system: "), line
    assert f"{store.parent} is on a file system mounted read-only" in line, line
    assert "permission denied" not in line, line


def test_a_new_store_on_a_read_only_mount_names_the_mount(cli: CliEnv) -> None:
    with mounted_read_only(cli.root):
        result = cli.submit(JOB)
    assert result.code == 1, result.stderr
    [line] = result.error_lines
    _said_read_only(line, cli.root / "ledger.sqlite")


def test_a_store_on_a_read_only_mount_is_not_said_to_be_its_mode(cli: CliEnv) -> None:
    assert cli.submit(JOB).code == 0
    store = cli.root / "ledger.sqlite"
    mode = store.stat().st_mode
    with mounted_read_only(cli.root):
        again = cli.run("submit", "--json", "-", stdin=json.dumps({**JOB, "key": "k-2"}))
        assert again.code == 1, again.stderr
        [line] = again.error_lines
        _said_read_only(line, store)
        assert store.stat().st_mode == mode
    assert cli.run("status", "k-2").code == 4


@pytest.mark.parametrize("existing", [True, False], ids=["a store", "a new store"])
def test_a_store_linked_onto_a_read_only_mount_names_the_mount_s_folder(
    cli: CliEnv, existing: bool
) -> None:
    """The store path a symlink to another disk (a supported layout): the mount was
    looked for, and named, at the link's folder, which is writable. An existing store
    was said to be in the link's folder on a read-only mount (where a look finds none),
    a new one's refusal was no read-only line at all."""
    disk = cli.root / "disk"
    disk.mkdir()
    if existing:
        assert cli.submit(JOB).code == 0
        (cli.root / "ledger.sqlite").rename(disk / "ledger.sqlite")
    (cli.root / "ledger.sqlite").symlink_to(disk / "ledger.sqlite")
    with mounted_read_only(disk):
        result = cli.run("submit", "--json", "-", stdin=json.dumps({**JOB, "key": "k-2"}))
    assert result.code == 1, result.stderr
    [line] = result.error_lines
    assert line.startswith(f"sendledger: store sqlite:{cli.root / 'ledger.sqlite'}: "), line
    assert f"read-only file system: {disk} is on a file system mounted read-only" in line, line
