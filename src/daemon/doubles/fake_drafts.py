"""The in-memory provider with drafts (`send_via = "drafts"`), for engine tests: Gmail's
draft semantics without a socket (docs/providers.md "Gmail setup").

A draft is stored with its message id and sends nothing; sending it consumes it (the copy
keeps the draft's message id), so a second send of the same draft finds nothing (Unknown:
"gone", as Gmail's 404); `check_draft` answers from the drafts and the copies at once, with
no index lag, while the list by Message-ID (`find_drafts`) shows a draft only `index_lag`
after it was made, as Gmail's `drafts.list q=` does. Sends are scripted as for
FakeProvider (`Scripted`): a fate that stores nothing leaves the draft in place.
`replaces_message_id` replaces the Message-ID at the send, as Gmail is reported to.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from email.parser import BytesHeaderParser

from daemon.doubles.fake_provider import Copy, FakeProvider, Scripted, SimulatedCrash
from daemon.providers.base import (
    ProviderError,
    ScopeLost,
    SendKind,
    SendOutcome,
    next_call,
    stopped_before_send,
)
from daemon.providers.draft_handle import (
    BeforeDeleting,
    Draft,
    DraftCheck,
    DraftRefused,
    DraftsProvider,
    DraftStatus,
)


class FakeDraftsProvider(FakeProvider):
    send_via = "drafts"
    leaves_drafts = True

    def __init__(
        self,
        name: str = "fake-drafts",
        *,
        clock: Callable[[], datetime],
        index_lag: float = 0.0,
        replaces_message_id: bool = False,
    ) -> None:
        super().__init__(
            name, clock=clock, index_lag=index_lag, replaces_message_id=replaces_message_id
        )
        self.held_drafts: dict[str, tuple[str, str]] = {}  # draft id -> (Message-ID, message id)
        self.drafts_created = 0
        self.draft_sends = 0
        self._draft_ids = itertools.count(1)
        self._failing_creates = 0
        self._lost_creates = 0
        self._made_at: dict[str, datetime] = {}  # draft id -> when it was created
        self._refused_creates = 0
        self._failing_checks = 0
        self._crash_on_create = 0
        # Failures that say the provider is unavailable (counted toward the circuit).
        self._unavailable_creates = 0
        self._unavailable_checks = 0
        #: Called at the start of every drafts.create (a test's hook: time passing during
        #: the draft step, a person acting on the job while it runs).
        self.during_create: Callable[[], object] | None = None
        # Every draft ever made -> its Message-ID (kept after the draft is consumed), so
        # every drafts.send call counts against its job, a 404 included (invariant 1).
        self._made: dict[str, str] = {}
        # What a person checking a sent copy is shown (To, Subject), by draft id, as
        # FakeProvider.send_raw keeps them for its copies.
        self._shown: dict[str, tuple[str, str]] = {}
        self._raws: dict[str, bytes] = {}  # draft id -> its message as it is now
        self.raw_reads = 0  # `draft_raw` calls
        self.message_reads = 0  # a check's read of a gone draft's message (its second call)

    # -- scripting ----------------------------------------------------------------------

    def fail_creates(self, count: int) -> None:
        with self._lock:
            self._failing_creates += count

    def lose_create_answers(self, count: int) -> None:
        """The next creates store their draft, then their answer is lost (ProviderError:
        the caller cannot know a draft exists)."""
        with self._lock:
            self._lost_creates += count

    def refuse_creates(self, count: int) -> None:
        """The next creates are refused for good (DraftRefused: a 4xx, a missing scope)."""
        with self._lock:
            self._refused_creates += count

    def fail_checks(self, count: int) -> None:
        with self._lock:
            self._failing_checks += count

    def crash_on_create(self, count: int = 1) -> None:
        """The next creates store their draft, then the caller dies before it hears the
        answer (a crash between create and the save that would record it)."""
        with self._lock:
            self._crash_on_create += count

    def creates_unavailable(self, count: int) -> None:
        """The next creates fail as a refused connection does: nothing stored, and the
        failure counts toward the circuit (`fail_creates`: as a 500 does)."""
        with self._lock:
            self._unavailable_creates += count

    def checks_unavailable(self, count: int) -> None:
        """The next draft checks fail as a refused connection does."""
        with self._lock:
            self._unavailable_checks += count

    def delete_by_person(self, draft_id: str) -> None:
        """Someone deletes the draft in the mailbox (the GONE case)."""
        with self._lock:
            self.held_drafts.pop(draft_id, None)

    def send_by_person(self, draft_id: str) -> None:
        """Someone presses Send on the unsent draft in the mailbox, whose client sends it
        under a message id of its own (as the Gmail emulator's `send_draft_by_hand`): the
        draft is gone, its own message id is never SENT, and the copy, with the draft's
        Message-ID, shows in a search only `index_lag` later."""
        with self._lock:
            message_id, _ = self.held_drafts.pop(draft_id)
            provider_id = f"fake-{next(self._ids):06d}"
            shown = self._shown.get(draft_id, ("", ""))
            self.copies.append(Copy(provider_id, message_id, self.clock(), *shown))
            self._originals[provider_id] = message_id

    def edit_by_person(self, draft_id: str, raw: bytes) -> None:
        """Someone edits the unsent draft in the mailbox: what it would send is `raw`,
        its Message-ID included (the listing by Message-ID finds it by the new one, as
        the Gmail emulator's `edit_draft`)."""
        message_id = str(BytesHeaderParser().parsebytes(raw).get("Message-ID", "")).strip()
        with self._lock:
            assert draft_id in self.held_drafts, draft_id
            self._raws[draft_id] = raw
            self.held_drafts[draft_id] = (message_id, self.held_drafts[draft_id][1])

    # -- drafts ---------------------------------------------------------------------------

    def create_draft(self, raw: bytes) -> Draft:
        headers = BytesHeaderParser().parsebytes(raw)
        message_id = str(headers.get("Message-ID", "")).strip()
        shown = (str(headers.get("To", "")), str(headers.get("Subject", "")))
        hook = self.during_create
        if hook is not None:
            hook()
        with self._lock:
            if self._unavailable_creates:
                self._unavailable_creates -= 1
                raise ProviderError(
                    "drafts.create: connection refused (scripted)", unavailable=True
                )
            if self._failing_creates:
                self._failing_creates -= 1
                raise ProviderError("drafts.create failed (scripted)")
            if self._refused_creates:
                self._refused_creates -= 1
                raise DraftRefused("drafts.create: HTTP 400: refused (scripted)")
            self.drafts_created += 1
            draft = Draft(f"r{next(self._draft_ids):06d}", f"fake-{next(self._ids):06d}")
            self.held_drafts[draft.draft_id] = (message_id, draft.provider_message_id)
            self._made[draft.draft_id] = message_id
            self._shown[draft.draft_id] = shown
            self._raws[draft.draft_id] = raw
            self._made_at[draft.draft_id] = self.clock()
            if self._lost_creates:
                self._lost_creates -= 1
                raise ProviderError("drafts.create: response lost (scripted)")
            crash = self._crash_on_create > 0
            if crash:
                self._crash_on_create -= 1
        if crash:
            raise SimulatedCrash(f"crashed after creating draft {draft.draft_id}")
        return draft

    def send_draft(self, draft: Draft) -> SendOutcome:
        with self._lock:
            self.draft_sends += 1
            self.sends += 1
            ours = self._made.get(draft.draft_id, "")
            self.sends_by_message_id[ours] += 1
            call = self.sends_by_message_id[ours]
            if draft.draft_id not in self.held_drafts:
                return SendOutcome(SendKind.UNKNOWN, f"draft {draft.draft_id} is gone", status=404)
            fate = self._script.popleft() if self._script else Scripted.confirmed()
        if fate.hangs_until is not None:
            # In flight until released; the draft is consumed only when the call lands,
            # so a check meanwhile finds it still unsent.
            self.hang(ours, fate.hangs_until)
        with self._lock:
            held = self.held_drafts.get(draft.draft_id)
            if held is None:  # deleted while the call was out
                return SendOutcome(SendKind.UNKNOWN, f"draft {draft.draft_id} is gone", status=404)
            message_id, provider_id = held
            if fate.stored:
                del self.held_drafts[draft.draft_id]
                stored = (
                    f"<replaced-{provider_id}@fake>" if self.replaces_message_id else message_id
                )
                shown = self._shown.get(draft.draft_id, ("", ""))
                self.copies.append(Copy(provider_id, stored, self.clock(), *shown))
                self._originals[provider_id] = message_id
                self.stored_by_call.setdefault(message_id, []).append(call)
        if fate.crashes:
            raise SimulatedCrash(f"crashed while sending draft {draft.draft_id}")
        outcome = fate.outcome
        if outcome.kind is SendKind.CONFIRMED and fate.stored and fate.answers_id:
            return SendOutcome(SendKind.CONFIRMED, outcome.reason, provider_message_id=provider_id)
        return outcome

    def send_raw(self, raw: bytes) -> SendOutcome:
        """Create and send in one call (an engine that records no draft)."""
        return self.send_draft(self.create_draft(raw))

    def _scripted_get_failure(self) -> None:
        """(Under the lock.) A drafts.get that fails as scripted (`fail_checks`,
        `checks_unavailable`): the check and the read-back alike."""
        if self._unavailable_checks:
            self._unavailable_checks -= 1
            raise ProviderError("drafts.get: connection refused (scripted)", unavailable=True)
        if self._failing_checks:
            self._failing_checks -= 1
            raise ProviderError("drafts.get failed (scripted)")

    def check_draft(self, draft: Draft) -> DraftCheck:
        with self._lock:
            self._scripted_get_failure()
            if draft.draft_id in self.held_drafts:
                return DraftCheck(DraftStatus.PENDING)
        # Gone as a draft: its message is read in a second call, asked first as Gmail's
        # check asks (`next_call`), and counted.
        next_call(f"get {draft.provider_message_id}")
        with self._lock:
            self.message_reads += 1
            for copy in self.copies:
                if copy.provider_message_id == draft.provider_message_id:
                    return DraftCheck(DraftStatus.SENT, copy.provider_message_id, copy.message_id)
        return DraftCheck(DraftStatus.GONE)

    def draft_raw(self, draft: Draft) -> bytes | None:
        with self._lock:
            self.raw_reads += 1
            self._scripted_get_failure()
            if draft.draft_id not in self.held_drafts:
                return None
            return self._raws.get(draft.draft_id)

    def find_drafts(self, message_id: str) -> list[Draft]:
        with self._lock:
            listed_before = self.clock() - timedelta(seconds=self.index_lag)
            return [
                Draft(draft_id, provider_id)
                for draft_id, (held, provider_id) in self.held_drafts.items()
                if held == message_id and self._made_at[draft_id] <= listed_before
            ]

    def delete_draft(self, draft_id: str) -> bool:
        with self._lock:
            return self.held_drafts.pop(draft_id, None) is not None

    def drafts(self) -> DraftsProvider | None:
        # As Gmail's: drafts only in drafts mode (a test switches `send_via`, as a
        # restart with the setting changed would).
        return self if self.send_via == "drafts" else None

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        listed = [d.draft_id for d in self.find_drafts(message_id)]
        if before_deleting is not None:
            before_deleting(listed)
        return [draft_id for draft_id in listed if self.delete_draft(draft_id)]

    def unsent_drafts(self, message_id: str) -> int:
        """Drafts of `message_id` that are still unsent (a test's count, by the
        Message-ID we gave)."""
        with self._lock:
            return sum(1 for held, _ in self.held_drafts.values() if held == message_id)


class FakeGraphProvider(FakeDraftsProvider):
    """Microsoft Graph's send as the engine sees it (docs/architecture.md "Microsoft
    Graph"): each `send_raw` creates a draft and then sends it, so the engine records no
    draft (`drafts()` is None) but a send may leave one (`leaves_drafts`): a create whose
    answer was lost, a crash between create and send. A refused send deletes its draft.
    `search` reads only; `delete_drafts` is the fence. With an earlier attempt's draft
    still unsent, a send first asks whether its quota scope is still the daemon's, as
    Graph's tidy of that draft does (`next_call`): gone, it stops there, no attempt
    (`stopped_before_send`); the draft is left to the engine's fence."""

    send_via = "messages"

    def drafts(self) -> DraftsProvider | None:
        return None

    def send_raw(self, raw: bytes) -> SendOutcome:
        message_id = str(BytesHeaderParser().parsebytes(raw).get("Message-ID", "")).strip()
        try:
            if self.unsent_drafts(message_id):
                next_call(f"tidy the drafts of {message_id}")
            draft = self.create_draft(raw)
        except ScopeLost as lost:
            self._count_send(message_id, stopped=True)
            return stopped_before_send(lost)
        except ProviderError as exc:
            self._count_send(message_id)
            return SendOutcome(
                SendKind.REJECTED, f"create draft failed, not sent: {exc.reason}", transient=True
            )
        outcome = self.send_draft(draft)
        if outcome.kind is SendKind.REJECTED:
            self.delete_draft(draft.draft_id)
        return outcome

    def _count_send(self, message_id: str, *, stopped: bool = False) -> None:
        """A send that made no draft: one call of the port, as every send is counted;
        `stopped`: before any call that could send it (`sends_stopped`)."""
        with self._lock:
            self.sends += 1
            self.sends_stopped += stopped
            self.sends_by_message_id[message_id] += 1
