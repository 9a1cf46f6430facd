"""Retention through the console script and the daemon (docs/configuration.md "Retention"): `admin
purge` with its refusals, a purge killed with SIGKILL half-way (every job purged whole or left
intact), and the daemon's `[retention] purge_after`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import Rig, job

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.decision_types import Confirm, Review
from ledger.job import SendJob
from ledger.stores.index import index_row
from ledger.vocabulary import EscalationReason, PolicyRef, Sender

POLICY = PolicyRef("receipts", "sha256:00")
SENDER = Sender("Support <support@example.com>", "mail.example.com", POLICY)
LONG_AGO = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def customer(i: int) -> str:
    return f"customer{i}.private@example.net"


def settled_jobs(store: Path, count: int, *, open_too: bool = True) -> None:
    """`count` jobs confirmed on 2026-01-01 (long before any --older-than), and one job
    still requested and one in review when `open_too`."""
    clock = FakeClock(LONG_AGO)
    with Ledger(f"sqlite:///{store}", clock=clock) as ledger:
        jobs = [
            (
                parse_job(
                    {
                        "channel": "receipts",
                        "key": f"r-{i:04d}",
                        "to": customer(i),
                        "subject": f"Receipt {i} for you",
                        "body": f"Body text {i}",
                    }
                ),
                SENDER,
            )
            for i in range(count + 2)
        ]
        ledger.submit_many(jobs)

        def confirm(j: SendJob) -> None:
            j.claim(provider="gmail", deadline=clock() + timedelta(seconds=30), at=clock())
            j.record_response(
                provider_message_id=f"gm-{j.key}", decision=Confirm(POLICY), at=clock()
            )

        for i in range(count):
            ledger.update(f"r-{i:04d}", confirm)
        if open_too:
            review = Review(POLICY, EscalationReason.UNKNOWN_OUTCOME)
            ledger.update(
                f"r-{count + 1:04d}", lambda j: j.escalate(review, detail="t", at=clock())
            )


def test_admin_purge_dry_run_then_purge_then_history_and_status(cli: Any) -> None:
    store = cli.root / "ledger.sqlite"
    settled_jobs(store, 3)
    dry = cli.run("admin", "purge", "--older-than", "30d", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert json.loads(dry.stdout)["keys"] == ["r-0000", "r-0001", "r-0002"]
    assert customer(0).encode() in store.read_bytes() + _wal(store)

    done = cli.run("admin", "purge", "--older-than", "30d", "--by", "dpo", "--json")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) | {"before": None} == {
        "dry_run": False,
        "before": None,
        "purged": 3,
        "skipped": 0,
        "scrubbed": True,
    }
    raw = store.read_bytes() + _wal(store)
    assert [i for i in range(3) if customer(i).encode() in raw] == []
    assert customer(3).encode() in raw and customer(4).encode() in raw  # open: kept

    status = cli.run("status", "r-0001", "--json").json()
    assert status["state"] == "confirmed" and status["purged"]["by"] == "dpo"
    assert "to" not in status
    shown = cli.run("status", "r-0001").stdout
    assert re.search(rf"^purged +at={status['purged']['at']} by=dpo$", shown, re.M), shown
    history = cli.run("history", "r-0001", "--json").json()
    assert [e["type"] for e in history] == ["Requested", "Attempted", "Confirmed", "Purged"]
    assert history[0]["to"] == [] and history[-1]["rule"] == "admin purge --older-than 30d"
    audit = cli.run("audit", "--event", "Purged", "--format", "json").stdout.splitlines()
    assert [json.loads(line)["key"] for line in audit] == ["r-0000", "r-0001", "r-0002"]
    # Nothing left to purge; the job in review cannot be purged, nor resent once purged.
    again = cli.run("admin", "purge", "--older-than", "30d")
    assert again.code == 0 and again.stdout.startswith("purged 0 jobs")
    refused = cli.run("admin", "purge", "--key", "r-0004")
    assert refused.code == 3 and "review" in refused.stderr
    assert cli.run("review", "resolve", "r-0001", "--as", "resend").code == 3


@pytest.mark.parametrize(
    ("args", "code", "names"),
    [
        (["--older-than", "soon"], 2, "--older-than"),
        # A bare number was seconds: "90" (days in mind) purged every settled job.
        (["--older-than", "90"], 2, "write 90d"),
        ([], 2, "--older-than"),
        (["--older-than", "1d", "--key", "r-0000"], 2, "--key"),
        (["--key", "nope"], 4, "nope"),
        (["--key", "r-0003"], 3, "requested"),
        # A --by no purge can record was taken by a dry run, and by a run with nothing
        # to purge (exit 0), then refused by the run that had work.
        (["--older-than", "30d", "--dry-run", "--by", "a\nb"], 2, "--by"),
        (["--older-than", "36500d", "--by", "a\nb"], 2, "--by"),
        (["--older-than", "30d", "--by", "a\nb"], 2, "--by"),
    ],
)
def test_admin_purge_refusals_change_nothing(
    cli: Any, args: list[str], code: int, names: str
) -> None:
    store = cli.root / "ledger.sqlite"
    settled_jobs(store, 3)
    result = cli.run("admin", "purge", *args)
    assert result.code == code and names in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with Ledger(f"sqlite:///{store}") as ledger:
        assert not any(ledger.get_job(f"r-{i:04d}").purged for i in range(5))


def purge_stopped_half_way(cli: Any, count: int, how: signal.Signals, **more: str) -> int:
    """`admin purge --older-than 30d` of `count` settled jobs, sent `how` once 20 of them
    are purged (unless it ended first): its exit code. `more`: the fork server's "stdout"
    and "stderr" files."""
    store = cli.root / "ledger.sqlite"
    settled_jobs(store, count, open_too=False)
    # Forked from the worker's fork server: a process of its own, signalled by its pid.
    assert cli.server is not None
    argv = ["--config", str(cli.config), "admin", "purge", "--older-than", "30d"]
    pid = cli.server.start(argv, cli.root, cli.root.parent / "purge.log", env=cli.env, **more)

    def running() -> bool:
        try:
            cli.server.exited(pid, timeout=0)
        except TimeoutError:
            return True
        return False

    with Ledger(f"sqlite:///{store}") as ledger:
        deadline = time.monotonic() + 60
        while _purged(ledger) < 20 and running() and time.monotonic() < deadline:
            time.sleep(0.02)
        if running():  # else it ended by itself: the caller's checks say so
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, how)
        code: int = cli.server.exited(pid, timeout=30)[0]
    return code


def test_a_purge_killed_half_way_leaves_each_job_purged_or_intact(cli: Any) -> None:
    store = cli.root / "ledger.sqlite"
    count = 400
    purge_stopped_half_way(cli, count, signal.SIGKILL)
    with Ledger(f"sqlite:///{store}") as ledger:
        purged = [key for key in _keys(count) if _check_whole_or_intact(ledger, key)]
        assert 20 <= len(purged) < count, len(purged)
        assert all(ledger.row(k) == index_row(ledger.get_job(k)) for k in _keys(count))
    rest = cli.run("admin", "purge", "--older-than", "30d", "--json")
    assert rest.code == 0 and rest.json()["purged"] == count - len(purged)
    with Ledger(f"sqlite:///{store}") as ledger:
        assert all(_check_whole_or_intact(ledger, key) for key in _keys(count))
    raw = store.read_bytes() + _wal(store)
    assert [i for i in range(count) if customer(i).encode() in raw] == []


def test_a_ctrl_c_ends_a_purge_after_a_job_and_says_how_many_it_purged(cli: Any) -> None:
    store = cli.root / "ledger.sqlite"
    count = 400
    out, err = cli.root.parent / "purge.out", cli.root.parent / "purge.err"
    code = purge_stopped_half_way(cli, count, signal.SIGINT, stdout=str(out), stderr=str(err))
    with Ledger(f"sqlite:///{store}") as ledger:
        purged = [key for key in _keys(count) if _check_whole_or_intact(ledger, key)]
    assert code == 130 and 20 <= len(purged) < count, (code, len(purged))
    assert out.read_text(encoding="utf-8").startswith(f"purged {len(purged)} jobs settled before")
    assert err.read_text(encoding="utf-8").splitlines()[-1] == (
        f"sendledger: interrupted: {len(purged)} jobs purged, each whole; the others are as "
        "they were: run the same command again to purge them"
    )
    raw = store.read_bytes() + _wal(store)
    assert [i for i in range(count) if customer(i).encode() in raw and f"r-{i:04d}" in purged] == []


def test_the_daemon_purges_settled_jobs_by_its_retention_setting(tmp_path: Path) -> None:
    with Rig(tmp_path) as rig:
        daemon = rig.start_daemon(
            env={"SENDLEDGER_RETENTION__PURGE_AFTER": "0s", "SENDLEDGER_RETENTION__EVERY": "300ms"}
        )
        rig.submit([job("kept-short", to="gone.customer@example.net")])
        deadline = time.monotonic() + 30
        while "Purged" not in _types(rig, "kept-short") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _types(rig, "kept-short") == ["Requested", "Attempted", "Confirmed", "Purged"], (
            daemon.tail()
        )
        assert rig.copies("kept-short") == 1
        purged = rig.history("kept-short")[-1]
        assert purged["by"].startswith("daemon ") and "purge_after = 0ms" in purged["rule"]
        assert b"gone.customer@example.net" not in (tmp_path / "ledger.sqlite").read_bytes()
        assert daemon.terminate() == 0


def _types(rig: Rig, key: str) -> list[str]:
    return rig.types(key) if rig.row(key) else []


def _keys(count: int) -> list[str]:
    return [f"r-{i:04d}" for i in range(count)]


def _purged(ledger: Ledger) -> int:
    return sum(1 for _ in ledger.job_events(["Purged"]))


def _check_whole_or_intact(ledger: Ledger, key: str) -> bool:
    """True when purged whole (Purged event, content gone from every event, the index
    says so); False when intact (content everywhere, no Purged); fails otherwise."""
    events = ledger.history(key)
    row = ledger.row(key)
    assert row is not None
    text = repr([vars(e) for e in events])
    i = int(key.split("-")[1])
    if isinstance(events[-1], SendJob.Purged):
        assert customer(i) not in text and f"Receipt {i} " not in text, key
        assert row.purged_at is not None and row.version == len(events), key
        return True
    assert customer(i) in text and row.purged_at is None, key
    assert not any(isinstance(e, SendJob.Purged) for e in events), key
    return False


def _wal(store: Path) -> bytes:
    wal = store.with_name(store.name + "-wal")
    return wal.read_bytes() if wal.exists() else b""


def test_a_key_given_twice_is_purged_once_and_the_wal_is_scrubbed(cli: Any) -> None:
    """`--key K --key K` used to purge K, fail on the second K (exit 3) and leave the
    purged text in the WAL. A reader holds the store open, so the WAL is not removed
    when the command's connections close: only the purge's own scrub can empty it."""
    store = cli.root / "ledger.sqlite"
    settled_jobs(store, 3)
    with Ledger(f"sqlite:///{store}") as reader:
        assert reader.row("r-0000") is not None
        done = cli.run(
            "admin", "purge", "--key", "r-0000", "--key", "r-0001", "--key", "r-0000", "--json"
        )
        assert done.code == 0, done.stderr
        assert done.json()["purged"] == 2 and done.json()["scrubbed"] is True
        raw = store.read_bytes() + _wal(store)
        assert [i for i in (0, 1) if customer(i).encode() in raw] == []
        assert customer(2).encode() in raw  # not named: kept
        assert [e["type"] for e in cli.run("history", "r-0000", "--json").json()].count(
            "Purged"
        ) == 1
