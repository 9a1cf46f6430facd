"""Gmail drafts mode (`send_via = "drafts"`) met by the other actor at one exact point
(tests/unit/meanwhile.py; docs/architecture.md "The life of one job on a drafts
provider"): a claim whose call outlived its lease lands while another daemon's recovery
looks at its draft; a person's check lands while the recovery fences it."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.meanwhile import Meanwhile

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted, SimulatedCrash
from daemon.engine import Engine, PolicyHolder
from daemon.engine.drafts import recorded_draft
from daemon.providers.base import SendOutcome
from daemon.providers.draft_handle import Draft
from daemon.service_layer.problems import ServiceError
from daemon.service_layer.services import ChannelPolicies, Services
from ledger.decision_types import Review
from ledger.exceptions import Refusal
from ledger.job import SendJob
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState, Resolution

#: A channel where "not sent" would go to a person: a wrong one is a spurious review.
LEGAL = policy("legal", on_unknown="review", pending_draft="review", search_after="60s")
#: A channel that sends a draft known unsent again, and reviews an outcome it cannot know.
NOTICES = policy("notices", on_unknown="review", pending_draft="send", search_after="60s")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, NOTICES)
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    yield rig
    rig.close()


def fake(rig: EngineRig) -> FakeDraftsProvider:
    assert isinstance(rig.provider, FakeDraftsProvider)
    return rig.provider


def lapsed_claim_with_its_draft(rig: EngineRig, key: str, channel: str = "legal") -> Draft:
    """`key` claimed with its draft recorded, its call gone quiet (the worker died in
    it, nothing stored yet), and its lease run out: the next tick recovers it as unknown
    and, a draft being recorded, asks the draft at once. The recorded draft."""
    rig.submit(channel, key)
    fake(rig).script(Scripted.crash_during_call(stored=False))
    rig.tick(errors=1)
    job = rig.job(key)
    assert job.state is JobState.ATTEMPTED and job.draft_id is not None
    assert job.draft_message_id is not None
    rig.clock.advance(TIMEOUT + GRACE + 1)
    return Draft(job.draft_id, job.draft_message_id)


def after(rig: EngineRig, call: str, hook: Callable[[], None]) -> None:
    """`hook` runs once the provider's `call` has answered, the first time only."""
    provider = fake(rig)
    answered = getattr(provider, call)
    once = Meanwhile(hook)

    def then_the_hook(*args: Any) -> Any:
        answer = answered(*args)
        once()
        return answer

    setattr(provider, call, then_the_hook)


def door_of(rig: EngineRig) -> Services:
    """The service layer a person's command or page acts through, on the rig's store."""
    return Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies),
        providers=lambda _: nullcontext(rig.provider),
    )


def a_check_after(rig: EngineRig, call: str, key: str) -> list[bool]:
    """A person's `review check` of `key` made once the provider's `call` has answered,
    the first time only; whether it was recorded is appended to the list returned."""
    door = door_of(rig)
    checked: list[bool] = []
    after(rig, call, lambda: checked.append(door.check(key, by="alice").recorded))
    return checked


def the_call_lands_after(rig: EngineRig, call: str, draft: Draft) -> list[SendOutcome]:
    """The lapsed claim's drafts.send of `draft` lands once the provider's `call` (the
    recovery's check, or its fence) has answered, the first time only; what it answered
    is appended to the list returned."""
    landed: list[SendOutcome] = []
    after(rig, call, lambda: landed.append(fake(rig).send_draft(draft)))
    return landed


def test_a_lapsed_claims_send_landing_between_the_check_and_the_fence_confirms(
    rig: EngineRig,
) -> None:
    """The recovery's drafts.get says the draft is unsent; the call of the claim whose
    lease lapsed lands right after it, consuming the draft; the fence's delete finds it
    gone. "Not sent" would be false (a person asked to resend a job already delivered):
    the draft is asked again and the job confirmed by the copy it made."""
    draft = lapsed_claim_with_its_draft(rig, "k1")
    landed = the_call_lands_after(rig, "check_draft", draft)
    assert rig.tick().recovered == 1
    job = rig.job("k1")
    assert job.state is JobState.CONFIRMED, rig.events("k1")
    assert len(landed) == 1 and rig.copies("k1") == 1 and fake(rig).drafts_created == 1
    history = rig.ledger.history("k1")
    assert not [e for e in history if isinstance(e, SendJob.DraftPending | SendJob.Escalated)]
    confirmed = [e for e in history if isinstance(e, SendJob.Confirmed)]
    assert [c.via for c in confirmed] == [ConfirmedVia.DRAFT]
    # The fence is recorded before its deletion, which found the draft sent: confirmed by it.
    assert [type(e).__name__ for e in history][-2:] == ["DraftsDeleted", "Confirmed"]


def test_a_lapsed_claims_send_landing_after_the_fence_finds_no_draft_to_send(
    rig: EngineRig,
) -> None:
    """The same call landing once the fence deleted the draft: it sends nothing (a 404),
    so "not sent" holds, and the next attempt's new draft is the one copy."""
    draft = lapsed_claim_with_its_draft(rig, "k2")
    late = the_call_lands_after(rig, "delete_draft", draft)
    assert rig.tick().recovered == 1
    assert rig.copies("k2") == 0 and len(late) == 1
    history = rig.ledger.history("k2")
    assert [e for e in history if isinstance(e, SendJob.DraftPending)]
    assert rig.job("k2").state is JobState.REVIEW  # pending_draft = "review": truly unsent


def test_a_persons_check_while_the_recovery_fences_the_draft_keeps_its_answer(
    rig: EngineRig,
) -> None:
    """The recovery's drafts.get says the lapsed claim's draft is unsent and its fence
    deletes it; a person's `review check` is recorded right then, so the recovery's save
    conflicts. Its answer was dropped with the conflict, and the next sweep found the
    draft gone, as if sent or deleted by someone: DraftGone, and on this channel a review
    of a job the daemon knew unsent (it deleted the draft itself). The answer is recorded
    on the version the check left, and the draft sent again: one copy, no review."""
    draft = lapsed_claim_with_its_draft(rig, "k3", "notices")
    checked = a_check_after(rig, "delete_draft", "k3")
    assert rig.tick().recovered == 1
    assert checked == [True]
    history = rig.ledger.history("k3")
    assert [type(e).__name__ for e in history][-3:] == ["DraftsDeleted", "Checked", "DraftPending"]
    [fence] = [e for e in history if isinstance(e, SendJob.DraftsDeleted)]
    assert fence.draft_ids == [draft.draft_id]
    rig.tick()  # the draft known unsent: a new one, sent
    assert rig.job("k3").state is JobState.CONFIRMED, rig.events("k3")
    assert rig.copies("k3") == 1
    assert not [
        e for e in rig.ledger.history("k3") if isinstance(e, SendJob.DraftGone | SendJob.Escalated)
    ]


def test_a_decision_while_the_recovery_fences_the_draft_is_not_written_over(
    rig: EngineRig,
) -> None:
    """Only facts beside the state (a check, drafts deleted) let the recovery's answer
    onto a later version: a decision made meanwhile (here another daemon's escalation)
    stands, and the recovery's save is skipped as any conflicting step's is."""
    lapsed_claim_with_its_draft(rig, "k4", "notices")
    review = Review(NOTICES.ref, EscalationReason.HANDLE_UNRELIABLE)

    def escalated() -> None:
        rig.ledger.update("k4", lambda job: job.escalate(review, detail="", at=rig.clock()))

    after(rig, "delete_draft", escalated)
    report = rig.tick()
    assert report.recovered == 1 and report.skipped == 1
    assert rig.events("k4")[-1] == "Escalated"
    assert rig.job("k4").state is JobState.REVIEW


def test_a_daemon_killed_after_its_fence_deleted_the_draft_leaves_the_job_unknown(
    rig: EngineRig,
) -> None:
    """The recovery's fence deletes the lapsed claim's unsent draft, and the daemon dies
    before it saves what it learnt. The next daemon finds the draft gone under the fence
    recorded before the deletion: deleted by it, or sent by a person in the mailbox (a
    web client sends a draft under a message id of its own), which nothing it can read
    tells apart. It read the draft gone as the fence's doing ("not sent") and sent the
    job again, a second copy in the second case. Now the draft is `DraftGone`, and the
    channel's `on_unknown` decides (here review); nothing is sent again."""
    draft = lapsed_claim_with_its_draft(rig, "k5", "notices")

    def killed() -> None:
        raise SimulatedCrash("killed after the fence's deletion")

    after(rig, "delete_draft", killed)
    rig.tick(errors=1)
    assert draft.draft_id not in fake(rig).held_drafts  # deleted, its answer not saved
    rig.restart()
    rig.tick()
    history = rig.ledger.history("k5")
    assert not [e for e in history if isinstance(e, SendJob.DraftPending)]
    assert [type(e).__name__ for e in history][-3:] == ["DraftsDeleted", "DraftGone", "Escalated"]
    job = rig.job("k5")
    assert job.state is JobState.REVIEW and job.reason == EscalationReason.UNKNOWN_OUTCOME
    rig.tick()
    assert rig.copies("k5") == 0 and fake(rig).drafts_created == 1


# -- a quota scope handed over while the old owner fences a draft ---------------------

LEASE = 9.0


def two_daemons(rig: EngineRig) -> tuple[Engine, Engine]:
    """Daemons `a` and `b` sharing the rig's store and provider, its one quota scope
    owned through a lease (docs/architecture.md "Scope leases")."""
    rig.engine.close()
    engines = []
    for name in ("a", "b"):
        engine = Engine(rig.ledger, PolicyHolder(lambda: rig.policies), {"fake": rig.provider},
                        provider_timeouts={"fake": TIMEOUT}, clock=rig.clock,
                        elapsed=rig.clock.elapsed,
                        deadline_grace=GRACE, rng=random.Random(1), daemon_name=name,
                        scope_lease=LEASE)  # fmt: skip
        engines.append(rig.own(engine))
    return engines[0], engines[1]


@pytest.mark.parametrize("channel", ["notices", "legal"])
def test_a_scope_handed_over_while_its_old_owner_fences_a_draft_sends_nothing_again(
    rig: EngineRig, channel: str
) -> None:
    """`a` owns the mailbox's scope; its sweep of a lapsed claim finds the draft unsent,
    records its fence and deletes the draft. Before its answer is saved, `a` stalls past
    its scope's lease (a pause; its deletion's answer slow), `b` takes the scope and
    sweeps the job: it finds the draft gone under the fence, which `a`'s deletion or a
    person's send from the mailbox may have done. `b` read it as the fence's doing and,
    on `notices` (`pending_draft = "send"`), sent the job again. Now `b` records
    `DraftGone` (review: `on_unknown = "review"` on both channels), `a`'s answer then
    conflicts and is dropped, and nothing is sent again."""
    rig.submit(channel, "k6")
    fake(rig).script(Scripted.crash_during_call(stored=False))
    a, b = two_daemons(rig)
    assert a.tick().errors == 1  # `a` alone: it takes the scope; its call dies
    draft = recorded_draft(rig.job("k6"))
    assert draft is not None
    for _ in range(int(TIMEOUT + GRACE) + 1):  # the claim's lease lapses; `a` keeps its scope
        rig.clock.advance(1)
        a._balance_scopes()
    b_swept: list[int] = []

    def a_stalls_and_b_sweeps() -> None:  # on `a`'s check worker, the draft deleted
        rig.clock.advance(LEASE + GRACE)  # `a` renews nothing meanwhile
        b_swept.append(b.tick().recovered + 1)
        assert b.owners is not None and b.owners.owned() == ["fake"]

    after(rig, "delete_draft", a_stalls_and_b_sweeps)
    a.tick()
    assert b_swept and draft.draft_id not in fake(rig).held_drafts
    history = rig.ledger.history("k6")
    assert not [e for e in history if isinstance(e, SendJob.DraftPending)], rig.events("k6")
    [gone] = [e for e in history if isinstance(e, SendJob.DraftGone)]
    assert gone.draft_id == draft.draft_id
    for _ in range(3):
        rig.clock.advance(1)
        b.tick()
    job = rig.job("k6")
    assert job.state is JobState.REVIEW and rig.copies("k6") == 0
    assert job.reason == EscalationReason.UNKNOWN_OUTCOME
    assert rig.events("k6")[-2:] == ["DraftGone", "Escalated"]
    assert fake(rig).drafts_created == 1


# -- a claim that lost its race deletes its draft while another daemon reuses it ------


def test_a_lost_claims_draft_reused_by_the_next_claim_is_never_deleted_under_it(
    rig: EngineRig,
) -> None:
    """`a`'s draft step creates the job's draft; a person's check lands meanwhile, so
    `a`'s claim loses and `a` deletes the draft it made, the job's record having no
    draft. Between that read and the deletion, `b` (the mailbox's new owner) loads the
    job, finds `a`'s draft by its Message-ID, reuses it and claims; `a`'s deletion lands
    before `b`'s drafts.send: a 404, and the draft gone with no SENT copy (`DraftGone`),
    on this channel a review of a job the daemons knew unsent (`a` deleted it). The
    deletion is now recorded on the version `a` read before it is made, and a draft
    recorded deleted is never reused: `b` makes its own, one copy, no review."""
    rig.submit("notices", "k7")
    door = door_of(rig)
    b = rig.new_engine("b")
    provider = fake(rig)
    provider.during_create = Meanwhile(lambda: door.check("k7", by="alice"))
    deleting, sending = provider.delete_draft, provider.send_draft
    lands_first: list[str] = []

    def a_deletes(draft_id: str) -> bool:  # `a`'s claim lost: its draft deleted
        lands_first.append(draft_id)
        b.tick()  # `b` takes the job meanwhile
        return deleting(draft_id)

    def b_sends(draft: Draft) -> SendOutcome:  # `a`'s deletion reaches Gmail first
        for draft_id in lands_first:
            deleting(draft_id)
        return sending(draft)

    provider.delete_draft = a_deletes  # type: ignore[method-assign]
    provider.send_draft = b_sends  # type: ignore[method-assign]
    report = rig.tick()
    assert report.skipped == 1 and lands_first, report  # `a`'s claim lost
    history = rig.ledger.history("k7")
    assert not [e for e in history if isinstance(e, SendJob.DraftGone | SendJob.Escalated)], (
        rig.events("k7")
    )
    assert rig.job("k7").state is JobState.CONFIRMED, rig.events("k7")
    assert rig.copies("k7") == 1


def test_a_lost_claims_draft_is_deleted_at_once_beside_another_claim_in_flight(
    rig: EngineRig,
) -> None:
    """`b` claims the job with a draft of its own while `a`'s draft step runs, and its
    call is still out when `a`'s claim loses: nothing can be recorded on a job whose
    call is in flight, and `a`'s draft is deleted at once all the same (left, it would
    be one click from a second copy); `b`'s draft is the one left."""
    rig.submit("notices", "k8")
    b = rig.new_engine("b")
    provider = fake(rig)
    provider.script(Scripted.crash_during_call(stored=False))  # `b`'s call: never answered
    provider.during_create = Meanwhile(lambda: b.tick())
    assert rig.tick().skipped == 1  # `a`'s claim lost
    job = rig.job("k8")
    assert job.state is JobState.ATTEMPTED and job.draft_id is not None
    assert list(provider.held_drafts) == [job.draft_id]
    assert provider.drafts_created == 2


def test_a_lost_claims_draft_beside_the_new_owners_claim_is_left_to_it(rig: EngineRig) -> None:
    """`a`'s draft step runs while it stalls past its scope's lease; `b` takes the scope
    and claims the job with a draft of its own, its call out. `a`'s claim loses; nothing
    can be recorded beside `b`'s claim, and `a` deleted its draft at once, unrecorded,
    however long after that read. Stalled once more before that deletion, `b`'s attempt
    ended, its draft was found unsent and fenced, and its next claim found `a`'s draft
    by its Message-ID and reused it: `a`'s late deletion landed under that send (a 404,
    `DraftGone`, on this channel a review of a job known unsent). A scope no longer
    `a`'s, the draft is left to its new owner, as the tidy's and the fence's are."""
    rig.submit("notices", "k9")
    a, b = two_daemons(rig)
    provider = fake(rig)
    release = threading.Event()
    provider.script(Scripted.timed_out(release))  # `b`'s first call: out until released
    b_claims = threading.Thread(target=b.tick)

    def b_takes_the_scope_and_claims() -> None:  # at the start of `a`'s drafts.create
        rig.clock.advance(LEASE + GRACE)  # `a` renews nothing meanwhile
        b_claims.start()
        for _ in range(500):
            if rig.job("k9").state is JobState.ATTEMPTED:
                return
            time.sleep(0.01)
        raise AssertionError("`b` did not claim")

    went_on: list[bool] = []

    def b_goes_on() -> None:  # `b`'s call times out; its draft fenced, the job sent again
        went_on.append(True)
        release.set()
        b_claims.join(5)
        for _ in range(4):
            rig.clock.advance(1)
            b.tick()

    deleting, sending = provider.delete_draft, provider.send_draft
    lands_first: list[str] = []

    def a_deletes(draft_id: str) -> bool:  # `a`'s claim lost; `a` stalls once more
        if went_on:
            return deleting(draft_id)  # `b`'s own deletions
        lands_first.append(draft_id)
        b_goes_on()
        return deleting(draft_id)

    def b_sends(draft: Draft) -> SendOutcome:  # `a`'s deletion reaches Gmail first
        for draft_id in lands_first:
            deleting(draft_id)
        return sending(draft)

    provider.during_create = Meanwhile(b_takes_the_scope_and_claims)
    provider.delete_draft = a_deletes  # type: ignore[method-assign]
    provider.send_draft = b_sends  # type: ignore[method-assign]
    assert a.tick().skipped == 1  # `a`'s claim lost
    if not went_on:
        b_goes_on()
    history = rig.ledger.history("k9")
    assert not [e for e in history if isinstance(e, SendJob.DraftGone | SendJob.Escalated)], (
        rig.events("k9")
    )
    assert rig.job("k9").state is JobState.CONFIRMED, rig.events("k9")
    assert rig.copies("k9") == 1 and provider.drafts_created == 2
    assert not provider.held_drafts


# -- the draft check right after an unknown send, its scope moving between its calls ----


def test_a_draft_check_whose_scope_moved_after_its_first_call_reads_no_message(
    rig: EngineRig,
) -> None:
    """`a` sends the job's draft and the answer is lost (Unknown; the draft consumed). Its
    worker asks the draft at once: whether the scope is still `a`'s was asked before
    that check only, and the check is two calls (`drafts.get`, then `messages.get` of a
    draft found gone): `a` stalled past its scope's lease after the first made the second
    all the same, over the new owner's quota. It now asks before each: the second is not
    made, the outcome stays Unknown with the draft due to be asked, and `b`, the scope's
    owner now, asks it and confirms the job by it: one copy."""
    rig.submit("notices", "k10")
    a, b = two_daemons(rig)
    provider = fake(rig)
    provider.script(Scripted.dropped_response())
    checking = provider.check_draft
    stalled: list[int] = []

    def a_stalls_in_its_check(draft: Draft) -> Any:  # after `a`'s ask before the check
        if not stalled:
            stalled.append(provider.message_reads)
            rig.clock.advance(LEASE + GRACE)  # `a` renews nothing meanwhile
        return checking(draft)

    provider.check_draft = a_stalls_in_its_check  # type: ignore[method-assign]
    a.tick()
    assert stalled == [0] and provider.message_reads == 0, rig.events("k10")
    assert rig.job("k10").state is JobState.UNKNOWN
    assert rig.events("k10")[-1] == "Unknown"
    for _ in range(3):
        rig.clock.advance(1)
        b.tick()
    assert b.owners is not None and b.owners.owned() == ["fake"]
    assert provider.message_reads == 1  # `b`'s
    assert rig.job("k10").state is JobState.CONFIRMED, rig.events("k10")
    assert [c.via for c in rig.ledger.history("k10") if isinstance(c, SendJob.Confirmed)] == [
        ConfirmedVia.DRAFT
    ]
    assert rig.copies("k10") == 1


# -- a recorded draft gone from the mailbox before the claim that would send it ---------


def test_a_recorded_draft_gone_before_its_claim_is_reviewed_and_a_persons_resend_sends_anew(
    rig: EngineRig,
) -> None:
    """The job's draft was found unsent after its call (`DraftPending`, sent again next),
    and is gone before that claim: deleted in the mailbox here, though a person's Send
    there looks the same to the daemon (tests/integration/test_engine.py). A new draft
    is not made and sent: the job goes to review. A person's resend, made on its own
    search, is the decision the vanished draft lacked: a new draft is sent, one copy."""
    rig.submit("notices", "k11")
    provider = fake(rig)
    provider.script(Scripted.lost_request())
    rig.tick()
    assert rig.events("k11")[-2:] == ["Unknown", "DraftPending"]
    draft_id = rig.job("k11").draft_id
    assert draft_id is not None
    provider.delete_by_person(draft_id)
    rig.tick()
    job = rig.job("k11")
    assert job.state is JobState.REVIEW and job.reason == EscalationReason.UNKNOWN_OUTCOME
    assert provider.drafts_created == 1 and rig.copies("k11") == 0
    rig.clock.advance(61)  # the resend's own rule: the index has caught up (search_after)
    door_of(rig).resolve("k11", Resolution.RESEND, note="I deleted the draft", by="alice")
    rig.tick()
    assert rig.job("k11").state is JobState.CONFIRMED, rig.events("k11")
    assert provider.drafts_created == 2 and rig.copies("k11") == 1


def test_a_persons_resend_whose_claim_made_nothing_reviews_the_new_draft_gone(
    rig: EngineRig,
) -> None:
    """After a person's resend a claim made a new draft and no call sent it (refused as
    unavailable, as a stop's or a read-back's claim is: no attempt counted), so the draft
    waits in the mailbox; gone before the next claim (a person's Send there looks the
    same as this deletion), it is not the draft that person's search found gone: the job
    goes to review, not a third draft."""
    rig.submit("notices", "k12")
    provider = fake(rig)
    provider.script(Scripted.lost_request())
    rig.tick()
    first = rig.job("k12").draft_id
    assert first is not None
    provider.delete_by_person(first)
    rig.tick()
    assert rig.job("k12").state is JobState.REVIEW
    rig.clock.advance(61)
    door_of(rig).resolve("k12", Resolution.RESEND, note="I deleted the draft", by="alice")
    provider.script(Scripted.unavailable())
    rig.tick()
    second = rig.job("k12").draft_id
    assert rig.events("k12")[-2:] == ["Attempted", "Rejected"]
    assert second not in (None, first) and rig.job("k12").round_attempts == 0
    provider.delete_by_person(second)
    rig.advance_and_tick(3600)
    job = rig.job("k12")
    assert job.state is JobState.REVIEW, rig.events("k12")
    assert provider.drafts_created == 2 and rig.copies("k12") == 0


def test_a_persons_resend_seconds_after_a_hand_send_of_the_draft_waits_for_the_index(
    rig: EngineRig,
) -> None:
    """The job is in review with its draft unsent (`pending_draft = "review"`), its last
    attempt long past `search_after`. A person presses Send on the draft in the mailbox,
    whose client sends it under a message id of its own, and an operator resends the job
    seconds later: the resend's fence found the draft gone, its search missed the copy
    the index did not show yet (30 s lag here), and the resend sent a second copy. The
    draft found gone counts as a possible send: the resend is refused, "resend after"
    `search_after` from then, and then the search finds the one copy."""
    provider = fake(rig)
    provider.index_lag = 30
    rig.submit("legal", "k13")
    provider.script(Scripted.lost_request())
    rig.tick()
    job = rig.job("k13")
    assert job.state is JobState.REVIEW and job.draft_id is not None, rig.events("k13")
    rig.clock.advance(300)  # the last attempt is long past `search_after`
    provider.send_by_person(job.draft_id)
    rig.clock.advance(2)
    door = door_of(rig)
    with pytest.raises(ServiceError) as refused:
        door.resolve("k13", Resolution.RESEND, note="not in Sent", by="alice")
    assert refused.value.kind is Refusal.CONFLICT
    assert "its draft was found gone" in refused.value.message
    assert "resend after" in refused.value.message
    assert rig.job("k13").state is JobState.REVIEW and rig.job("k13").draft_id is None
    rig.tick()
    rig.clock.advance(30)  # not yet: still refused, nothing sent
    with pytest.raises(ServiceError):
        door.resolve("k13", Resolution.RESEND, note="not in Sent", by="alice")
    rig.clock.advance(31)
    with pytest.raises(ServiceError) as found:
        door.resolve("k13", Resolution.RESEND, note="not in Sent", by="alice")
    assert "resolve as sent" in found.value.message, found.value.message
    rig.tick()
    assert rig.copies("k13") == 1 and provider.drafts_created == 1
    assert rig.job("k13").state is JobState.REVIEW
