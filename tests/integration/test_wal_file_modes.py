"""SQLite's -wal and -shm files beside a store, made with the store file's mode
(docs/operations.md "Opening the store"): a read while the store file was 0400 leaves a
0400 -shm, and once the operator makes the file 0600 again every write failed naming that
-shm, which nothing repaired. An open now gives a -shm or -wal of this user's the store
file's mode, in one log line; one of another user's is still named in the store's
one-line refusal, exit 1.

Real SQLite files, modes set with os.chmod, the CLI as a process held to file modes
(as root, without the capabilities that ignore them: `tests/file_modes.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.file_modes import held_to_file_modes

CONFIG = """\
[store]
url = "sqlite:///ledger.sqlite"

[daemon]
policies_dir = "policies"

[providers.mail]
credentials_file = "absent.json"
user = "sender@example.com"
"""
POLICY = 'provider = "mail"\nfrom = "sender@example.com"\nmessage_id_domain = "example.com"\n'


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A config folder whose store holds one job and no -wal or -shm (as after the last
    process closed it)."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "receipts.toml").write_text(POLICY, encoding="utf-8")
    (tmp_path / "sendledger.toml").write_text(CONFIG, encoding="utf-8")
    assert _submit(tmp_path, "k-1").returncode == 0
    assert not list(tmp_path.glob("ledger.sqlite-*"))
    return tmp_path


def _cli(site: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    command = [sys.executable, "-m", "daemon", "--config", str(site / "sendledger.toml")]
    return subprocess.run(
        [*held_to_file_modes(), *command, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=site,
        env=env,
        timeout=60,
    )


def _submit(site: Path, key: str) -> subprocess.CompletedProcess[str]:
    job = {"channel": "receipts", "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
    return _cli(site, "submit", "--json", "-", stdin=json.dumps(job))


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _shm_left_by_a_read_only_open(site: Path) -> Path:
    store = site / "ledger.sqlite"
    store.chmod(0o400)
    read = _cli(site, "status", "k-1", "--json")
    assert read.returncode == 0 and json.loads(read.stdout)["state"] == "requested", read.stderr
    shm = site.resolve() / "ledger.sqlite-shm"  # beside the real file: SQLite resolves links
    assert shm.exists() and _mode(shm) == 0o400
    store.chmod(0o600)  # the operator puts the store file's mode back
    return shm


def test_a_shm_file_of_this_user_s_left_unwritable_is_given_the_store_file_s_mode(
    site: Path,
) -> None:
    """The write failed, `permission denied: ... may not write PATH-shm`, for good."""
    shm = _shm_left_by_a_read_only_open(site)
    written = _submit(site, "k-2")
    assert written.returncode == 0, written.stderr
    assert not shm.exists() or _mode(shm) == 0o600  # the last to close removes it
    said = written.stderr.splitlines()
    assert len(said) == 1, written.stderr  # one log line, naming the file and both modes
    assert f"store sqlite:{site / 'ledger.sqlite'}: " in said[0], said
    assert f"{shm} (was 0400)" in said[0] and "mode 0600" in said[0], said
    again = _submit(site, "k-3")  # nothing more to repair: nothing said
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_the_shm_of_a_store_reached_by_a_symlink_is_looked_for_beside_the_real_file(
    site: Path,
) -> None:
    """SQLite makes it beside the file a link names: looked for beside the link, it was
    not found, and the write failed."""
    (site / "link.sqlite").symlink_to("ledger.sqlite")
    config = CONFIG.replace("ledger.sqlite", "link.sqlite")
    (site / "sendledger.toml").write_text(config, encoding="utf-8")
    shm = _shm_left_by_a_read_only_open(site)
    written = _submit(site, "k-2")
    assert written.returncode == 0, written.stderr
    assert f"{shm} (was 0400)" in written.stderr, written.stderr


def test_wal_and_shm_files_of_another_user_s_are_named_and_left_as_they_are(site: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give the -shm file to another user")
    shm = _shm_left_by_a_read_only_open(site)
    beside = [shm, site / "ledger.sqlite-wal"]
    for each in beside:
        os.chown(each, 65534, 65534)  # nobody's, as a read by that user would leave them
    try:
        written = _submit(site, "k-2")
        assert written.returncode == 1, written.stderr
        said = written.stderr.splitlines()
        assert len(said) == 1, written.stderr
        assert said[0].startswith(f"sendledger: store sqlite:{site / 'ledger.sqlite'}: "), said
        assert f"may not write {beside[1]}, SQLite's wal file" in said[0], said  # the first
        assert all(_mode(each) == 0o400 and each.stat().st_uid == 65534 for each in beside)
    finally:
        for each in beside:
            os.chown(each, 0, 0)
