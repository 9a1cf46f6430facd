"""The engine's drafts functions (daemon/engine/drafts.py) on a SendJob and the in-memory
drafts provider: the draft before the claim (recorded, reused after a crash, new), and
the draft's answer after an unknown outcome, on every channel, whether the provider
keeps our Message-ID or not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig
from tests.unit.engine_rig import policy as rig_policy
from tests.unit.jobs import DEADLINE, MESSAGE_ID, PROVIDER, requested_job

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine.drafts import (
    DraftAlreadySent,
    DraftChanged,
    draft_difference,
    prepare_draft,
    settle_by_draft,
)
from daemon.engine.readback import ProviderHealth
from daemon.engine.report import Counter
from daemon.engine.unknown import unknown_to_events
from daemon.engine.work import Work
from daemon.providers.draft_handle import Draft
from daemon.service_layer.services import (
    ChannelPolicies,
    Refusal,
    ServiceError,
    Services,
    check_since_review,
    safe_decisions,
)
from ledger.application import Ledger
from ledger.job import DRAFTS_FENCE, SendJob
from ledger.vocabulary import ConfirmedVia, JobState, Resolution
from policies.model import ChannelPolicy

RAW = f"Message-ID: {MESSAGE_ID}\r\nTo: b@example.com\r\n\r\nhi\r\n".encode()


def policy(**overrides: Any) -> ChannelPolicy:
    return ChannelPolicy.model_validate(
        {
            "channel": "receipts",
            "provider": PROVIDER,
            "from": "Support <support@example.com>",
            "message_id_domain": "mail.example.com",
            "search_after": "5m",
            **overrides,
        }
    )


def sent_once_unknown(
    clock: FakeClock, provider: FakeDraftsProvider, chosen: ChannelPolicy, fate: Scripted
) -> SendJob:
    """A job whose draft was claimed and sent with `fate`, recorded Unknown."""
    job = requested_job(clock)
    draft, _ = prepare_draft(job, provider, RAW, clock.now)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    provider.script(fate)
    provider.send_draft(draft)
    record_unknown(job, chosen, clock)
    return job


def record_unknown(job: SendJob, chosen: ChannelPolicy, clock: FakeClock) -> None:
    """The job's attempt recorded Unknown as the dispatch records it (`unknown_to_events`,
    the handle reliable), in memory."""
    ledger = Ledger("memory://", clock=clock)
    work = Work(job, chosen, None, clock.now, ledger, Counter())
    unknown_to_events(work, chosen, ProviderHealth(ledger, clock), "reply lost")


def test_only_a_drafts_provider_in_drafts_mode_counts(clock: FakeClock) -> None:
    assert FakeDraftsProvider(clock=clock).drafts() is not None
    assert FakeProvider(clock=clock).drafts() is None


def test_the_draft_is_recorded_before_the_claim_and_reused_while_unsent(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    job = requested_job(clock)
    first, created = prepare_draft(job, provider, RAW, clock.now)
    assert (job.draft_id, provider.drafts_created, created) == (first.draft_id, 1, True)
    assert prepare_draft(job, provider, RAW, clock.now) == (first, False)  # pending: reused
    assert provider.drafts_created == 1


def test_a_draft_left_by_a_crash_before_its_save_is_found_and_reused(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    orphan = provider.create_draft(RAW)  # created, then the daemon died before saving
    job = requested_job(clock)
    assert prepare_draft(job, provider, RAW, clock.now) == (orphan, False)
    assert provider.drafts_created == 1 and job.draft_id == orphan.draft_id


def test_a_recorded_draft_already_sent_is_never_sent_again(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    job = requested_job(clock)
    draft, _ = prepare_draft(job, provider, RAW, clock.now)
    provider.send_draft(draft)  # sent by a claim whose save never happened
    with pytest.raises(DraftAlreadySent):
        prepare_draft(job, provider, RAW, clock.now)


@pytest.mark.parametrize("on_unknown", ["retry", "search-then-review", "review"])
@pytest.mark.parametrize("replaced", [False, True], ids=["kept", "rewritten"])
def test_an_unknown_send_whose_draft_is_sent_confirms_at_once(
    clock: FakeClock, on_unknown: str, replaced: bool
) -> None:
    provider = FakeDraftsProvider(clock=clock, replaces_message_id=replaced)
    chosen = policy(on_unknown=on_unknown)
    job = sent_once_unknown(clock, provider, chosen, Scripted.dropped_response())
    assert job.due_at == clock.now  # no search_after to wait
    assert settle_by_draft(job, provider, chosen, now=clock.now, handle_reliable=True)
    assert job.state is JobState.CONFIRMED
    confirmed = job.pending_events[-1]
    assert isinstance(confirmed, SendJob.Confirmed) and confirmed.via == ConfirmedVia.DRAFT
    assert provider.copies[0].provider_message_id == job.provider_message_ids[0]


@pytest.mark.parametrize("on_unknown", ["search-then-review", "review"])
def test_an_unknown_send_whose_draft_is_pending_is_sent_again(
    clock: FakeClock, on_unknown: str
) -> None:
    provider = FakeDraftsProvider(clock=clock)
    chosen = policy(on_unknown=on_unknown, irreversible=True)
    job = sent_once_unknown(clock, provider, chosen, Scripted.lost_request())
    settle_by_draft(job, provider, chosen, now=clock.now, handle_reliable=True)
    assert (job.state, job.due_at) == (JobState.REQUESTED, clock.now)
    assert prepare_draft(job, provider, RAW, clock.now)[0].draft_id == job.draft_id
    assert provider.copies_of(MESSAGE_ID) == 0


def test_pending_draft_review_sends_it_to_a_human(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    chosen = policy(pending_draft="review")
    job = sent_once_unknown(clock, provider, chosen, Scripted.lost_request())
    settle_by_draft(job, provider, chosen, now=clock.now, handle_reliable=True)
    assert job.state is JobState.REVIEW


@pytest.mark.parametrize(
    ("on_unknown", "reliable", "searched"),
    [("retry", True, True), ("retry", False, False), ("review", True, False)],
)
def test_a_gone_draft_hands_over_to_the_search_or_review(
    clock: FakeClock, on_unknown: str, reliable: bool, searched: bool
) -> None:
    provider = FakeDraftsProvider(clock=clock)
    chosen = policy(on_unknown=on_unknown)
    job = sent_once_unknown(clock, provider, chosen, Scripted.lost_request())
    assert job.draft_id is not None
    provider.delete_by_person(job.draft_id)
    unknown_at = clock.now
    clock.advance(2)
    settle_by_draft(job, provider, chosen, now=clock.now, handle_reliable=reliable)
    assert job.draft_id is None
    if searched:
        # From the moment it was found gone, not from the Unknown: a person's Send a
        # moment before shows in the index `search_after` after it.
        assert job.state is JobState.UNKNOWN and job.draft_gone_at == clock.now
        assert job.due_at == clock.now + timedelta(minutes=5) > unknown_at + timedelta(minutes=5)
    else:
        assert job.state is JobState.REVIEW


def test_the_sweep_s_search_after_a_draft_found_gone_waits_from_that_moment() -> None:
    """A claim lapsed (its daemon died in the call), recovered Unknown; the sweep's draft
    checks fail for a while, and a person presses Send on the draft in the mailbox in
    between (a copy the index shows only `search_after` later). The draft found gone,
    the engine's search is due `search_after` after that moment, not after the Unknown's:
    the index may show nothing sooner, and a miss would resend the job."""
    from tests.unit.engine_rig import GRACE, TIMEOUT

    chosen = rig_policy("receipts", on_unknown="search-then-review", search_after="60s")
    with EngineRig(chosen) as rig:
        rig.engine.close()
        drafts = FakeDraftsProvider("fake", clock=rig.clock)
        rig.provider = drafts
        rig.engine = rig.new_engine()
        rig.submit("receipts", "k1")
        drafts.script(Scripted.crash_during_call(stored=False))
        rig.tick(errors=1)
        rig.clock.advance(TIMEOUT + GRACE + 1)
        drafts.fail_checks(3)
        for _ in range(3):
            rig.clock.advance(2)
            rig.engine.tick()
        unknown_at = rig.job("k1").unknown_at
        assert unknown_at is not None and rig.job("k1").draft_id is not None
        drafts.send_by_person(known_draft(rig.job("k1")))
        rig.clock.advance(30)
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.UNKNOWN and job.draft_gone_at == rig.clock.now
        assert job.search_due_at == rig.clock.now + timedelta(seconds=60)
        assert job.search_due_at > unknown_at + timedelta(seconds=60)


def known_draft(job: SendJob) -> str:
    assert job.draft_id is not None
    return job.draft_id


def test_a_failed_check_records_nothing(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    chosen = policy()
    job = sent_once_unknown(clock, provider, chosen, Scripted.dropped_response())
    provider.fail_checks(1)
    before = len(job.pending_events)
    assert not settle_by_draft(job, provider, chosen, now=clock.now, handle_reliable=True)
    assert len(job.pending_events) == before and job.state is JobState.UNKNOWN


def test_without_a_draft_the_unknown_rule_is_the_policys(clock: FakeClock) -> None:
    job = requested_job(clock)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    record_unknown(job, policy(on_unknown="review"), clock)
    assert job.state is JobState.REVIEW
    job2 = requested_job(clock)
    job2.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    record_unknown(job2, policy(), clock)
    assert job2.state is JobState.UNKNOWN
    assert job2.due_at == clock.now + timedelta(minutes=5)


@pytest.mark.parametrize("on_unknown", ["retry", "search-then-review", "review"])
def test_with_a_recorded_draft_the_unknown_is_due_at_once_on_every_channel(
    clock: FakeClock, on_unknown: str
) -> None:
    provider = FakeDraftsProvider(clock=clock)
    chosen = policy(on_unknown=on_unknown)
    job = sent_once_unknown(clock, provider, chosen, Scripted.dropped_response())
    assert job.state is JobState.UNKNOWN and job.due_at == clock.now


# -- a draft that cannot be created (docs/providers.md "Sending through drafts") -----------


@pytest.fixture
def drafts_rig() -> Iterator[tuple[EngineRig, FakeDraftsProvider]]:
    """An engine rig whose provider is the in-memory drafts provider, one job submitted."""
    rig = EngineRig(rig_policy("receipts"))
    rig.engine.close()
    drafts = FakeDraftsProvider("fake", clock=rig.clock)
    rig.provider = drafts
    rig.engine = rig.new_engine()
    rig.submit("receipts", "k1")
    yield rig, drafts
    rig.close()


def test_a_draft_that_cannot_be_created_is_no_claim(
    drafts_rig: tuple[EngineRig, FakeDraftsProvider],
) -> None:
    """A failed drafts.create records nothing: the job stays due and the next tick sends it."""
    rig, drafts = drafts_rig
    drafts.fail_creates(1)
    rig.tick(errors=1)
    assert rig.events("k1") == ["Requested"]
    assert rig.job("k1").state is JobState.REQUESTED and drafts.draft_sends == 0
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    assert drafts.draft_sends == 1 and rig.copies("k1") == 1


def test_a_draft_refused_for_good_goes_to_review_without_a_claim(
    drafts_rig: tuple[EngineRig, FakeDraftsProvider],
) -> None:
    """A permanent refusal of drafts.create (a 4xx, a missing scope) is not asked again
    every tick: the job goes to review (`rejected`), never claimed, nothing sent."""
    rig, drafts = drafts_rig
    drafts.refuse_creates(1)
    rig.tick()
    job = rig.job("k1")
    assert rig.events("k1") == ["Requested", "Escalated"]
    assert job.state is JobState.REVIEW and job.reason == "rejected"
    rig.advance_and_tick(3600)
    assert drafts.drafts_created == 0 and drafts.draft_sends == 0


def new_drafts_rig() -> EngineRig:
    return EngineRig(
        rig_policy("receipts"), provider=lambda clock: FakeDraftsProvider("fake", clock=clock)
    )


def stopped_in_the_draft_step(rig: EngineRig) -> FakeDraftsProvider:
    """Job k1 submitted, and the daemon stopped during its drafts.create: its draft is
    recorded, not sent."""
    rig.submit("receipts", "k1")
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    provider.during_create = rig.engine.stop  # the signal comes during drafts.create
    rig.tick()
    provider.during_create = None
    return provider


def test_a_stop_asked_during_the_draft_step_starts_no_send() -> None:
    """SIGTERM while a worker is in a job's draft step (drafts.list and drafts.create,
    each up to the provider's timeout): the stopping daemon starts no new provider call
    (docs/operations.md "Stopping"), so the drafts.send that would follow the step is not
    made; the job stays requested, its draft recorded for the next run to send."""
    rig = new_drafts_rig()
    try:
        provider = stopped_in_the_draft_step(rig)
        assert provider.drafts_created == 1
        assert provider.draft_sends == 0 and provider.sends == 0, rig.events("k1")
        assert "Attempted" not in rig.events("k1")
        assert rig.job("k1").state is JobState.REQUESTED
        assert rig.job("k1").draft_id is not None  # recorded: the next run sends it
        rig.restart()
        rig.tick()
        assert rig.job("k1").state is JobState.CONFIRMED
        assert (provider.drafts_created, provider.draft_sends, rig.copies("k1")) == (1, 1, 1)
    finally:
        rig.close()


EDITED = RAW.replace(b"To: b@example.com", b"To: someone-else@example.com")


def test_a_recorded_draft_edited_in_the_mailbox_is_not_sent_again(clock: FakeClock) -> None:
    """A person edits the job's unsent draft in the shared mailbox: the next attempt reads
    it back, finds it no longer the job's proven render, and does not send it. Reading it
    back answers what the draft check did: no call more than before."""
    provider = FakeDraftsProvider(clock=clock)
    job = requested_job(clock)
    draft, _ = prepare_draft(job, provider, RAW, clock.now)
    assert prepare_draft(job, provider, RAW, clock.now) == (draft, False)
    assert provider.raw_reads == 1  # the reuse: one read, as the check was
    provider.edit_by_person(draft.draft_id, EDITED)
    with pytest.raises(DraftChanged, match="to differs") as changed:
        prepare_draft(job, provider, RAW, clock.now)
    assert changed.value.draft == draft and provider.draft_sends == 0


def test_a_draft_left_by_a_crash_and_edited_is_not_reused(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock)
    orphan = provider.create_draft(RAW)
    provider.edit_by_person(orphan.draft_id, RAW.replace(b"hi", b"pay to account 666"))
    job = requested_job(clock)
    with pytest.raises(DraftChanged, match="body differs"):
        prepare_draft(job, provider, RAW, clock.now)
    assert job.draft_id is None and provider.drafts_created == 1


def test_a_draft_re_encoded_by_the_provider_is_still_the_job_s() -> None:
    """What a recipient sees decides, not the bytes: a part the provider stored with
    another transfer encoding, or with other line ends, is the same part."""
    plain = (
        f"Message-ID: {MESSAGE_ID}\r\nTo: B <b@example.com>\r\nSubject: Hi\r\n"
        "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
        "Content-Transfer-Encoding: 8bit\r\n\r\nhé\r\n"
    ).encode()
    encoded = (
        f"Message-ID: {MESSAGE_ID}\nTo: b@EXAMPLE.com\nSubject: Hi\nMIME-Version: 1.0\n"
        "Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n"
        "aMOpCg==\n"
    ).encode()
    assert draft_difference(encoded, plain) is None
    assert draft_difference(plain.replace(b"Subject: Hi", b"Subject: Ho"), plain)
    assert draft_difference(plain.replace(b"To: B <", b"Cc: B <"), plain) == "to differs"


def test_a_draft_edited_while_its_job_waited_sends_the_job_to_review() -> None:
    """The job's draft was recorded, then the daemon stopped before sending it; a person
    edits the draft in the mailbox before the next run. That run sends nothing and puts
    the job in review, saying why."""
    rig = new_drafts_rig()
    try:
        provider = stopped_in_the_draft_step(rig)
        draft_id = rig.job("k1").draft_id
        assert draft_id is not None and provider.draft_sends == 0
        held = provider.draft_raw(Draft(draft_id, ""))
        assert held is not None
        provider.edit_by_person(draft_id, held.replace(b"Subject: ", b"Subject: URGENT "))
        rig.restart()
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.reason == "draft-changed"
        assert provider.draft_sends == 0 and provider.sends == 0
        escalated = rig.ledger.history("k1")[-1]
        assert isinstance(escalated, SendJob.Escalated)
        assert "subject differs" in escalated.detail and draft_id in escalated.detail
        # What the review says to do: the edited draft deleted, then a resend, which
        # makes a new draft from the job.
        provider.delete_by_person(draft_id)
        rig.ledger.update(
            "k1",
            lambda j: j.resolve(Resolution.RESEND, note="draft deleted", by="op", at=rig.clock()),
        )
        rig.tick()
        assert rig.job("k1").state is JobState.CONFIRMED and rig.copies("k1") == 1
        assert provider.drafts_created == 2 and provider.draft_sends == 1
    finally:
        rig.close()


def edited_in_review(rig: EngineRig, *, message_id_too: bool) -> tuple[FakeDraftsProvider, str]:
    """Job k1 in review as `draft-changed`: its recorded draft was edited by a person
    (its Message-ID too when `message_id_too`: the listing by the job's Message-ID then
    misses it). The draft's id, and the index caught up for a resend."""
    provider = stopped_in_the_draft_step(rig)
    draft_id = rig.job("k1").draft_id
    held = provider.draft_raw(Draft(draft_id or "", ""))
    assert draft_id is not None and held is not None
    edited = held.replace(b"Subject: ", b"Subject: URGENT ")
    if message_id_too:
        edited = edited.replace(b"Message-ID: <", b"Message-ID: <edited.")
    provider.edit_by_person(draft_id, edited)
    rig.restart()
    rig.tick()
    assert rig.job("k1").reason == "draft-changed"
    rig.clock.advance(61)
    return provider, draft_id


def drafts_door(rig: EngineRig) -> Services:
    return Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies),
        providers=lambda name: nullcontext(rig.provider),
        draft_providers=frozenset({"fake"}),
    )


@pytest.mark.parametrize("message_id_too", [False, True])
def test_a_resend_of_a_draft_changed_job_deletes_the_edited_draft_and_sends_the_job(
    message_id_too: bool,
) -> None:
    """The operator resends without deleting the edited draft first (the review's advice
    skipped): the resend deletes the job's recorded draft by its id, even when the person
    changed its Message-ID too (the listing by the job's Message-ID misses it), so the
    next attempt makes a new draft from the job and sends one copy, instead of reading
    the edited draft back and sending the job to review again."""
    rig = new_drafts_rig()
    try:
        provider, draft_id = edited_in_review(rig, message_id_too=message_id_too)
        drafts_door(rig).resolve("k1", Resolution.RESEND, note="", by="alice")
        fences = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.DraftsDeleted)]
        assert [(f.why, f.draft_ids) for f in fences] == [(DRAFTS_FENCE, [draft_id])]
        assert draft_id not in provider.held_drafts
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.CONFIRMED, rig.events("k1")
        assert rig.copies("k1") == 1 and provider.draft_sends == 1
        assert provider.drafts_created == 2 and job.draft_id != draft_id
    finally:
        rig.close()


def test_a_resend_after_a_person_sent_the_edited_draft_is_refused() -> None:
    """A person pressed Send on the edited draft in the mailbox: the resend finds the
    recorded draft gone and its message sent, records that copy as its search's answer
    and sends nothing; the job stays in review, no longer offered a resend."""
    rig = new_drafts_rig()
    try:
        provider, draft_id = edited_in_review(rig, message_id_too=True)
        provider.send_draft(Draft(draft_id, ""))  # the person's Send
        assert rig.copies("k1") == 0  # under another Message-ID: no search would find it
        door = drafts_door(rig)
        with pytest.raises(ServiceError, match="1 copy found") as refused:
            door.resolve("k1", Resolution.RESEND, note="", by="alice")
        assert refused.value.kind is Refusal.CONFLICT
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.reason == "draft-changed"
        last = check_since_review(door.history("k1"))
        assert last is not None and last["query"] == f"drafts.get {draft_id}"
        assert Resolution.RESEND not in safe_decisions(job, last)
        rig.tick()
        assert provider.draft_sends == 1 and provider.drafts_created == 1
    finally:
        rig.close()
