"""The provider contract: what every provider behind the port must do (docs/architecture.md
"Adding a provider", "Outcome classification"), written once and run by every provider,
after eventsourcing's recorder test cases (`eventsourcing/tests/persistence.py`: one set of
cases, a subclass per backend that says how to build one).

A provider's test class subclasses the cases it owes and gives a `subject` fixture: a
:class:`Subject`, the provider under test behind its fault point (the fault relay, the SMTP
fault relay, or the fake's script) with the effect counter at its server (the emulator's
acceptance log, the real mailbox's Maildir, the fake's own mailbox). Effects are counted
there, never through the provider. Which cases a class owes follows from what its provider
declares on the port (`ContractBase.test_the_cases_run_are_the_ones_declared`):

- :class:`SendContract`, every provider: the outcome of a send for each mode its fault point
  offers (the modes every fault point has, `COMMON_FAULTS`, plus the class's
  `EXTRA_FAULTS`), one request per send and the copies at the server; nothing sent and
  unavailable when nothing listens; a refusal for good is permanent, not unavailable; the
  search counts every copy whose Message-ID is exactly ours and names its query; the id a
  hit carries reads back; `read_message_id` never makes an answer up.
- :class:`ReadBackContract`, `response_ids_readable`: a confirmed send's id reads back our
  Message-ID, or the one the server put in its place.
- :class:`SearchFaultContract`, a search behind a fault point: a failed search is an error,
  never "no copies", unavailable only when the provider did not answer.
- :class:`LeavesDraftsContract`, `leaves_drafts`: a search never deletes a draft;
  `delete_drafts` (the fence) deletes exactly what a lost send left.
- :class:`DraftsContract`, `drafts()`: a draft sends nothing; sending it consumes it, once;
  its check answers at once whether it went.
"""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import ClassVar

import pytest

from daemon.engine.drafts import draft_difference
from daemon.providers.base import (
    Provider,
    ProviderError,
    SendKind,
    SendOutcome,
    calls_while,
)
from daemon.providers.draft_handle import DraftsProvider, DraftStatus
from testkit.relay import FaultPlan, FaultRelay, check_mode


@dataclass(frozen=True)
class Expect:
    """What a send meeting one fault must come to: the outcome's kind, the copies at the
    server, and for a rejection whether it is transient / unavailable, with Retry-After."""

    kind: SendKind
    copies: int
    transient: bool = False
    unavailable: bool = False
    retry_after: float | None = None
    timed_out: bool = False
    #: The HTTP status or SMTP reply code, where the class's table names one.
    status: int | None = None


CONFIRMED = Expect(SendKind.CONFIRMED, 1)
#: Rejected, waited out: nothing was sent and the provider cannot take anything now.
THROTTLED = Expect(SendKind.REJECTED, 0, transient=True, unavailable=True, retry_after=1.0)

#: The modes every fault point offers (the SMTP relay's four), and what each must come to
#: for every provider: "not sent" needs proof, so a request that may have been written is
#: Unknown whether or not it reached the server.
COMMON_FAULTS: dict[str, Expect] = {
    "pass": CONFIRMED,
    "fail-before-forward": Expect(SendKind.UNKNOWN, 0),
    "drop-response": Expect(SendKind.UNKNOWN, 1),
    "hang": Expect(SendKind.UNKNOWN, 1, timed_out=True),
}


def message(message_id: str, sender: str, to: str | None) -> bytes:
    """A complete message as the daemon sends one (CRLF, a Message-ID, a subject)."""
    msg = EmailMessage()
    msg["From"] = sender
    if to is not None:
        msg["To"] = to
    msg["Subject"] = "sendledger contract"
    msg["Message-ID"] = message_id
    msg.set_content("hello\n.leading dot line\n")
    return msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))


class Subject(ABC):
    """One provider under test: the provider behind its fault point, and its server."""

    #: The mailbox the provider sends as, and the recipients its server takes and refuses.
    sender: str
    recipient: str
    #: How long the fault point holds a `hang` before it lets go: a hung call must end at
    #: the provider's own timeout, before that.
    hang_seconds: float
    #: An id in the provider's form that names no stored message.
    missing_id: str

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def raw(self, message_id: str, *, to: str | None = "") -> bytes:
        return message(message_id, self.sender, self.recipient if to == "" else to)

    @abstractmethod
    def restarted(self) -> Provider:
        """Another instance on the same mailbox, behind the same fault point: what a
        daemon started after a crash searches with."""

    @abstractmethod
    def unreachable(self) -> Provider:
        """The provider as configured against an address where nothing listens."""

    @abstractmethod
    def fault(self, mode: str) -> None:
        """The next send request meets `mode` at the fault point."""

    @abstractmethod
    def sends_seen(self) -> int:
        """Send requests that reached the fault point, forwarded or not."""

    @abstractmethod
    def copies(self, message_id: str, expected: int) -> int:
        """Copies of `message_id` the server holds (delivery may lag: wait up to a few
        seconds for `expected`, then let anything late arrive)."""

    @abstractmethod
    def refused_for_good(self, message_id: str) -> bytes:
        """A message the server refuses for good (a 4xx/5xx that asking again won't fix)."""


class RelayedSubject(Subject):
    """A subject whose searches pass the fault point too."""

    @abstractmethod
    def search_fault(self, mode: str) -> None:
        """The next search request meets `mode` at the fault point."""


class HttpRelaySubject(RelayedSubject):
    """A subject behind `testkit.relay.FaultRelay` whose server (an emulator) logs one JSON
    line per accepted message in `log`."""

    relay: FaultRelay
    log: Path

    def fault(self, mode: str) -> None:
        self.relay.set_plan(FaultPlan(send=[check_mode(mode)]))

    def search_fault(self, mode: str) -> None:
        self.relay.set_plan(FaultPlan(search=[check_mode(mode)]))

    def sends_seen(self) -> int:
        return sum(1 for entry in self.relay.log if entry["kind"] == "send")

    def copies(self, message_id: str, expected: int) -> int:
        lines = self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []
        return sum(1 for line in lines if json.loads(line)["message_id"] == message_id)


class RewritingSubject(Subject):
    @abstractmethod
    def rewrite_message_ids(self) -> None:
        """From now on the server replaces the Message-ID of what it stores."""


class DraftsSubject(Subject):
    @abstractmethod
    def drafts_left(self, message_id: str) -> int:
        """Unsent drafts of `message_id` in the mailbox, counted at the server."""

    @abstractmethod
    def leave_draft(self, message_id: str) -> None:
        """What a send whose call was lost leaves behind: an unsent draft of `message_id`
        (Graph's create answered, its send never reached the server)."""


def drafts_left(subject: Subject, message_id: str) -> int:
    """The subject's count of unsent drafts (a provider that leaves drafts has one)."""
    assert isinstance(subject, DraftsSubject), "a provider that leaves drafts counts them"
    return subject.drafts_left(message_id)


def new_id(label: str) -> str:
    """A Message-ID no other case used (one real mailbox serves a whole module)."""
    return f"<contract-{label}-{uuid.uuid4().hex[:12]}@mail.example.com>"


class ContractBase:
    """What every provider's class shares: the subject and the check of what it owes."""

    subject: Subject

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The fault modes of the class's own fault point (pytest reads one such method
        per class, so it serves every case that takes a mode)."""
        cls = metafunc.cls
        for name, faults in (
            ("fault", {**COMMON_FAULTS, **getattr(cls, "EXTRA_FAULTS", {})}),
            ("search_fault", getattr(cls, "SEARCH_FAULTS", {})),
        ):
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, list(faults), ids=list(faults))

    @pytest.fixture(autouse=True)
    def _bind(self, subject: Subject) -> None:
        self.subject = subject

    def test_the_cases_run_are_the_ones_declared(self) -> None:
        """A provider that declares a capability runs its cases; one that does not, none."""
        provider = self.subject.provider
        assert isinstance(self, ReadBackContract) is provider.response_ids_readable
        assert isinstance(self, LeavesDraftsContract) is provider.leaves_drafts
        assert isinstance(self, DraftsContract) is (provider.drafts() is not None)
        assert isinstance(self, SendContract) or provider.drafts() is not None


class SendContract(ContractBase):
    #: Modes beyond COMMON_FAULTS that the class's fault point offers.
    EXTRA_FAULTS: ClassVar[Mapping[str, Expect]] = {}
    #: The query the provider sends for a Message-ID, `{id}` with its brackets and `{bare}`
    #: without.
    QUERY: ClassVar[str]

    def test_a_send_meeting_each_fault_is_one_request_and_the_copies_it_says(
        self, fault: str
    ) -> None:
        expect = {**COMMON_FAULTS, **self.EXTRA_FAULTS}[fault]
        subject, mid = self.subject, new_id(fault)
        subject.fault(fault)
        started = time.monotonic()
        outcome = subject.provider.send_raw(subject.raw(mid))
        assert time.monotonic() - started < subject.hang_seconds, "a hang outlived the timeout"
        assert outcome.kind is expect.kind, outcome
        assert subject.sends_seen() == 1, "a layer below send_raw sent again"
        assert subject.copies(mid, expect.copies) == expect.copies
        if outcome.kind is SendKind.CONFIRMED:
            assert outcome.provider_message_id
        leaves = subject.provider.leaves_drafts
        if outcome.kind is SendKind.REJECTED and leaves and subject.provider.drafts() is None:
            # A draft left by a refused send could be sent later, and the engine fences
            # only after an Unknown (a drafts provider's draft is recorded, and resent).
            assert drafts_left(subject, mid) == 0, "a refused send left a draft"
        said = (outcome.transient, outcome.unavailable, outcome.retry_after, outcome.timed_out)
        wanted = (expect.transient, expect.unavailable, expect.retry_after, expect.timed_out)
        assert said == wanted, outcome
        assert expect.status is None or outcome.status == expect.status, outcome
        # What reconciliation sees from a daemon started after a crash: it fences (any
        # unsent draft deleted), then counts; a plain provider has nothing to fence.
        restarted = subject.restarted()
        fenced = restarted.delete_drafts(mid)
        assert restarted.leaves_drafts or fenced == []
        assert len(restarted.search(mid).hits) == expect.copies
        assert subject.copies(mid, expect.copies) == expect.copies
        assert not leaves or drafts_left(subject, mid) == 0

    def test_a_send_told_its_scope_is_gone_is_made_or_no_attempt(self) -> None:
        """Told before its first call that its quota scope went to another daemon
        (`calls_while`): a send either makes its call, which the dispatch allowed right
        before it (a send of one call asks nothing more), or stops before any call that
        could send the message: Rejected, transient, `not_attempted`, no send request."""
        subject, mid = self.subject, new_id("scope-gone")
        outcome, sends = send_with_its_scope_gone(subject, mid)
        assert outcome.not_attempted or sends == 1, outcome

    def test_nothing_listening_is_not_sent_and_unavailable(self) -> None:
        subject, mid = self.subject, new_id("refused")
        down = subject.unreachable()
        outcome = down.send_raw(subject.raw(mid))
        assert (outcome.kind, outcome.transient, outcome.unavailable) == (
            SendKind.REJECTED,
            True,
            True,
        ), outcome
        for call in (lambda: down.search(mid), down.ping):
            with pytest.raises(ProviderError) as caught:
                call()
            assert caught.value.unavailable
        assert subject.copies(mid, 0) == 0

    def test_a_refusal_for_good_is_permanent_not_unavailable(self) -> None:
        subject, mid = self.subject, new_id("refusal")
        outcome = subject.provider.send_raw(subject.refused_for_good(mid))
        assert (outcome.kind, outcome.transient, outcome.unavailable) == (
            SendKind.REJECTED,
            False,
            False,
        ), outcome
        assert subject.copies(mid, 0) == 0

    def test_the_search_counts_every_copy_of_exactly_our_message_id(self) -> None:
        subject, mid = self.subject, new_id("search")
        longer = mid.replace(">", ".other>")  # a substring match would count it
        for sent in (mid, mid, longer):
            assert subject.provider.send_raw(subject.raw(sent)).kind is SendKind.CONFIRMED
        assert subject.copies(mid, 2) == 2 and subject.copies(longer, 1) == 1
        result = subject.restarted().search(mid)
        assert [hit.message_id_header for hit in result.hits] == [mid, mid]
        assert result.copies == [hit.provider_message_id for hit in result.hits]
        assert len(set(result.copies)) == 2
        assert self.QUERY.format(id=mid, bare=mid.strip("<>")) in result.query
        for hit in result.hits:  # what a person checking the copy is shown
            assert subject.recipient in hit.to and hit.subject == "sendledger contract"
            assert subject.provider.read_message_id(hit.provider_message_id) == mid
        never = new_id("never-sent")
        miss = subject.provider.search(never)
        assert miss.hits == () and never.strip("<>") in miss.query
        subject.provider.ping()

    def test_read_message_id_never_makes_an_answer_up(self) -> None:
        subject, mid = self.subject, new_id("readback")
        outcome = subject.provider.send_raw(subject.raw(mid))
        assert outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id
        with pytest.raises(ProviderError):
            subject.provider.read_message_id(subject.missing_id)
        if not subject.provider.response_ids_readable:
            # The id a confirmed send returns names no stored copy (an SMTP queue id).
            with pytest.raises(ProviderError):
                subject.provider.read_message_id(outcome.provider_message_id)


class ReadBackContract(ContractBase):
    subject: RewritingSubject

    def test_a_confirmed_sends_id_reads_back_the_message_id_stored(self) -> None:
        subject, mid = self.subject, new_id("kept")
        outcome = subject.provider.send_raw(subject.raw(mid))
        assert outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id
        assert subject.provider.read_message_id(outcome.provider_message_id) == mid
        subject.rewrite_message_ids()
        replaced = new_id("replaced")
        outcome = subject.provider.send_raw(subject.raw(replaced))
        assert outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id
        stored = subject.provider.read_message_id(outcome.provider_message_id)
        assert stored is not None and stored != replaced  # the engine: handle unreliable
        assert subject.restarted().search(replaced).hits == ()  # why it must check


class SearchFaultContract(ContractBase):
    subject: RelayedSubject
    #: Search fault mode -> whether the error says the provider is unavailable, and the
    #: Retry-After it carries.
    SEARCH_FAULTS: ClassVar[Mapping[str, tuple[bool, float | None]]]

    def test_a_failed_search_is_an_error_never_no_copies(self, search_fault: str) -> None:
        subject, mid = self.subject, new_id("search-fault")
        assert subject.provider.send_raw(subject.raw(mid)).kind is SendKind.CONFIRMED
        subject.search_fault(search_fault)
        with pytest.raises(ProviderError) as caught:
            subject.restarted().search(mid)
        unavailable, retry_after = self.SEARCH_FAULTS[search_fault]
        said = (caught.value.unavailable, caught.value.retry_after)
        assert said == (unavailable, retry_after), caught.value
        assert caught.value.timed_out is (search_fault == "hang")


class LeavesDraftsContract(ContractBase):
    subject: DraftsSubject

    def test_a_search_never_deletes_a_draft_and_the_fence_deletes_it(self) -> None:
        """A person's check may run between a send's create and its send: the draft it
        would delete is the one in flight (docs/architecture.md "Drafts never outlive their
        job"). The fence before a resend deletes it; then one send is one copy."""
        subject, mid = self.subject, new_id("fence")
        subject.leave_draft(mid)
        assert subject.copies(mid, 0) == 0
        restarted = subject.restarted()
        assert restarted.search(mid).hits == ()
        assert subject.drafts_left(mid) == 1
        assert len(restarted.delete_drafts(mid)) == 1
        assert subject.drafts_left(mid) == 0 and restarted.delete_drafts(mid) == []
        assert restarted.send_raw(subject.raw(mid)).kind is SendKind.CONFIRMED
        assert subject.copies(mid, 1) == 1 and subject.drafts_left(mid) == 0

    def test_a_send_stopped_before_its_call_by_its_scope_is_no_attempt(self) -> None:
        """A lost send left a draft; the next send of the message is told its scope went
        to another daemon. One that tidies the earlier draft first (Graph) asks before
        it and stops there: no attempt (`not_attempted`: the engine does not count it
        against `max_attempts`), nothing sent, the draft left to the new owner's fence;
        one that does not makes its call, which the dispatch allowed. Either way one
        copy at most once the fence ran and the owner sent."""
        subject, mid = self.subject, new_id("scope-gone-tidy")
        subject.leave_draft(mid)
        outcome, sends = send_with_its_scope_gone(subject, mid)
        assert outcome.not_attempted or sends == 1, outcome
        owner = subject.restarted()
        owner.delete_drafts(mid)
        if outcome.not_attempted:
            assert subject.drafts_left(mid) == 0
            assert owner.send_raw(subject.raw(mid)).kind is SendKind.CONFIRMED
        assert subject.copies(mid, 1) == 1


def send_with_its_scope_gone(subject: Subject, message_id: str) -> tuple[SendOutcome, int]:
    """A send made while `next_call` says the scope is gone, and the send requests that
    reached the server for it. Whatever the provider answers, `not_attempted` is only
    ever said of a transient refusal that made no send request and left no copy."""
    before = subject.sends_seen()
    with calls_while(lambda: False):
        outcome = subject.provider.send_raw(subject.raw(message_id))
    sends = subject.sends_seen() - before
    if outcome.not_attempted:
        assert (outcome.kind, outcome.transient, sends) == (SendKind.REJECTED, True, 0), outcome
        assert subject.copies(message_id, 0) == 0
    return outcome, sends


#: A drafts send meeting each fault: its outcome's kind, the copies, and the draft after it.
DRAFT_FAULTS: dict[str, tuple[SendKind, int, DraftStatus]] = {
    "drop-response": (SendKind.UNKNOWN, 1, DraftStatus.SENT),
    "fail-before-forward": (SendKind.UNKNOWN, 0, DraftStatus.PENDING),
    "hang": (SendKind.UNKNOWN, 1, DraftStatus.SENT),
    "429": (SendKind.REJECTED, 0, DraftStatus.PENDING),
}


class DraftsContract(ContractBase):
    subject: DraftsSubject

    @property
    def drafts(self) -> DraftsProvider:
        drafts = self.subject.provider.drafts()
        assert drafts is not None
        return drafts

    def test_a_draft_sends_nothing_until_sent_once(self) -> None:
        subject, mid, other = self.subject, new_id("draft"), new_id("other-draft")
        draft = self.drafts.create_draft(subject.raw(mid))
        self.drafts.create_draft(subject.raw(other))
        assert subject.copies(mid, 0) == 0 and subject.drafts_left(mid) == 1
        assert self.drafts.check_draft(draft).status is DraftStatus.PENDING
        assert self.drafts.find_drafts(mid) == [draft]
        outcome = self.drafts.send_draft(draft)
        assert outcome.kind is SendKind.CONFIRMED
        assert outcome.provider_message_id == draft.provider_message_id
        check = self.drafts.check_draft(draft)
        assert (check.status, check.message_id_header) == (DraftStatus.SENT, mid)
        # The provider itself refuses a second send of the same draft.
        assert self.drafts.send_draft(draft).kind is SendKind.UNKNOWN
        assert subject.copies(mid, 1) == 1 and subject.drafts_left(mid) == 0
        assert self.drafts.find_drafts(mid) == [] and subject.drafts_left(other) == 1

    @pytest.mark.parametrize("draft_fault", list(DRAFT_FAULTS))
    def test_a_drafts_send_meeting_a_fault_is_settled_by_the_draft(self, draft_fault: str) -> None:
        kind, copies, status = DRAFT_FAULTS[draft_fault]
        subject, mid = self.subject, new_id(f"draft-{draft_fault}")
        draft = self.drafts.create_draft(subject.raw(mid))
        subject.fault(draft_fault)
        outcome: SendOutcome = self.drafts.send_draft(draft)
        assert outcome.kind is kind and subject.sends_seen() == 1
        assert outcome.kind is not SendKind.REJECTED or outcome.transient
        assert subject.copies(mid, copies) == copies
        assert self.drafts.check_draft(draft).status is status  # at once: no index
        if status is DraftStatus.PENDING:  # never sent: the same draft goes now, once
            assert self.drafts.send_draft(draft).kind is SendKind.CONFIRMED
            assert subject.copies(mid, 1) == 1

    def test_a_draft_reads_back_as_it_was_made_until_it_is_sent(self) -> None:
        """`draft_raw`: what the draft would send now (held to the job's render before a
        draft made earlier is sent); None once it is no unsent draft."""
        subject, mid = self.subject, new_id("read-back")
        raw = subject.raw(mid)
        draft = self.drafts.create_draft(raw)
        held = self.drafts.draft_raw(draft)
        assert held is not None and draft_difference(held, raw) is None
        assert self.drafts.send_draft(draft).kind is SendKind.CONFIRMED
        assert self.drafts.draft_raw(draft) is None

    def test_a_deleted_draft_is_gone_not_sent(self) -> None:
        subject, mid = self.subject, new_id("deleted")
        draft = self.drafts.create_draft(subject.raw(mid))
        assert self.drafts.delete_draft(draft.draft_id) is True
        assert self.drafts.delete_draft(draft.draft_id) is False
        assert self.drafts.check_draft(draft).status is DraftStatus.GONE
        assert self.drafts.send_draft(draft).kind is SendKind.UNKNOWN
        assert subject.copies(mid, 0) == 0
