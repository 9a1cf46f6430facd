"""`sendledger init`: what it writes runs. The daemon is started on the files init wrote
(after the edits a user makes: the credentials and, here, the Gmail emulator's endpoints)
and one job goes to `confirmed`; the written unit passes `systemd-analyze verify`; an
existing file is never overwritten."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from tests.conftest import IN_CI
from tests.e2e.daemon_kit import SENDLEDGER, Rig, shared_fork_server

from daemon.config.settings import load_settings
from ledger.application import Ledger
from testkit.credentials import write_service_account
from testkit.mailservers import free_port

WRITTEN = (
    "sendledger.toml",
    "policies/receipts.toml",
    "policies/notices.toml",
    "api-tokens",
    "first-job.json",
    "sendledger.service",
)


def init(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`sendledger init ARGS` in `cwd`, forked from the worker's fork server
    (tests/e2e/fork_server.py): its own process, stdout, stderr and exit code, as the
    console script's (what init prints names the console script either way: it is found
    beside sys.executable). The lines it prints run as printed, in processes of their own."""
    code, out, err = shared_fork_server().call(["init", *args], cwd, "", os.environ, timeout=60)
    return subprocess.CompletedProcess([SENDLEDGER, "init", *args], code, out, err)


def test_init_writes_a_site_the_daemon_runs_on_and_a_job_is_confirmed(tmp_path: Path) -> None:
    with Rig(tmp_path / "emulator") as rig:
        site = tmp_path / "site"
        done = init(str(site), "--mailbox", "shop@shop.example", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        for name in WRITTEN:
            assert (site / name).is_file(), name
        commands = [line.strip() for line in done.stdout.splitlines() if SENDLEDGER in line]
        assert [c.split()[3] for c in commands] == ["run", "submit", "status"], done.stdout

        # What a user edits: the credentials (here the emulator's), the endpoints of the
        # emulator, and a free port for the API (8025 may be taken on a shared machine).
        write_service_account(site / "gmail-service-account.json", token_uri=rig.emulator.token_uri)
        config = site / "sendledger.toml"
        port = free_port()
        text = config.read_text(encoding="utf-8")
        text = text.replace('listen = "127.0.0.1:8025"', f'listen = "127.0.0.1:{port}"')
        text = text.replace(
            '[providers.gmail]\nkind = "gmail"\n',
            '[providers.gmail]\nkind = "gmail"\n'
            f'api_endpoint = "{rig.emulator.url}"\ntoken_uri = "{rig.emulator.token_uri}"\n',
        )
        config.write_text(text, encoding="utf-8")
        rig.dir, rig.config = site, config  # the rig's CLI, daemon and ledger now use init's

        rig.start_daemon()
        rig.cli("submit", str(site / "first-job.json"))
        rig.wait_state("first-job-1", "confirmed")
        assert rig.copies("first-job-1") == 1

        # The token file init wrote opens the API.
        token = (site / "api-tokens").read_text(encoding="utf-8").strip().split(":", 1)[1]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/jobs/first-job-1",
            headers={"Authorization": f"Bearer {token}"},
        )
        rig.wait_for(lambda: _answers(request), "the API to answer")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["state"] == "confirmed"


def _answers(request: urllib.request.Request) -> bool:
    try:
        with urllib.request.urlopen(request, timeout=2):
            return True
    except OSError:
        return False


def test_the_token_file_is_private_and_the_config_loads(tmp_path: Path) -> None:
    done = init(str(tmp_path / "site"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    tokens = tmp_path / "site" / "api-tokens"
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    name, token = tokens.read_text(encoding="utf-8").strip().split(":")
    assert name == "admin" and len(token) >= 32
    settings = load_settings(tmp_path / "site" / "sendledger.toml")
    assert settings.providers["gmail"].kind == "gmail"
    assert "support@example.com" in done.stdout  # the placeholder is pointed out


def test_smtp_imap_config_loads_and_graph_is_the_documented_template(tmp_path: Path) -> None:
    smtp = init(str(tmp_path / "smtp"), "--provider", "smtp-imap", cwd=tmp_path)
    assert smtp.returncode == 0, smtp.stderr
    settings = load_settings(tmp_path / "smtp" / "sendledger.toml")
    assert settings.providers["mail"].kind == "smtp-imap"

    graph = init(str(tmp_path / "graph"), "--provider", "graph", cwd=tmp_path)
    assert graph.returncode == 0, graph.stderr
    with (tmp_path / "graph" / "sendledger.toml").open("rb") as handle:
        section = tomllib.load(handle)["providers"]["m365"]
    assert section["kind"] == "graph"
    assert {"tenant_id", "client_id", "client_secret_file", "user"} <= set(section)
    with (tmp_path / "graph" / "policies" / "receipts.toml").open("rb") as handle:
        assert tomllib.load(handle)["provider"] == "m365"


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "policies").mkdir(parents=True)
    (site / "policies" / "notices.toml").write_text("# mine\n", encoding="utf-8")
    done = init(str(site), cwd=tmp_path)
    assert done.returncode == 2
    assert "policies/notices.toml" in done.stderr and len(done.stderr.splitlines()) == 1
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*")) == [
        "policies",
        "policies/notices.toml",
    ]
    assert (site / "policies" / "notices.toml").read_text(encoding="utf-8") == "# mine\n"


@pytest.mark.parametrize("mailbox", ["not an address", "Shop <shop@shop.example>"])
def test_a_bad_mailbox_is_refused_naming_the_option(tmp_path: Path, mailbox: str) -> None:
    done = init(str(tmp_path / "site"), "--mailbox", mailbox, cwd=tmp_path)
    assert done.returncode == 2 and "--mailbox" in done.stderr
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").iterdir())


def test_the_written_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        # `make test` installs the systemd package as root (TEST_PACKAGES).
        if IN_CI:
            pytest.fail("CI is set, this test must run: systemd-analyze is not installed")
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    site = tmp_path / "site with space"
    done = init(str(site), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    unit = site / "sendledger.service"
    text = unit.read_text(encoding="utf-8")
    assert f'ExecStart="{SENDLEDGER}"' not in text and f"ExecStart={SENDLEDGER} " in text
    assert f'--config "{site}/sendledger.toml" run' in text
    assert f"WorkingDirectory={site}\n" in text
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line for line in (result.stdout + result.stderr).splitlines() if "sendledger" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_a_write_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    from daemon.cli.init_command import Planned, write_all
    from daemon.exit_codes import CliError

    site = tmp_path / "new" / "site"
    plan = [
        Planned("sendledger.toml", "x\n", 0o644, ""),
        Planned("policies/deep/a.toml", "x\n", 0o644, ""),
        Planned("policies/" + "n" * 300, "x\n", 0o644, ""),  # ENAMETOOLONG
    ]
    with pytest.raises(CliError, match="cannot write"):
        write_all(site, plan)
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_a_folder_goes_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "policies").write_text("", encoding="utf-8")
    done = init(str(site), cwd=tmp_path)
    assert done.returncode == 2 and "not a folder" in done.stderr
    assert sorted(p.name for p in site.iterdir()) == ["policies"]


def test_init_emulator_writes_a_config_that_runs_against_the_emulator_unchanged(
    tmp_path: Path,
) -> None:
    """`init --emulator URL`, then the lines it prints, run as printed: the emulator
    (which writes the credentials the config names), the daemon, submit and status; the
    first job is confirmed. Only the API's port comes from the environment (8025 may be
    taken on a shared machine)."""
    site = tmp_path / "site"
    emulator_port = free_port()
    done = init(str(site), "--emulator", f"http://127.0.0.1:{emulator_port}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = [line.strip() for line in done.stdout.splitlines() if SENDLEDGER in line]
    emulator_line, run_line, submit_line, status_line = printed
    assert f"emulator gmail --port {emulator_port} " in emulator_line
    assert "EDIT" not in (site / "sendledger.toml").read_text(encoding="utf-8")
    env = {**os.environ, "SENDLEDGER_API__LISTEN": f"127.0.0.1:{free_port()}"}
    env = {k: v for k, v in env.items() if k != "SENDLEDGER_CONFIG"}
    # `exec`: the shell becomes the command, so the signals below reach it (a shell left
    # in between would die alone and leave the daemon running after the test).
    emulator = subprocess.Popen(
        "exec " + emulator_line, shell=True, stdout=subprocess.PIPE, text=True
    )
    daemon = None
    log = (tmp_path / "daemon.log").open("w")  # a pipe nobody reads fills and stalls it
    try:
        assert emulator.stdout is not None
        emulator.stdout.readline()  # it says where it listens once it does
        daemon = subprocess.Popen("exec " + run_line, shell=True, env=env, stderr=log, text=True)
        submitted = subprocess.run(submit_line, shell=True, capture_output=True, text=True, env=env)
        assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 60
        # Polled in this process (an interpreter every 0.5 s would take the daemon's CPU),
        # then the status line run as printed says it.
        with Ledger(f"sqlite:///{site / 'ledger.sqlite'}") as ledger:
            while (row := ledger.row("first-job-1")) is None or row.state != "confirmed":
                alive = daemon.poll() is None
                assert time.monotonic() < deadline and alive, (tmp_path / "daemon.log").read_text()
                time.sleep(0.5)
        shown = subprocess.run(status_line, shell=True, capture_output=True, text=True, env=env)
        assert re.search(r"^state\s+confirmed$", shown.stdout, re.M), shown.stdout + shown.stderr
    finally:
        for proc in (daemon, emulator):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        log.close()
    accepted = (site / "accepted.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(accepted) == 1  # one copy, counted where it happened


def test_a_user_corrected_alone_is_said_by_policy_check_and_the_daemon_s_start(
    tmp_path: Path,
) -> None:
    # README's quick start: edit the two EDIT lines of the config. A `user` corrected there
    # alone left both policies sending as the address init was given, and nothing said so.
    with Rig(tmp_path / "emulator") as rig:
        site = tmp_path / "site"
        assert init(str(site), "--mailbox", "shop@shop.example", cwd=tmp_path).returncode == 0
        write_service_account(site / "gmail-service-account.json", token_uri=rig.emulator.token_uri)
        config = site / "sendledger.toml"
        text = config.read_text(encoding="utf-8").replace(
            'user = "shop@shop.example"',
            f'user = "ops@shop.example"\napi_endpoint = "{rig.emulator.url}"\n'
            f'token_uri = "{rig.emulator.token_uri}"',
        )
        config.write_text(text, encoding="utf-8")
        said = [
            f"warning: channel '{channel}': from shop@shop.example is not providers.gmail.user "
            "(ops@shop.example), the mailbox it sends from: Gmail sends as that mailbox "
            "unless shop@shop.example is one of its send-as addresses"
            for channel in ("notices", "receipts")
        ]
        command = [SENDLEDGER, "--config", str(config)]
        checked = subprocess.run(
            [*command, "policy", "check"], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stderr
        lines = checked.stderr.splitlines()
        assert len(lines) == 2, lines
        assert all(s in line for s, line in zip(said, lines, strict=True)), lines
        once = subprocess.run(
            [*command, "run", "--once"], capture_output=True, text=True, timeout=60
        )
        assert once.returncode == 0, once.stderr
        for line in said:
            assert line.removeprefix("warning: ") in once.stderr, once.stderr

        # The same address in both: nothing said.
        config.write_text(text.replace("ops@shop.example", "shop@shop.example"), encoding="utf-8")
        checked = subprocess.run(
            [*command, "policy", "check"], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0 and checked.stderr == "", checked.stderr
