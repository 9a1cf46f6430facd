"""`sendledger admin copy-store` and `admin backup` through the console script
(docs/operations.md "Moving to PostgreSQL", "Backups"; docs/cli.md): exit codes, a
destination that holds events refused with nothing written, a running daemon refused, a
Ctrl-C that leaves an unfinished copy no command opens, and a backup's refusals."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.e2e.daemon_kit import Rig, job

from ledger.application import Ledger
from ledger.content import parse_job
from ledger.vocabulary import PolicyRef, Sender

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "x"))


def stored_jobs(store: Path, count: int) -> None:
    with Ledger(f"sqlite:///{store}") as ledger:
        ledger.submit_many(
            [
                (
                    parse_job(
                        {
                            "channel": "receipts",
                            "key": f"r-{i:05d}",
                            "to": f"customer{i}@example.net",
                            "subject": f"Receipt {i}",
                            "body": "Thanks",
                        }
                    ),
                    SENDER,
                )
                for i in range(count)
            ]
        )


def events(store: Path) -> list[tuple[Any, ...]]:
    with Ledger(f"sqlite:///{store}", copying=True) as ledger:
        found = [
            (str(n.originator_id), n.originator_version, n.state)
            for n in ledger.log_after(0, 1 << 62, 1 << 20, ())
        ]
        return [*found, *sorted(c.check_id for c in ledger.recorder.key_checks())]  # type: ignore[attr-defined]


def test_a_copy_then_a_second_one_refused_with_nothing_written(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 30)
    done = cli.run("admin", "copy-store", "--to", "sqlite:///copy.sqlite", "--json")
    assert done.code == 0, done.stderr
    summary = done.json()
    assert summary["events"] == 30 and summary["aggregates"] == 30 and summary["jobs"] == 30
    assert summary["finished"] is True and summary["destination"].endswith("copy.sqlite")
    copy = cli.root / "copy.sqlite"
    with Ledger(f"sqlite:///{copy}") as ledger:
        assert ledger.get_job("r-00007").key == "r-00007"
    before = events(copy)
    again = cli.run("admin", "copy-store", "--to", "sqlite:///copy.sqlite")
    assert again.code == 3 and again.stdout == ""
    assert again.error_lines == [
        f"sendledger: sqlite:{copy} holds events (its last notification id is 30): a copy "
        "goes into an empty store only"
    ]
    assert events(copy) == before
    text = cli.run("admin", "copy-store", "--to", "sqlite:///text.sqlite")
    assert text.code == 0
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"copied 30 events from sqlite:{cli.root / 'ledger.sqlite'} to ")
    assert lines[1] == (
        "verified: each of the 30 aggregates has the same event count and last version on "
        "both sides, every event the same bytes in the same order"
    )


def test_a_destination_that_cannot_be_one_is_bad_input(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 1)
    for url, said in (
        ("memory://x", "--to: a memory:// store ends with this command"),
        ("sqlite:///ledger.sqlite", "--to names the configured store itself"),
        ("mysql://db", "--to: "),
    ):
        refused = cli.run("admin", "copy-store", "--to", url)
        assert refused.code == 2 and len(refused.error_lines) == 1, refused.stderr
        assert said in refused.stderr


def test_a_ctrl_c_leaves_an_unfinished_copy_that_nothing_opens(cli: Any, tmp_path: Path) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 10000)
    assert cli.server is not None
    err = tmp_path / "copy.err"
    argv = ["--config", str(cli.config), "admin", "copy-store", "--to", "sqlite:///copy.sqlite"]
    pid = cli.server.start(argv, cli.root, tmp_path / "copy.log", env=cli.env, stderr=str(err))
    deadline = time.monotonic() + 60
    while "events copied" not in _text(err) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGINT)
    code = cli.server.exited(pid, timeout=60)[0]
    last = _text(err).splitlines()[-1]
    assert code == 130, _text(err)
    assert last.startswith("sendledger: interrupted: ") and "of 10000 events copied" in last
    assert "marked an unfinished copy" in last
    (cli.root / "copy.toml").write_text(
        cli.config.read_text(encoding="utf-8").replace("ledger.sqlite", "copy.sqlite"),
        encoding="utf-8",
    )
    status = cli.run("--config", str(cli.root / "copy.toml"), "status", "r-00000", config=False)
    assert status.code == 2 and "is an unfinished copy of sqlite:" in status.stderr
    again = cli.run("admin", "copy-store", "--to", "sqlite:///copy.sqlite")
    assert again.code == 2 and again.error_lines == status.error_lines


def test_a_backup_and_its_refusals(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 3)
    made = cli.run("admin", "backup", "backup.sqlite", "--json")
    assert made.code == 0, made.stderr
    assert made.json()["bytes"] == (cli.root / "backup.sqlite").stat().st_size
    with Ledger(f"sqlite:///{cli.root / 'backup.sqlite'}") as ledger:
        assert ledger.counts() == {"requested": 3}
    again = cli.run("admin", "backup", "backup.sqlite")
    assert again.code == 2 and again.error_lines == [
        "sendledger: backup.sqlite exists: a backup never overwrites a file"
    ]
    cli.write_config("postgresql://u:secret@127.0.0.1:1/db")
    postgres = cli.run("admin", "backup", "b2.sqlite")
    assert postgres.code == 2 and "pg_dump" in postgres.stderr and "secret" not in postgres.stderr


def test_a_running_daemon_refuses_the_copy_until_it_stops(tmp_path: Path) -> None:
    with Rig(tmp_path) as rig:
        rig.submit([job("before-copy")])
        daemon = rig.start_daemon()
        deadline = time.monotonic() + 30
        while rig.state("before-copy") != "confirmed" and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = rig.cli("admin", "copy-store", "--to", "sqlite:///copy.sqlite", check=False)
        assert refused.returncode == 3, refused.stderr
        assert "is in use by daemon " in refused.stderr and "fork" in refused.stderr
        assert not (tmp_path / "copy.sqlite").exists()
        assert daemon.terminate() == 0
        done = rig.cli("admin", "copy-store", "--to", "sqlite:///copy.sqlite", "--json")
        summary = json.loads(done.stdout)
        assert summary["jobs"] == 1 and summary["finished"] is True


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
