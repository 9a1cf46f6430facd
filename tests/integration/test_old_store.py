"""Stored events keep loading: a store written before the engine redesign.

tests/fixtures/store-v1/ holds a SQLite store written by the code at commit c19fa83 and
what that code read back from it (expected.json); its README lists the jobs. Each test
opens a copy: opening a store switches it to WAL mode, so the committed file is never
opened in place.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from daemon.service_layer.read_models import review_rows
from ledger.addresses import mailbox_key
from ledger.application import Ledger
from ledger.display import iso
from ledger.stores.index import attempt_provider_of
from ledger.vocabulary import JobState
from policies.loader import load_policy_dir

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store-v1"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture
def old_store(tmp_path: Path) -> Iterator[Ledger]:
    path = tmp_path / "ledger.sqlite"
    shutil.copyfile(FIXTURE / "ledger.sqlite", path)
    app = Ledger("sqlite:///" + str(path))
    try:
        yield app
    finally:
        app.close()


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@pytest.mark.parametrize("key", list(EXPECTED["jobs"]))
def test_job_loads_as_written(old_store: Ledger, key: str) -> None:
    want = EXPECTED["jobs"][key]
    job = old_store.get_job(key)
    got = {
        "channel": job.channel,
        "state": str(job.state),
        "version": job.version,
        "attempts": job.attempts,
        "reason": job.reason,
        "due_at": job.due_at,
        "message_id": job.message_id,
        "content_hash": job.content_hash,
    }
    assert got == {
        "channel": want["channel"],
        "state": want["state"],
        "version": want["version"],
        "attempts": want["attempts"],
        "reason": want["reason"],
        "due_at": _time(want["due_at"]),
        "message_id": want["message_id"],
        "content_hash": want["content_hash"],
    }
    history = old_store.history(key)
    assert [type(event).__name__ for event in history] == want["events"]
    # The flat content of the old Requested event loads into today's JobContent whole:
    # hashing it again gives the hash stored with it.
    assert job.content.key == key and job.content.channel == want["channel"]
    assert job.content.content_hash == want["content_hash"]
    # The policy that accepted the job, as the old code recorded it.
    requested = history[0]
    # Requested is at class version 2 now; the first release's events upcast to no name.
    assert requested.submitted_by == "" and job.submitted_by == ""
    # v4: the job's own From and Gmail thread id; old jobs were sent as the policy's From.
    assert (requested.sender, requested.thread_id) == (None, None)
    assert job.content.sender is None and job.content.thread_id is None
    assert (requested.policy, requested.fingerprint) == (
        want["channel"],
        EXPECTED["policies"][want["channel"]],
    )


def _rows(app: Ledger) -> list[dict[str, Any]]:
    return sorted((row.as_dict() for row in app.jobs()), key=lambda row: row["key"])


def test_index_rows_survive_a_rebuild(old_store: Ledger) -> None:
    # Opening the old store added the columns of later releases (`ADDED_COLUMNS`): empty.
    added = {
        "purged_at": None,
        "watch_until": None,
        "watch_mailbox": None,
        "mailbox": None,
        "review_since": None,
        "other_due_at": None,
    }
    # ... but `written_at`, which the listing pages by: each row's last change; and the
    # attempt's provider of a requested job: none (its next call is its channel's).
    expected = sorted(
        (
            {
                **row,
                **added,
                "written_at": row["updated_at"],
                "attempt_provider": "" if row["state"] == "requested" else None,
            }
            for row in EXPECTED["index_rows"]
        ),
        key=lambda row: row["key"],
    )
    assert _rows(old_store) == expected  # the rows as stored
    assert old_store.rebuild_index() == len(expected)
    # The rows projected again from the events: the From's mailbox and the attempt's
    # provider filled in, and for the jobs in review when they went there (their latest
    # Escalated).
    mailboxes = {
        row["key"]: mailbox_key(old_store.get_job(row["key"]).from_addr) for row in expected
    }
    assert set(mailboxes.values()) == {"support@example.com", "alerts@example.com"}
    attempted = {row["key"]: "gmail" if row["attempts"] else "" for row in expected}
    assert _rows(old_store) == [
        {
            **row,
            "mailbox": mailboxes[row["key"]],
            "review_since": _escalated(old_store, row),
            "attempt_provider": "" if row["state"] == "requested" else attempted[row["key"]],
        }
        for row in expected
    ]


def _escalated(app: Ledger, row: dict[str, Any]) -> float | None:
    """A job in review: the time of its latest Escalated event, read from its history."""
    if row["state"] != "review":
        return None
    times = [e.timestamp for e in app.history(row["key"]) if type(e).__name__ == "Escalated"]
    return float(times[-1].timestamp())


def test_the_review_queue_of_an_old_store_lists_and_keeps_its_age(old_store: Ledger) -> None:
    """The review queue of a store written before `review_since` existed lists its jobs,
    `since` its rows' last change (NULL column) until a write or a rebuild fills it; a
    check written then leaves `since` at the time the job went to review."""
    in_review = sorted(k for k, job in EXPECTED["jobs"].items() if job["state"] == "review")
    stored = {row["key"]: row for row in EXPECTED["index_rows"]}
    listed = review_rows(old_store)
    assert [item["key"] for item in listed] == in_review
    assert {item["key"]: item["since"] for item in listed} == {
        key: iso(stored[key]["updated_at"]) for key in in_review
    }
    went = _escalated(old_store, stored["review-unknown"])
    assert went is not None
    later = datetime(2026, 11, 4, 9, 0, tzinfo=UTC)
    check: dict[str, Any] = {"by": "ops", "purpose": "check", "query": "q", "copies": []}
    old_store.update("review-unknown", lambda j: j.record_check(**check, at=later))
    row = old_store.row("review-unknown")
    assert row is not None and row.updated_at == later.timestamp()
    assert row.review_since == went
    since = {item["key"]: item["since"] for item in review_rows(old_store)}
    assert since["review-unknown"] == iso(went)


def test_provider_handles_load(old_store: Ledger) -> None:
    for provider, want in EXPECTED["handles"].items():
        handle = old_store.handle(provider)
        assert handle is not None, provider
        assert (handle.reliable, handle.version) == (want["reliable"], want["version"])
        assert handle.detail == want["detail"]
        assert old_store.handle_reliable(provider) is want["reliable"]


def test_open_jobs_continue_to_the_end_with_todays_engine(old_store: Ledger) -> None:
    """Today's engine picks up every open job of the old store where it stopped: the
    crashed attempt is recovered, the searches go on, the resends and retries are sent,
    the pending verification is made; every job settles, and the index stays equal to a
    rebuild from the events."""
    clock = FakeClock(datetime(2026, 11, 1, 12, 21, 15, tzinfo=UTC))
    # What the daemon's start-up does: the open jobs' rows get their mailbox.
    due = {row.key for row in old_store.jobs() if row.due_at is not None}
    assert old_store.fill_mailboxes() == len(due) > 0
    provider = FakeProvider("gmail", clock=clock)
    # The copy the old provider holds for the job whose search found nothing yet.
    provider.store_copy(EXPECTED["jobs"]["one-miss"]["message_id"])
    policies = load_policy_dir(FIXTURE / "policies", known_providers={"gmail"})
    engine = Engine(
        old_store,
        PolicyHolder(lambda: policies),
        {"gmail": provider},
        provider_timeouts={"gmail": 30.0},
        clock=clock,
        elapsed=clock.elapsed,
        rng=random.Random(1),
    )
    try:
        for _ in range(40):
            report = engine.tick()
            assert report.errors == 0, report
            clock.advance(600)
    finally:
        engine.close()
    for key, want in EXPECTED["jobs"].items():
        job = old_store.get_job(key)
        assert job.settled and not job.verifying, (key, job.state)
        assert job.version >= want["version"]
        history = [type(event).__name__ for event in old_store.history(key)]
        assert history[: len(want["events"])] == want["events"], key
    assert old_store.get_job("one-miss").state is JobState.CONFIRMED
    assert provider.copies_of(EXPECTED["jobs"]["one-miss"]["message_id"]) == 1
    assert old_store.get_job("new").state is JobState.CONFIRMED
    live = _rows(old_store)
    old_store.rebuild_index()
    # Only a rebuild fills the mailbox and the attempt's provider of a job settled before
    # the upgrade (nothing due: no daemon needs them), and when a job left in review by
    # it went there (nothing wrote to it since: its row's last change is that time);
    # every other row is the rebuild's.
    unfilled = {row["key"] for row in live if row["mailbox"] is None}
    assert unfilled and not unfilled & due
    waiting = {row["key"] for row in live if row["state"] == "review"}
    assert waiting and all(row["review_since"] is None for row in live)
    assert _rows(old_store) == [
        {
            **row,
            "mailbox": mailbox_key(old_store.get_job(row["key"]).from_addr)
            if row["key"] in unfilled
            else row["mailbox"],
            "review_since": row["updated_at"] if row["key"] in waiting else None,
            "attempt_provider": attempt_provider_of(old_store.get_job(row["key"]))
            if row["attempt_provider"] is None
            else row["attempt_provider"],
        }
        for row in live
    ]


def test_v1_claims_name_no_daemon_and_wait_for_their_deadline(old_store: Ledger) -> None:
    """Attempted v1 (before daemon.name) upcasts to daemon="": no restarted daemon takes
    such a claim for its own; the deadline recovers it as before. And on to v3 with no
    historyId (before the history handle), as the first release's Unknowns load with no
    history read due: the search alone answers them. And on to v4 with no draft made
    before the claim: a fence finds the job's drafts by its Message-ID, as before."""
    job = old_store.get_job("crashed")
    assert job.state is JobState.ATTEMPTED and job.claimed_by == ""
    assert job.history_id is None and job.made_drafts == ()
    attempted = [e for e in old_store.history("crashed") if type(e).__name__ == "Attempted"]
    assert [(e.daemon, e.history_id, e.made_draft) for e in attempted] == [("", None, None)]
    assert type(attempted[0]).class_version == 4
    unknowns = [
        event
        for key in ("confirmed-search", "one-miss", "unknown-searching", "duplicate")
        for event in old_store.history(key)
        if type(event).__name__ == "Unknown"
    ]
    assert all(e.history_due_at is None and type(e).class_version == 2 for e in unknowns)
