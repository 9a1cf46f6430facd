"""GmailProvider's drafts handle (`send_via = "drafts"`) on the real client stack ->
FaultRelay -> GmailEmulator.

Effects are counted in the emulator's acceptance log (one line per message sent, nothing
for a draft created); requests that reached the relay in `relay.log`. Emulator results,
not a Gmail guarantee: `sendledger probe` checks the same against a real mailbox.

What every drafts provider must do is the provider contract's drafts cases
(tests/provider_contract.py), which `TestGmailDraftsContract` runs here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import pytest
from tests.integration.conftest import GmailSubject, asked_at_most
from tests.provider_contract import DraftsContract, LeavesDraftsContract, ReadBackContract
from tests.unit.jobs import CHANNEL, KEY, MESSAGE_ID, requested_job

from daemon.doubles.fake_time import FakeClock
from daemon.engine.drafts import DraftChanged, NotOurs, prepare_draft
from daemon.providers.base import ScopeLost, SendKind, calls_while
from daemon.providers.draft_handle import Draft, DraftRefused, DraftStatus
from daemon.providers.gmail import DRAFT_SCOPES, SCOPES, GmailProvider, MissingScope
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.job import DRAFTS_FENCE, SendJob
from ledger.message import render_checked
from ledger.vocabulary import EscalationReason, JobState, Resolution
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit.credentials import write_authorized_user, write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]
MAILBOX = "support@example.com"
MID = "<job-0123456789abcdef0123456789abcdef@mail.example.com>"
OTHER = "<job-ffffffffffffffffffffffffffffffff@mail.example.com>"


def sent_lines(acceptance_log: Path) -> int:
    """Messages sent (acceptance log lines), whatever Message-ID they ended up with."""
    if not acceptance_log.exists():
        return 0
    return len(acceptance_log.read_text(encoding="utf-8").splitlines())


@pytest.fixture
def drafts_provider(gmail_provider: GmailProviderFactory) -> GmailProviderFactory:
    def make(url: str | None = None, **overrides: object) -> GmailProvider:
        return gmail_provider(url, send_via="drafts", **overrides)

    return make


class TestGmailDraftsContract(DraftsContract, LeavesDraftsContract, ReadBackContract):
    subject: GmailSubject

    @pytest.fixture(name="subject")
    def drafts_subject(self, gmail_subject: Callable[..., GmailSubject]) -> GmailSubject:
        return gmail_subject(send_via="drafts")


def test_drop_response_on_a_drafts_send_of_a_rewritten_message_id_is_settled_by_the_draft(
    drafts_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    acceptance_log: Path,
    make_raw: RawFactory,
) -> None:
    """Gmail replaced our Message-ID: no search can find the copy, the draft still says."""
    emulator.rewrite_message_id = True
    provider = drafts_provider()
    draft = provider.create_draft(make_raw(MID))
    relay.set_plan(FaultPlan(send="drop-response"))
    assert provider.send_draft(draft).kind is SendKind.UNKNOWN
    assert sent_lines(acceptance_log) == 1  # the send happened; only its answer was lost
    check = provider.check_draft(draft)  # at once: no index in between
    assert (check.status, check.provider_message_id) == (
        DraftStatus.SENT,
        draft.provider_message_id,
    )
    assert check.message_id_header != MID and emulator.copies(MID) == 0


def test_find_drafts_names_exactly_the_drafts_of_one_message_id(
    drafts_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = drafts_provider(page_size=1)  # paging is followed
    first = provider.create_draft(make_raw(MID))
    second = provider.create_draft(make_raw(MID))
    provider.create_draft(make_raw(OTHER))
    sent = provider.create_draft(make_raw(MID))
    provider.send_draft(sent)
    found = provider.find_drafts(MID)
    assert sorted(d.draft_id for d in found) == sorted([first.draft_id, second.draft_id])
    for draft in found:
        assert provider.delete_draft(draft.draft_id)
    assert provider.find_drafts(MID) == []
    assert len(emulator.drafts(MAILBOX)) == 1  # OTHER's is left alone


def test_send_raw_on_a_drafts_provider_sends_one_copy_through_a_draft(
    drafts_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    acceptance_log: Path,
    make_raw: RawFactory,
) -> None:
    outcome = drafts_provider().send_raw(make_raw(MID))
    assert outcome.kind is SendKind.CONFIRMED
    [entry] = emulator.accepted()
    assert entry["via"] == "drafts.send"
    assert entry["id"] == outcome.provider_message_id
    assert emulator.drafts(MAILBOX) == {}


# -- the gmail.compose scope --------------------------------------------------------------


@pytest.fixture
def no_compose(tmp_path: Path) -> Iterator[GmailEmulator]:
    with GmailEmulator(grantable_scopes=SCOPES, acceptance_log=tmp_path / "a.jsonl") as emu:
        yield emu


@pytest.mark.parametrize("kind", ["service_account", "authorized_user"])
def test_the_start_up_check_names_a_missing_compose_scope(
    tmp_path: Path, no_compose: GmailEmulator, kind: str, make_raw: RawFactory
) -> None:
    writer = write_service_account if kind == "service_account" else write_authorized_user
    credentials = writer(tmp_path / "creds.json", token_uri=no_compose.token_uri)
    user = MAILBOX if kind == "service_account" else "me"
    provider = GmailProvider(
        "test",
        credentials_file=credentials,
        user=user,
        api_endpoint=no_compose.url,
        token_uri=no_compose.token_uri,
        send_via="drafts",
    )
    try:
        with pytest.raises(MissingScope, match=r"gmail\.compose"):
            provider.check_access()
    finally:
        provider.close()
    # The same credentials are fine for messages.send, which asks for no compose scope.
    plain = GmailProvider(
        "test",
        credentials_file=credentials,
        user=user,
        api_endpoint=no_compose.url,
        token_uri=no_compose.token_uri,
    )
    try:
        plain.check_access()
        assert plain.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    finally:
        plain.close()


def test_the_start_up_check_passes_when_compose_is_granted(
    tmp_path: Path, make_raw: RawFactory
) -> None:
    with GmailEmulator(grantable_scopes=DRAFT_SCOPES) as emulator:
        sa = write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)
        provider = GmailProvider(
            "test",
            credentials_file=sa,
            user=MAILBOX,
            api_endpoint=emulator.url,
            send_via="drafts",
        )
        try:
            provider.check_access()
            assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
        finally:
            provider.close()


def test_a_draft_without_the_compose_scope_is_refused_naming_it(
    gmail_provider: GmailProviderFactory, acceptance_log: Path, make_raw: RawFactory
) -> None:
    provider = gmail_provider()  # send_via = "messages": no compose scope asked for
    with pytest.raises(DraftRefused, match=r"gmail\.compose"):
        provider.create_draft(make_raw(MID))
    assert sent_lines(acceptance_log) == 0


def test_the_daemon_refuses_to_start_naming_the_provider_and_the_scope(
    tmp_path: Path, no_compose: GmailEmulator
) -> None:
    from daemon.config.settings import ConfigError
    from daemon.runtime import check_provider_access

    sa = write_service_account(tmp_path / "sa.json", token_uri=no_compose.token_uri)
    provider = GmailProvider(
        "support",
        credentials_file=sa,
        user=MAILBOX,
        api_endpoint=no_compose.url,
        send_via="drafts",
    )
    try:
        with pytest.raises(ConfigError) as caught:
            check_provider_access({"support": provider})
    finally:
        provider.close()
    message = str(caught.value)
    assert message.startswith("providers.support.credentials_file: ")
    assert "gmail.compose" in message and "\n" not in message


# -- a draft made earlier is held to the job's render before it is sent ---------------------


def test_a_draft_edited_in_the_mailbox_is_found_changed_and_never_sent(
    drafts_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    relay: FaultRelay,
    acceptance_log: Path,
    clock: FakeClock,
) -> None:
    """The job's draft waits in the shared mailbox (recorded, not sent yet); a person
    edits its recipients in Gmail. The next attempt reads it back (`drafts.get
    format=raw`, the one call the reuse made before, `format=minimal`) and finds it no
    longer the job's: nothing is sent. Unedited, the same read lets it be reused."""
    provider = drafts_provider()
    job = requested_job(clock)
    raw = render_checked(job)
    draft, created = prepare_draft(job, provider, raw, clock.now)
    assert created
    before = len(relay.log)
    assert prepare_draft(job, provider, raw, clock.now) == (draft, False)
    reads = [(e["method"], e["path"]) for e in relay.log[before:]]
    assert len(reads) == 1 and "format=raw" in reads[0][1], reads  # the reuse's one call
    emulator.edit_draft(draft.draft_id, raw.replace(b"To: ", b"To: mallory@evil.example, "))
    with pytest.raises(DraftChanged, match="to differs"):
        prepare_draft(job, provider, raw, clock.now)
    assert sent_lines(acceptance_log) == 0 and emulator.drafts_of(job.message_id, MAILBOX) == 1


def _draft_changed_in_review(
    provider: GmailProvider, emulator: GmailEmulator, clock: FakeClock
) -> tuple[Services, str, bytes]:
    """Job `order-42` in review as `draft-changed`: its recorded draft edited by a person
    in Gmail, its Message-ID too (the listing by the job's Message-ID misses it). A door
    on the provider, the draft's id and the job's render."""
    chosen = ChannelPolicy.model_validate(
        {
            "channel": CHANNEL,
            "provider": "gmail",
            "from": "Support <support@example.com>",
            "message_id_domain": "mail.example.com",
        }
    )
    ledger = Ledger("memory://", clock=clock)
    job = requested_job(clock)
    raw = render_checked(job)
    draft, _ = prepare_draft(job, provider, raw, clock.now)
    edited = raw.replace(b"Subject: ", b"Subject: URGENT ")
    emulator.edit_draft(draft.draft_id, edited.replace(b"Message-ID: <", b"Message-ID: <edited."))
    with pytest.raises(DraftChanged):
        prepare_draft(job, provider, raw, clock.now)
    job.escalate(Review(chosen.ref, EscalationReason.DRAFT_CHANGED), detail="edited", at=clock.now)
    ledger.save_job(job)
    door = Services(
        ledger,
        lambda: ChannelPolicies(PolicySet({CHANNEL: chosen})),
        providers=lambda name: nullcontext(provider),
        draft_providers=frozenset({"gmail"}),
    )
    return door, draft.draft_id, raw


def test_a_resend_of_a_draft_changed_job_deletes_the_edited_draft_first(
    drafts_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    acceptance_log: Path,
    clock: FakeClock,
) -> None:
    """The operator resends without deleting the edited draft: the resend deletes it by
    its recorded id (`drafts.delete`), so the next attempt makes a new draft from the job
    and sends that one; the edited draft can never be sent."""
    provider = drafts_provider()
    door, draft_id, raw = _draft_changed_in_review(provider, emulator, clock)
    door.resolve(KEY, Resolution.RESEND, note="", by="alice")
    deleted = [e for e in door.ledger.history(KEY) if isinstance(e, SendJob.DraftsDeleted)]
    assert [(e.why, e.draft_ids) for e in deleted] == [(DRAFTS_FENCE, [draft_id])]
    assert emulator.drafts_of(MESSAGE_ID, MAILBOX) == 0 and sent_lines(acceptance_log) == 0
    job = door.job(KEY)
    draft, created = prepare_draft(job, provider, raw, clock.now)  # the next attempt's
    assert created and draft.draft_id != draft_id
    assert provider.send_draft(draft).kind is SendKind.CONFIRMED
    assert sent_lines(acceptance_log) == 1 and emulator.copies(MESSAGE_ID) == 1


def test_a_resend_after_a_person_sent_the_edited_draft_is_refused_and_sends_nothing(
    drafts_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    acceptance_log: Path,
    clock: FakeClock,
) -> None:
    provider = drafts_provider()
    door, draft_id, _ = _draft_changed_in_review(provider, emulator, clock)
    person = provider.send_draft(Draft(draft_id, ""))  # Send pressed in Gmail
    assert person.kind is SendKind.CONFIRMED and sent_lines(acceptance_log) == 1
    with pytest.raises(ServiceError, match="1 copy found") as refused:
        door.resolve(KEY, Resolution.RESEND, note="", by="alice")
    assert refused.value.kind is Refusal.CONFLICT
    assert door.job(KEY).state is JobState.REVIEW and sent_lines(acceptance_log) == 1


def test_a_drafts_deletion_whose_scope_moved_makes_no_further_call(
    drafts_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    """Deleting a message's drafts (a tidy, a sweep's fence of a job without a recorded
    draft) is several calls: drafts.list, a drafts.get of each listed draft's header,
    a drafts.delete of each. Like Graph's, it asks before each further call whether the
    mailbox's quota scope is still the daemon's (`calls_while`, set by the engine), and
    once it is not it stops there (ScopeLost): its calls went on beside the new owner's,
    over the mailbox's quota. The drafts not deleted are left to the new owner."""
    provider = drafts_provider()
    made = {provider.create_draft(make_raw(MID)).draft_id for _ in range(2)}
    asked = 0

    def ours() -> bool:  # the first further call is still the daemon's, not the next
        nonlocal asked
        asked += 1
        return asked <= 1

    before = len(relay.log)
    with calls_while(ours), pytest.raises(ScopeLost):
        provider.delete_drafts(MID)
    calls = [(e["method"], e["path"]) for e in relay.log[before:] if "/drafts" in e["path"]]
    assert len(calls) == 2 and not [c for c in calls if c[0] == "DELETE"], calls
    assert set(emulator.drafts(MAILBOX)) == made
    assert sorted(provider.delete_drafts(MID)) == sorted(made)  # the new owner's
    assert emulator.drafts(MAILBOX) == {}


def test_a_draft_step_whose_scope_moved_looks_up_no_further_draft(
    drafts_provider: GmailProviderFactory, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """The draft step of a job with no recorded draft first looks for one an earlier run
    made and never recorded (`drafts.list`, a `drafts.get` of each listed draft, then its
    read-back): it asked whether the mailbox's quota scope was still the daemon's only
    right before `drafts.create`, so its look-up went on under the new owner's quota and a
    draft found was reused, the job claimed by a daemon no longer its scope's. Now each
    further call asks: stopped, nothing is reused or made (NotOurs), the job stays due."""
    provider = drafts_provider()
    job = requested_job(clock)
    raw = render_checked(job)
    left = {provider.create_draft(raw).draft_id for _ in range(2)}  # runs that crashed
    before = dict(emulator.route_counts)
    with pytest.raises(NotOurs):
        prepare_draft(job, provider, raw, clock.now, may_create=asked_at_most(0))
    made = {
        n: c - before.get(n, 0) for n, c in emulator.route_counts.items() if c != before.get(n, 0)
    }
    assert made == {"drafts.list": 1}, made
    assert job.draft_id is None and set(emulator.drafts(MAILBOX)) == left
    draft, created = prepare_draft(job, provider, raw, clock.now)  # the owner's
    assert not created and draft.draft_id in left
