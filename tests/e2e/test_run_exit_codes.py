"""`sendledger run`'s exit code for each way its start is refused, as a process: a config
it can never start with is exit 2, which the systemd units do not restart; a secret file
that is not there (yet) is exit 1, which they restart, and the start after the file is put
there runs (docs/cli.md "Exit codes"; the units' keys: tests/unit/test_unit_restarts.py).
Each command is forked from the worker's fork server (tests/e2e/fork_server.py): its own
process, environment, stderr and exit code, as the console script's; the mount-namespace
test runs the console script itself inside `unshare`."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from tests.e2e.conftest import forked_sendledger
from tests.e2e.daemon_kit import SENDLEDGER

from testkit.credentials import write_service_account
from testkit.mailservers import free_port

KEY = "gmail-service-account.json"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    done = forked_sendledger("init", str(site), "--emulator")
    assert done.returncode == 0, done.stderr
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8").replace("127.0.0.1:8025", f"127.0.0.1:{free_port()}")
    config.write_text(text, encoding="utf-8")
    return site


def _run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    return forked_sendledger("--config", str(site / "sendledger.toml"), "run", *args, env=env)


def _one_line(done: subprocess.CompletedProcess[str], starts: str) -> None:
    assert done.stderr.startswith(f"sendledger: {starts}"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_secret_file_not_there_yet_is_exit_1_and_the_start_after_it_runs(
    tmp_path: Path,
) -> None:
    site = _site(tmp_path)
    missing = _run(site, "--once")
    assert missing.returncode == 1, missing.stderr
    _one_line(missing, "providers.gmail.credentials_file: cannot read ")
    assert "No such file or directory" in missing.stderr
    # A mount's link whose target is not there yet is the same case.
    (site / KEY).symlink_to(site / "secrets" / KEY)
    dangling = _run(site, "--once")
    assert dangling.returncode == 1, dangling.stderr
    _one_line(dangling, "providers.gmail.credentials_file: cannot read ")
    (site / "secrets").mkdir()
    write_service_account(site / "secrets" / KEY, token_uri="http://127.0.0.1:8026/token")
    later = _run(site, "--once")
    assert later.returncode == 0, later.stderr


def test_a_store_key_or_an_api_token_file_not_there_is_exit_1(tmp_path: Path) -> None:
    site = _site(tmp_path)
    write_service_account(site / KEY, token_uri="http://127.0.0.1:8026/token")
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace('token_file = "api-tokens"', 'token_file = "late/api-tokens"'))
    tokens = _run(site)  # the API is served by `run`, not by a one-shot run
    assert tokens.returncode == 1, tokens.stderr
    assert "api.token_file: cannot read " in tokens.stderr, tokens.stderr
    assert tokens.stderr.count("\n") == 1, tokens.stderr
    keyed = text.replace(
        'url = "sqlite:///ledger.sqlite"',
        'url = "sqlite:///other.sqlite"\nencryption_key_file = "late/store-key"',
    )
    config.write_text(keyed, encoding="utf-8")
    key = _run(site, "--once")
    assert key.returncode == 1, key.stderr
    _one_line(key, "store.encryption_key_file: cannot read ")


def test_a_config_it_can_never_start_with_is_exit_2(tmp_path: Path) -> None:
    site = _site(tmp_path)
    (site / KEY).write_text("{}\n", encoding="utf-8")  # there, and no key
    (site / KEY).chmod(0o600)
    not_a_key = _run(site, "--once")
    assert not_a_key.returncode == 2, not_a_key.stderr
    _one_line(not_a_key, "providers.gmail.credentials_file: ")
    write_service_account(site / KEY, token_uri="http://127.0.0.1:8026/token")
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("[daemon]\n", '[daemon]\ntick = "fast"\n'), encoding="utf-8")
    bad = _run(site, "--once")
    assert bad.returncode == 2, bad.stderr
    assert "daemon.tick" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_an_api_address_in_use_or_not_up_yet_is_exit_1(tmp_path: Path) -> None:
    """A port its last holder has not given back, an address whose interface is not up
    yet at boot: both may be free at the next start, which the unit makes on exit 1."""
    site = _site(tmp_path)
    write_service_account(site / KEY, token_uri="http://127.0.0.1:8026/token")
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        in_use = re.sub(r'listen = "[^"]*"', f'listen = "127.0.0.1:{port}"', text)
        config.write_text(in_use, encoding="utf-8")
        busy = _run(site)
    assert busy.returncode == 1, busy.stderr
    assert "api.listen: 127.0.0.1:" in busy.stderr and "is in use" in busy.stderr, busy.stderr
    assert busy.stderr.count("\n") == 1, busy.stderr
    # TEST-NET-1 (RFC 5737): never an address of this machine.
    absent = re.sub(r'listen = "[^"]*"', f'listen = "192.0.2.1:{free_port()}"', text)
    config.write_text(absent, encoding="utf-8")
    not_up = _run(site)
    assert not_up.returncode == 1, not_up.stderr
    assert "is not an address of this machine" in not_up.stderr, not_up.stderr


def test_a_store_folder_linked_to_a_mount_not_up_yet_is_exit_1_and_the_start_after_runs(
    tmp_path: Path,
) -> None:
    """The store's folder a link to a disk not mounted yet: exit 2 ("cannot make ...: No
    such file or directory") was never started again, and once the disk was there the
    daemon refused itself, exit 3: both paths reach one lock file, locked twice."""
    site = _site(tmp_path)
    write_service_account(site / KEY, token_uri="http://127.0.0.1:8026/token")
    mount = tmp_path / "mnt" / "data"
    (site / "data").symlink_to(mount)
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("sqlite:///ledger.sqlite", "sqlite:///data/ledger.sqlite"))
    not_up = _run(site, "--once")
    assert not_up.returncode == 1, not_up.stderr
    _one_line(not_up, f"{config}: store.url: sqlite:{site / 'data' / 'ledger.sqlite'}: ")
    assert f"{site / 'data'} is a symbolic link to {mount}, which is not there" in not_up.stderr
    assert not mount.exists()  # nothing made under the mount point
    mount.mkdir(parents=True)
    up = _run(site, "--once")
    assert up.returncode == 0, up.stderr
    assert (mount / "ledger.sqlite").exists()


def _private_mounts() -> bool:
    """Whether this user may make a mount namespace of its own (`unshare`), where a
    bind mount over /etc/fstab and a tmpfs on a temp folder touch nothing outside."""
    if shutil.which("unshare") is None:
        return False
    tried = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "true"], capture_output=True, timeout=30
    )
    return tried.returncode == 0


def test_a_store_folder_whose_disk_is_not_mounted_is_exit_1_and_nothing_is_made_there(
    tmp_path: Path,
) -> None:
    """In a mount namespace of the test's own, /etc/fstab names a temp folder as the
    store's disk: `run`, `submit` and `init` into it before the mount are exit 1, one
    line, and make nothing in the folder beneath; once a file system is mounted there
    `run` makes the store on it (docs/operations.md "A store on a disk of its own")."""
    if not _private_mounts():
        pytest.skip("no mount namespace for this user (unshare --mount --map-root-user)")
    site = _site(tmp_path)
    write_service_account(site / KEY, token_uri="http://127.0.0.1:8026/token")
    point = tmp_path / "mnt" / "data"
    point.mkdir(parents=True)
    store = point / "sendledger" / "ledger.sqlite"
    config = site / "sendledger.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("sqlite:///ledger.sqlite", f"sqlite:///{store}"))
    fstab = tmp_path / "fstab"
    fstab.write_text(f"LABEL=data {point} ext4 defaults,nofail 0 2\n", encoding="utf-8")
    said = tmp_path / "said"
    said.mkdir()
    cli = f"{SENDLEDGER} --config {config}"
    script = f"""
mount --bind {fstab} /etc/fstab
{cli} run --once 2>{said}/run; echo $? >{said}/run.code
{cli} submit {site / "first-job.json"} 2>{said}/submit; echo $? >{said}/submit.code
{SENDLEDGER} init {point / "site"} --emulator 2>{said}/init; echo $? >{said}/init.code
mount -t tmpfs data {point}
{cli} run --once 2>{said}/mounted; echo $? >{said}/mounted.code
ls {store.parent} >{said}/on-the-disk
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    done = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for command in ("run", "submit"):
        line = (said / command).read_text(encoding="utf-8")
        assert (said / f"{command}.code").read_text() == "1\n", line
        assert line.startswith(f"sendledger: store sqlite:{store}: not mounted: {point} is a ")
        assert "(/etc/fstab)" in line and line.count("\n") == 1, line
    init = (said / "init").read_text(encoding="utf-8")
    assert (said / "init.code").read_text() == "1\n", init
    assert init == (
        f"sendledger: DIR: {point / 'site'} is on {point}, a mount point (/etc/fstab) with no "
        "file system mounted on it: mount it first; nothing was written\n"
    )
    mounted = (said / "mounted").read_text(encoding="utf-8")
    assert (said / "mounted.code").read_text() == "0\n", mounted
    assert "ledger.sqlite" in (said / "on-the-disk").read_text().split()
    assert list(point.iterdir()) == []  # the folder beneath the mount: nothing made
