"""`sendledger admin backup FILE` and `admin copy-store --to URL` given paths an operator
can mistype, or a disk that fills (docs/operations.md "Backups", "Moving to PostgreSQL"):
the store's own -wal, -shm or -journal, a missing folder, a name too long, a file that
cannot be written to its end, a name with a line break. Each refusal is one line naming
the path; a backup leaves nothing, a copy an unfinished copy that nothing opens."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import IN_CI
from tests.e2e.conftest import sendledger_command
from tests.e2e.test_cli_copy_store import stored_jobs


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_neither_goes_into_the_stores_own_files(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 3)
    (cli.root / "here").symlink_to(".")
    before = _files(cli.root)
    for name in ("ledger.sqlite-wal", "ledger.sqlite-shm", "here/ledger.sqlite-journal"):
        suffix = name.rsplit(".sqlite", 1)[1]
        backup = cli.run("admin", "backup", name)
        assert backup.code == 2 and backup.error_lines == [
            f"sendledger: {name} is the store's own {suffix} file, which SQLite writes and "
            "removes: a backup goes elsewhere"
        ], backup.stderr
        # Before: exit 0, "copied 3 events", and the copy deleted as the store's -wal
        # when the source closed.
        copy = cli.run("admin", "copy-store", "--to", f"sqlite:///{name}")
        assert copy.code == 2 and copy.error_lines == [
            f"sendledger: --to names the configured store's own {suffix} file "
            f"(sqlite:{cli.root / name}), which SQLite writes and removes: a copy goes "
            "elsewhere"
        ], copy.stderr
        assert copy.stdout == backup.stdout == ""
    assert _files(cli.root) == before


def test_a_backup_where_no_file_can_be_made_is_one_line_and_makes_nothing(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 3)
    before = _files(cli.root)
    long_name = "b" * 300 + ".sqlite"
    for file, said in (
        ("no/such/folder/b.sqlite", "no/such/folder/b.sqlite: no/such/folder does not exist"),
        ("sendledger.toml/b.sqlite", "sendledger.toml/b.sqlite: sendledger.toml is not a folder"),
        (long_name, f"{long_name}: cannot be created (File name too long)"),
    ):
        refused = cli.run("admin", "backup", file)
        assert refused.code == 2 and refused.error_lines == [f"sendledger: {said}"], refused.stderr
    assert _files(cli.root) == before  # no folder made


def _with_small_files(cli: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`sendledger ARGS` whose files cannot grow past 100,000 bytes: a full disk for this
    process alone (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write fails with EFBIG)."""

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    return subprocess.run(
        [*sendledger_command(), "--config", str(cli.config), *args],
        capture_output=True,
        text=True,
        cwd=cli.root,
        env=cli.env,
        timeout=60,
        preexec_fn=small_files,
    )


def test_a_backup_that_cannot_be_written_to_its_end_is_removed(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 300)
    assert (cli.root / "ledger.sqlite").stat().st_size > 200_000
    before = _files(cli.root)
    ran = _with_small_files(cli, "admin", "backup", "b.sqlite")
    assert ran.returncode == 1 and ran.stderr.splitlines() == [
        f"sendledger: backup of sqlite:{cli.root / 'ledger.sqlite'} into b.sqlite failed "
        "(disk I/O error); b.sqlite was removed"
    ], ran.stderr
    assert _files(cli.root) == before


def test_a_copy_into_a_full_disk_is_one_line_naming_it_and_left_unfinished(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 300)
    ran = _with_small_files(cli, "admin", "copy-store", "--to", "sqlite:///copy.sqlite")
    copy = cli.root / "copy.sqlite"
    # Before: "unexpected failure: OperationalError: disk I/O error", naming no store.
    assert ran.returncode == 1 and ran.stderr.splitlines()[-1] == (
        f"sendledger: the copy into sqlite:{copy} stopped (disk I/O error): empty it and copy again"
    ), ran.stderr
    again = cli.run("admin", "copy-store", "--to", "sqlite:///copy.sqlite")
    assert again.code == 2 and "is an unfinished copy of" in again.stderr


def test_a_file_name_with_a_line_break_is_reported_on_one_line(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 1)
    made = cli.run("admin", "backup", "two\nlines.sqlite")
    assert made.code == 0 and (cli.root / "two\nlines.sqlite").is_file()
    (line,) = made.stdout.splitlines()
    assert line.startswith(
        f"backed up sqlite:{cli.root / 'ledger.sqlite'} to two\\x0alines.sqlite ("
    )


def test_a_tilde_in_a_store_url_is_refused_not_made_a_folder(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 1)
    before = _files(cli.root)
    # Before: exit 0, the copy in a folder named "~" beside the config.
    for url in ("sqlite:///~/copy.sqlite", "sqlite:///~ops/copy.sqlite"):
        refused = cli.run("admin", "copy-store", "--to", url)
        assert refused.code == 2 and refused.error_lines == [
            f"sendledger: --to: store.url: {url!r}: a '~' is not expanded in a URL: write the "
            "folder out (sqlite:////home/NAME/...)"
        ], refused.stderr
    cli.write_config("sqlite:///~/ledger.sqlite")
    status = cli.run("status", "r-00000")
    assert status.code == 2 and len(status.error_lines) == 1
    assert "a '~' is not expanded in a URL" in status.stderr
    assert _files(cli.root) == before


def _in_a_mount_namespace(cli: Any, bind: tuple[Path, Path], *args: str) -> Any:
    """`sendledger ARGS` in a mount namespace of its own in which `bind[1]` is the folder
    `bind[0]` mounted again (as root; the mount ends with the process)."""
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    command = [*sendledger_command(), "--config", str(cli.config), *args]
    return subprocess.run(
        [*unshare, *map(str, bind), *command],
        capture_output=True,
        text=True,
        cwd=cli.root,
        env=cli.env,
        timeout=60,
    )


def test_neither_goes_into_the_stores_own_files_through_a_second_mount(cli: Any) -> None:
    """The store's folder mounted a second time (a bind mount, an export mounted twice):
    no link to resolve, so the -wal named through it was another path. Before, `copy-store
    --to` it said "copied" and the copy went with the -wal at the store's close (exit 0,
    nothing there), and a backup became the -wal of the store's next open."""
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        reason = f"no mount namespace here (root and unshare(1) needed): {probe.stderr!r}"
        if IN_CI:
            pytest.fail(f"CI is set, nothing may skip: {reason}")
        pytest.skip(reason)
    store = cli.root / "store"
    again = cli.root / "again"
    store.mkdir()
    again.mkdir()
    stored_jobs(store / "ledger.sqlite", 3)
    cli.write_config("sqlite:///store/ledger.sqlite")
    # The -wal alone: the folder's identity is what is new, the same for every suffix.
    name = f"{again}/ledger.sqlite-wal"
    backup = _in_a_mount_namespace(cli, (store, again), "admin", "backup", name)
    assert backup.returncode == 2 and backup.stderr.splitlines() == [
        f"sendledger: {name} is the store's own -wal file, which SQLite writes and removes: "
        "a backup goes elsewhere"
    ], backup.stderr
    copy = _in_a_mount_namespace(
        cli, (store, again), "admin", "copy-store", "--to", f"sqlite:///{name}"
    )
    assert copy.returncode == 2 and copy.stderr.splitlines() == [
        f"sendledger: --to names the configured store's own -wal file (sqlite:{name}), which "
        "SQLite writes and removes: a copy goes elsewhere"
    ], copy.stderr
    assert _files(store) == {"ledger.sqlite"}
