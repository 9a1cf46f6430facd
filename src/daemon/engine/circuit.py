"""A circuit per provider scope: an outage is waited out, not escalated.

A send that provably left nothing because the provider is unavailable (connection refused,
DNS, connect timeout, TLS handshake, 429 and quota errors, SMTP 421 before DATA; the
`unavailable` outcomes of ``daemon/providers/classify.py``) says nothing about the job and
everything about the provider. After `failures` of them in a row the scope's circuit opens:
its jobs stay `requested` and none is taken, except one probe at a backoff (doubling up to
`probe_max`, never sooner than the provider's Retry-After). Any other answer (a
confirmation, a definite refusal, an unknown outcome) closes it, except a 503: a send
answered 503 stays Unknown for its job (it may have been sent), but for the circuit it says
the provider is down, so the scope's other jobs wait instead of each becoming Unknown. A
scope is the provider's name, or its name and mailbox where the quota is per mailbox
(`Provider.scope`).

Every call of a scope counts, not only sends: a search, a verification, a draft's check,
a read-back and the draft step before a claim (`called`). A failed search that proved
the provider unavailable opens the circuit as a failed send does, and while it is open
the scope's due searches wait as its sends do, one of them (or one send) being the probe:
sends and checks take the probe in turn when both wait.
What the circuit decides is only when to call: a held or failed search is never a miss,
and a held send is never an attempt.

A call that timed out is a hang, and counts as "unavailable" (its job stays Unknown): while
calls of its scope that started before it are still in flight, the scope takes no new send
(they are likely hung too, and each new send would be one more Unknown), and once the
circuit is open its sends are probed by a `Provider.ping`, which sends nothing, before one
send goes out again; a second of those calls timing out opens the circuit at once. So a
hang costs at most the calls already in flight when it began. An answer clears only the
failures of calls that began before its own call (each call's ticket, `call`): one read
late, given before the hang (a paused daemon), closes nothing the hang opened.
A send admitted before the hang was known but not yet called (its claim being saved) is
not made once it is known (`sending`): its job is refused as unavailable, nothing sent.

A send the provider closed with no response at all (`SendOutcome.unanswered`) is the
ordinary ambiguous outcome (a provider that took the message and lost its answer), an
answer here like any Unknown. Only a run of them in a scope, no send answered in between
(its sends' channels' `pause_after_unanswered`), pauses the scope's sends (`sent`, `_Pause`):
a proxy or a front end closing every send, where each send taken would be one more Unknown,
one more search and one more review. A pause holds sends only: the scope's searches, how the
daemon learns whether those sends went out, go on, and their answers neither end it nor are
held behind it; it ends when a send answers, the probe at the circuit's backoff.

In memory: a restarted daemon finds out again within `failures` calls. docs/operations.md, "Outages
and quotas".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from daemon.providers.base import ProviderError, SendKind, SendOutcome
from policies.decisions import retry_after_wait

log = logging.getLogger("sendledger.engine")


@dataclass(frozen=True)
class CircuitSettings:
    failures: int = 3  # unavailable outcomes in a row that open a circuit
    probe_after: float = 1.0  # seconds before the first probe of an open circuit
    probe_max: float = 60.0  # the longest wait between probes

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"failures must be at least 1, got {self.failures!r}")
        if not 0 < self.probe_after <= self.probe_max:
            raise ValueError("need 0 < probe_after <= probe_max")


def send_unavailable(outcome: SendOutcome) -> bool:
    """Whether a send's outcome counts as "unavailable" for its scope's circuit (not for
    the job: a 503 is Unknown there, and `max_attempts` counts it as today)."""
    return (
        (outcome.kind is SendKind.REJECTED and outcome.unavailable)
        or outcome.status == 503
        or outcome.timed_out
    )


class Admit(Enum):
    GO = "go"  # closed: send
    PROBE = "probe"  # open, and this one job is the probe
    HOLD = "hold"  # open: leave the job due
    PING = "ping"  # open by a hang: probe with `Provider.ping` (sends nothing), not the job


@dataclass(frozen=True)
class OpenCircuit:
    """What `/healthz` and `/metrics` show of an open circuit, or of a scope whose sends
    pause (`sends_only`: only unanswered sends opened it, its searches go on)."""

    scope: str
    since: datetime
    failures: int
    next_probe: datetime
    probing: bool
    unanswered: int = 0  # sends in a row closed with no response, none answered between
    sends_only: bool = False


#: The kinds of call a circuit admits; its probes alternate between them (`admit`).
SEND = "send"
CHECK = "check"  # a search, a verification, a draft's check
PING = "ping"  # the probe of a circuit a hang opened (`Provider.ping`)
#: The draft step before a send's claim: never admitted on its own (its job was, as a
#: send). Its failures count as a read's; its answers change nothing (`answered`).
DRAFT = "draft"


@dataclass
class _State:
    failures: int = 0
    opened_at: datetime | None = None
    probe_at: datetime | None = None
    backoff: float = 0.0
    probing: bool = False
    last_probe: str = ""  # the kind of call the last probe was (whom it was handed to)
    probe_call: str = ""  # what the probe out now is: SEND, CHECK or PING
    waiting: set[str] = field(default_factory=set)  # kinds held since the last probe
    # The latest failure was a hang: the next send probe is a ping (until a read or a
    # ping answers: reads work, so the next send probe is the send itself) ...
    hung: bool = False
    # ... and only a send that answers closes the circuit or clears the hold of a timeout
    # among calls in flight: however many reads answer, they prove nothing about sends
    # (a provider can answer its reads while it holds every send; tests/e2e/test_races.py
    # saw a second read's answer close the circuit and four sends go into the hang).
    sends_unproven: bool = False
    # The ticket (`Circuits.calling`) of the latest-begun call among its failures: an
    # answer to a call that began before it says nothing about that failure (`answered`).
    failed_ticket: int = 0

    def yields(self, kind: str, now: datetime, window: float) -> bool:
        """Whether a probe due now is left to the other kind: this kind had the last one,
        the other has been held since, and the probe has been due for less than `window`
        seconds (the other kind may be gone: its jobs settled elsewhere). Sends ask for
        the probe the moment it is due, checks only at the next tick: without turns a
        provider whose sends keep failing (a daily sending limit) would never let a
        search through."""
        return (
            kind == self.last_probe
            and bool(self.waiting - {kind})
            and self.probe_at is not None
            and now < self.probe_at + timedelta(seconds=window)
        )


@dataclass
class _Pause:
    """A scope's run of sends closed with no response (`Circuits.sent`), and the pause of
    its sends once the run is long enough: probed by one send at a time, at the circuit's
    backoff; never holding a search."""

    count: int = 0  # unanswered sends in a row, no send answered in between
    ticket: int = 0  # the latest-begun of them: an answer to a send begun before clears none
    since: datetime | None = None  # paused since (None: counting, not paused)
    probe_at: datetime | None = None
    backoff: float = 0.0
    probing: bool = False
    # The probe's call (`sending`; 0: not begun): only its end is the probe's. A send
    # begun before the pause may end while the probe is out, and taken for the probe it
    # let a second probe out beside the first.
    probe_ticket: int = 0


def answered_send(outcome: SendOutcome) -> bool:
    """Whether the provider answered a send (its run of unanswered sends ends): anything
    it said, a refusal, a 5xx or a 503 included; not a call closed unanswered, timed out,
    refused before it left (`unavailable`) or never made (`not_attempted`)."""
    return not (
        outcome.unanswered or outcome.timed_out or outcome.unavailable or outcome.not_attempted
    )


class Circuits:
    """Thread-safe; time is given by the caller (the engine's injected clock)."""

    def __init__(self, settings: CircuitSettings | None = None) -> None:
        self.settings = settings or CircuitSettings()
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._in_flight: dict[str, int] = {}  # calls of each scope running now
        # Scopes where a call timed out while others were in flight: no new send until
        # those ended (`calling`) or a call answered.
        self._suspect: set[str] = set()
        self._tickets = 0  # calls begun so far, of every scope: each call's ticket
        self._pauses: dict[str, _Pause] = {}  # scopes with unanswered sends in a row

    @contextmanager
    def calling(self, scope: str) -> Iterator[int]:
        """Around every provider call of `scope`: counts it as in flight. Yields the
        call's ticket, for `called` and `answered` to tell when it began."""
        ticket = self._begun(scope)
        try:
            yield ticket
        finally:
            self._ended(scope)

    @contextmanager
    def call(
        self,
        scope: str,
        clock: Callable[[], datetime],
        kind: str = CHECK,
    ) -> Iterator[int]:
        """Around one provider call of `scope` other than a send's (`sending`): a search, a
        draft's check, a report read, the Message-ID read-back, the draft step before a
        claim, a ping. Counted in flight with its ticket (`calling`), and its end fed to
        the circuit with that ticket before it stops counting, as a send's is: a
        `ProviderError` as it says (`called`: unavailable, timed out, Retry-After), then
        raised on; a return as an answer (`answered`). Anything else (a `ScopeLost`
        between two calls, a stop, a draft found changed) is neither. One piece of code for every
        call, so a read-back's or a draft step's late answer clears only failures of calls
        that began before it, as a search's does (docs/architecture.md "Outages: waited
        out, not escalated")."""
        ticket = self._begun(scope)
        try:
            yield ticket
        except ProviderError as exc:
            self.called(
                scope,
                clock(),
                unavailable=exc.unavailable,
                retry_after=exc.retry_after,
                timed_out=exc.timed_out,
                kind=kind,
                ticket=ticket,
            )
            raise
        else:
            self.answered(scope, clock(), kind, ticket=ticket)
        finally:
            self._ended(scope)

    def _begun(self, scope: str) -> int:
        """A call of `scope` counted in flight: its ticket."""
        with self._lock:
            self._in_flight[scope] = self._in_flight.get(scope, 0) + 1
            return self._ticket()

    def _ticket(self) -> int:
        # Caller holds the lock.
        self._tickets += 1
        return self._tickets

    @contextmanager
    def sending(self, scope: str, now: datetime, *, probe: bool = False) -> Iterator[int | None]:
        """Around a send's call, in place of `calling`: yields the call's ticket when the
        send may still be made, else None. A send was admitted before its claim was saved,
        and that save may take a while: if meanwhile a call of its scope timed out with
        others in flight, or the circuit opened, or its sends paused (`sent`), the scope is
        known to hang or fail and the
        send is not made (None, not counted in flight), unless it is the circuit's probe
        still out. Checked and counted under one lock, so no timeout falls between the
        two. One stopped by a timeout counts as a hang of its own: it would have hung with
        the others, and when they end the circuit must have opened, or the next send would
        go into the hang."""
        with self._lock:
            free = self._sendable(scope, probe)
            if free:
                self._in_flight[scope] = self._in_flight.get(scope, 0) + 1
                ticket = self._ticket()
                pause = self._pauses.get(scope)
                if probe and pause is not None and pause.probing and not pause.probe_ticket:
                    pause.probe_ticket = ticket
            else:
                pause = self._pauses.get(scope)
                if probe and pause is not None and pause.probing:
                    pause.probing = False  # a pause's probe withheld: the next job probes
                if scope in self._suspect:
                    # Counted with the timeout that held it (ticket 0 leaves the state's):
                    # an answer of a call in flight beside that timeout still clears both.
                    self._failed(scope, now, None, timed_out=True, ticket=0)
        if not free:
            yield None
            return
        try:
            yield ticket
        finally:
            self._ended(scope)

    def _sendable(self, scope: str, probe: bool) -> bool:
        # Caller holds the lock.
        state = self._states.get(scope)
        if state is not None and state.opened_at is not None:
            return probe and state.probing and state.probe_call == SEND
        pause = self._pauses.get(scope)
        if pause is not None and pause.since is not None:
            # Paused while the claim was saved: withheld; the probe too once the scope
            # may hang (a timeout among calls in flight), as every send is.
            return probe and pause.probing and scope not in self._suspect
        return scope not in self._suspect

    def _ended(self, scope: str) -> None:
        with self._lock:
            left = self._in_flight.get(scope, 1) - 1
            if left > 0:
                self._in_flight[scope] = left
            else:
                self._in_flight.pop(scope, None)
                self._suspect.discard(scope)

    def in_flight(self, scope: str) -> int:
        with self._lock:
            return self._in_flight.get(scope, 0)

    def admit(self, scope: str, now: datetime, kind: str = SEND) -> Admit:
        """Whether a call of `scope` may be made now; PROBE hands out the one probe, to
        sends and checks in turn when both are waiting (PING instead of a send's probe
        when a hang opened the circuit)."""
        with self._lock:
            state = self._states.get(scope)
            if kind == SEND and scope in self._suspect:
                if state is not None:
                    state.waiting.add(kind)
                return Admit.HOLD
            if state is None or state.opened_at is None:
                return self._admit_paused(scope, now) if kind == SEND else Admit.GO
            if (
                state.probing
                or state.probe_at is None
                or now < state.probe_at
                or state.yields(kind, now, self.settings.probe_max)
            ):
                state.waiting.add(kind)
                return Admit.HOLD
            state.probing = True
            state.last_probe = kind
            state.waiting.clear()
            ping = kind == SEND and state.hung
            state.probe_call = PING if ping else kind
            return Admit.PING if ping else Admit.PROBE

    def _admit_paused(self, scope: str, now: datetime) -> Admit:
        # Caller holds the lock; the circuit is closed. A send of a paused scope waits for
        # the pause's probe, one at a time (no turns: its searches are never held).
        pause = self._pauses.get(scope)
        if pause is None or pause.since is None:
            return Admit.GO
        if pause.probing or pause.probe_at is None or now < pause.probe_at:
            return Admit.HOLD
        pause.probing = True
        pause.probe_ticket = 0
        return Admit.PROBE

    def next_probe(self, scope: str, kind: str = SEND) -> datetime | None:
        """When an open circuit of `scope` admits the next probe of this kind (None:
        closed, or its probe is out); later than the probe's time while it is left to
        the other kind."""
        with self._lock:
            state = self._states.get(scope)
            if (state is None or state.opened_at is None) and kind == SEND:
                pause = self._pauses.get(scope)
                if pause is None or pause.since is None or pause.probing:
                    return None
                return pause.probe_at
            if state is None or state.opened_at is None or state.probing:
                return None
            if state.probe_at is not None and kind == state.last_probe and state.waiting - {kind}:
                return state.probe_at + timedelta(seconds=self.settings.probe_max)
            return state.probe_at

    def unavailable(
        self,
        scope: str,
        now: datetime,
        retry_after: float | None = None,
        *,
        timed_out: bool = False,
        kind: str = SEND,
        ticket: int | None = None,
    ) -> None:
        """A call of `scope` proved the provider unavailable (`timed_out`: it hung).
        `ticket`: the call's (`calling`); None: taken as begun now."""
        with self._lock:
            self._failed(scope, now, retry_after, timed_out, kind, ticket)

    def _failed(
        self,
        scope: str,
        now: datetime,
        retry_after: float | None,
        timed_out: bool,
        kind: str = SEND,
        ticket: int | None = None,
    ) -> None:
        # Caller holds the lock.
        settings = self.settings
        state = self._states.setdefault(scope, _State())
        state.failures += 1
        began = self._tickets + 1 if ticket is None else ticket
        state.failed_ticket = max(state.failed_ticket, began)
        # A second timeout among calls that were in flight together: the scope hangs, and
        # the circuit opens now, not `failures` calls later (each one more job Unknown).
        confirmed = timed_out and scope in self._suspect
        if timed_out and self._in_flight.get(scope, 0) > 1:
            self._suspect.add(scope)  # the calls that started before it may hang too
        state.hung = timed_out
        if kind == SEND:  # a read's or a ping's failure says nothing new about sends
            state.sends_unproven = timed_out
        if state.opened_at is not None:
            if not state.probing:
                return  # a call that started before it opened: the probe decides
            state.backoff = min(state.backoff * 2, settings.probe_max)
        elif state.failures >= settings.failures or confirmed:
            state.opened_at = now
            state.backoff = settings.probe_after
        else:
            return
        state.probing = False
        wait = max(state.backoff, retry_after_wait(retry_after))
        state.probe_at = now + timedelta(seconds=wait)

    def holds(self, scope: str, now: datetime, kind: str = CHECK) -> bool:
        """Whether `admit` would say HOLD to this kind of call now, without handing out
        the probe: open, and its probe out, not due yet or the other kind's. A held kind
        counts as waiting, so the next probe may be its."""
        with self._lock:
            state = self._states.get(scope)
            if state is None or state.opened_at is None:
                return False
            held = (
                state.probing
                or state.probe_at is None
                or now < state.probe_at
                or state.yields(kind, now, self.settings.probe_max)
            )
            if held:
                state.waiting.add(kind)
            return held

    def called(
        self,
        scope: str,
        now: datetime,
        *,
        unavailable: bool,
        retry_after: float | None = None,
        timed_out: bool = False,
        kind: str = SEND,
        ticket: int | None = None,
    ) -> None:
        """A call of `scope` ended: `unavailable` when it proved the provider unavailable
        (a failed search's or draft call's `ProviderError.unavailable`; `timed_out`: it
        hung), else it answered. `ticket`: the call's (`calling`); None: taken as begun
        now."""
        if unavailable or timed_out:
            self.unavailable(scope, now, retry_after, timed_out=timed_out, kind=kind, ticket=ticket)
        else:
            self.answered(scope, now, kind, ticket=ticket)

    def answered(
        self,
        scope: str,
        now: datetime | None = None,
        kind: str = SEND,
        *,
        ticket: int | None = None,
    ) -> None:
        """A call of `scope` got an answer that is not "unavailable": closed. After a
        hang, an answer to a read or a ping only says reads work, however many of them
        answer: the circuit stays as it is until a send answers, its next send probe is
        the send itself, at its time (a provider whose reads answer may still hang its
        sends, and each send into a hang is one more Unknown); a ping that was the probe
        hands the probe to that send at once.

        An answer to a call that began before the latest-begun of the failures (`ticket`
        below the state's `failed_ticket`; None: taken as begun now) clears nothing: the
        provider may have answered it before the hang began, the answer read late (a
        paused daemon, a slow worker), and closing on it sent jobs into a known hang
        unprobed (tests/e2e/test_races.py). An answer to a call begun after it, as any
        probe is, clears as before; so does one in flight beside a timeout whose call
        began before it. A healthy provider is never held by this: the next call begins
        after every failure, and the hold of a timeout ends when its calls in flight do.
        """
        if kind == DRAFT:
            # A draft made or found proves nothing about sends, and it comes before every
            # send of a drafts provider: fed as a read's answer it closed a circuit its
            # sends' refusals opened (its probe's draft step) and cleared their count
            # before it reached `failures` (the next job's), so a provider refusing sends
            # as unavailable while its drafts answered was never waited out.
            return
        with self._lock:
            state = self._states.get(scope)
            if state is not None and ticket is not None and ticket < state.failed_ticket:
                return
            if state is not None and state.sends_unproven and kind != SEND:
                state.hung = False
                if state.probing and state.probe_call == kind:
                    state.probing = False
                return
            self._suspect.discard(scope)
            self._states.pop(scope, None)

    def probe_returned(self, scope: str) -> None:
        """The probe was handed out but no call was made (its claim failed, the daemon is
        stopping): the next job may probe."""
        with self._lock:
            pause = self._pauses.get(scope)
            if pause is not None and pause.probing:
                pause.probing = False  # the pause's probe, a send
                return
            state = self._states.get(scope)
            if state is not None:
                state.probing = False

    def open(self) -> list[OpenCircuit]:
        with self._lock:
            shown = {}
            for scope, p in self._pauses.items():
                if p.since is not None and p.probe_at is not None:
                    shown[scope] = OpenCircuit(
                        scope, p.since, 0, p.probe_at, p.probing, p.count, sends_only=True
                    )
            for scope, s in self._states.items():
                if s.opened_at is not None and s.probe_at is not None:
                    pause = self._pauses.get(scope)
                    run = 0 if pause is None else pause.count
                    shown[scope] = OpenCircuit(
                        scope, s.opened_at, s.failures, s.probe_at, s.probing, run
                    )
            return [shown[scope] for scope in sorted(shown)]

    def sent(
        self, scope: str, now: datetime, outcome: SendOutcome, *, ticket: int, pause_after: int
    ) -> None:
        """A send's call of `scope` (its ticket, `sending`) ended with `outcome`: fed to
        the circuit (`called`), and to the scope's run of unanswered sends. A send closed
        with no response adds to the run, and the `pause_after`-th of a run (the sending
        job's channel's `pause_after_unanswered`) pauses the scope's sends; a send the
        provider answered ends the run and the pause, unless it began before the run's
        latest (an answer read late says nothing of what came after it). Neither a hang
        nor a refusal before the send left is an answer: the circuit waits those out."""
        with self._lock:
            pause = self._pauses.get(scope)
            probe = pause is not None and pause.probing and ticket == pause.probe_ticket
            if outcome.unanswered:
                self._unanswered(scope, now, ticket, pause_after, probe=probe)
            elif answered_send(outcome):
                if pause is not None and ticket >= pause.ticket:
                    del self._pauses[scope]
                    if pause.since is not None:
                        log.info("scope %s: a send answered: its sends resume", scope)
                elif pause is not None and probe:
                    # Answered, but a send begun after it (an open circuit's probe) was
                    # not: the pause stays, and the next send probes at once.
                    pause.probing = False
            elif pause is not None and probe:
                # The probe was refused, hung or never made (counted by the circuit, or
                # no call): the pause stays, and its next probe comes, never none.
                if outcome.not_attempted:
                    pause.probing = False
                else:
                    self._probe_again(pause, now)
        self.called(
            scope,
            now,
            unavailable=send_unavailable(outcome),
            retry_after=outcome.retry_after,
            timed_out=outcome.timed_out,
            ticket=ticket,
        )

    def _unanswered(
        self, scope: str, now: datetime, ticket: int, pause_after: int, *, probe: bool
    ) -> None:
        # Caller holds the lock. `probe`: this send was the pause's probe.
        settings = self.settings
        pause = self._pauses.setdefault(scope, _Pause())
        pause.count += 1
        pause.ticket = max(pause.ticket, ticket)
        if pause.since is not None:
            if probe:  # else a send begun before the pause: the probe decides
                self._probe_again(pause, now)
        elif pause.count >= pause_after:
            pause.since = now
            pause.backoff = settings.probe_after
            pause.probe_at = now + timedelta(seconds=pause.backoff)
            log.warning(
                "scope %s: %d sends in a row closed with no response: its sends pause,"
                ' one probe at a time (docs/operations.md "Outages and quotas")',
                scope,
                pause.count,
            )

    def _probe_again(self, pause: _Pause, now: datetime) -> None:
        # Caller holds the lock. A probe that got no answer: the next after twice the wait.
        pause.backoff = min(pause.backoff * 2, self.settings.probe_max)
        pause.probing = False
        pause.probe_at = now + timedelta(seconds=pause.backoff)
