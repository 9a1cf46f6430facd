"""The engine in-process, on a real store, through the real Gmail client stack.

Each test builds an `Engine` directly (dispatch -> recover -> sweep per tick) on a
`Ledger` over SQLite or PostgreSQL, with the GmailProvider talking to the GmailEmulator
through the FaultRelay. Time is injected: the engine, the ledger and the emulator's index
lag all read one FakeClock, so windows of minutes (search_after, search_interval, lag,
backoff) pass by `clock.advance(...)` and the tests never sleep for them.

Effects are counted where the design says: sends in the relay's log (every request the
client stack made), copies in the emulator's acceptance log.

These tests hold the search path: their provider reads no history (`read_history=False`)
unless a test asks for it, as `test_a_dropped_reply_is_confirmed_through_the_history_at_once`
does; the history's own tests are tests/integration/test_gmail_history.py and
tests/unit/test_engine_history.py.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.unit.engine_rig import receipt

from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder, TickReport
from daemon.engine.leases import Leases
from daemon.providers.gmail import GmailProvider
from ledger.application import Ledger, Sender
from ledger.content import parse_job
from ledger.job import JobState, SendJob, TransitionError
from ledger.message import render
from ledger.vocabulary import PolicyRef, Resolution
from policies.loader import PolicySet, load_policy_dir
from policies.model import ChannelPolicy
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

MAILBOX = "support@example.com"  # the mailbox the service account acts as
TIMEOUT = 0.5  # the engine's provider_timeouts: with GRACE, an Attempted's deadline
GRACE = 1.0
# The client's own timeout. No fault mode used here hangs, so it only matters under load
# (eight concurrent sends in the race test); fake time does not move during a call.
CLIENT_TIMEOUT = 5.0
DEADLINE = TIMEOUT + GRACE  # an Attempted's deadline, after its start
CRASH_REASON = "no outcome recorded by the attempt's deadline (crash or kill?)"

BASE_POLICY: dict[str, Any] = {
    "provider": "gmail",
    "from": f"Support <{MAILBOX}>",
    "message_id_domain": "mail.example.com",
}


SHOP = Sender("Shop <shop@shop.example>", "shop.example", PolicyRef("receipts", "f" * 16))


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def emulator(acceptance_log: Path, clock: FakeClock) -> Iterator[GmailEmulator]:
    """Overrides the shared emulator: its index lag (and token expiry) run on the test's
    FakeClock, so a lag of minutes passes with the engine's injected time."""
    with GmailEmulator(
        lag=0.0, acceptance_log=acceptance_log, clock=lambda: clock().timestamp()
    ) as emu:
        yield emu


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)  # a TOML basic string for the plain values used here


def write_policy(directory: Path, channel: str, **fields: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    values = {**BASE_POLICY, "channel": channel, **fields}
    path = directory / f"{channel}.toml"
    path.write_text(
        "".join(f"{name} = {_toml_value(value)}\n" for name, value in values.items()),
        encoding="utf-8",
    )
    return path


class Rig:
    """One engine on one ledger, with helpers to submit, tick and count."""

    def __init__(
        self,
        store_url: str,
        clock: FakeClock,
        relay: FaultRelay,
        emulator: GmailEmulator,
        provider: GmailProvider,
        loader: Callable[[], PolicySet],
        rng: random.Random | None = None,
    ) -> None:
        self.clock = clock
        self.relay = relay
        self.emulator = emulator
        self.provider = provider
        self.ledger = Ledger(store_url, clock=clock)
        self.holder = PolicyHolder(loader)
        self.engine = Engine(
            self.ledger,
            self.holder,
            {"gmail": provider},
            provider_timeouts={"gmail": TIMEOUT},
            clock=clock,
            # The calls' bounds count the injected clock's time, as its renewals do: a
            # claim's lease ends only when a test moves the clock past it, never while a
            # loaded machine is slow to make a healthy call (docs/architecture.md "Leases").
            elapsed=clock.elapsed,
            concurrency=4,
            deadline_grace=GRACE,
            rng=rng,
        )

    def close(self) -> None:
        self.engine.close()
        self.ledger.close()

    # -- acting -----------------------------------------------------------------------

    def submit(self, channel: str, key: str) -> str:
        policy = self.holder.current[channel]
        sender = policy.sender
        job = receipt(channel, key)
        result = self.ledger.submit(job, sender)
        assert result.created
        return result.message_id

    def tick(self) -> TickReport:
        report = self.engine.tick()
        assert report.errors == 0, report
        return report

    def advance_and_tick(self, seconds: float) -> TickReport:
        self.clock.advance(seconds)
        return self.tick()

    def crash_claim(self, key: str) -> None:
        """The Attempted event as the engine writes it, then a "crash": no provider call."""
        now = self.clock()
        self.ledger.update(
            key,
            lambda job: job.claim(
                provider="gmail", deadline=now + timedelta(seconds=DEADLINE), at=now
            ),
        )

    # -- observing --------------------------------------------------------------------

    def state(self, key: str) -> JobState:
        return self.ledger.get_job(key).state

    def events(self, key: str) -> list[Any]:
        return self.ledger.history(key)

    def names(self, key: str) -> list[str]:
        return [type(event).__name__ for event in self.events(key)]

    def of(self, key: str, name: str) -> list[Any]:
        return [event for event in self.events(key) if type(event).__name__ == name]

    def sends(self) -> int:
        return sum(1 for entry in self.relay.log if entry["kind"] == "send")

    def searches(self) -> int:
        """messages.list calls (a search); the read-back after a send is a messages.get."""
        return sum(
            1
            for entry in self.relay.log
            if entry["kind"] == "search" and entry["path"].split("?")[0].endswith("/messages")
        )


RigFactory = Callable[..., Rig]


@pytest.fixture
def make_rig(
    store_url: str,
    clock: FakeClock,
    relay: FaultRelay,
    emulator: GmailEmulator,
    gmail_provider: Callable[..., GmailProvider],
    tmp_path: Path,
) -> Iterator[RigFactory]:
    """`make_rig(policies={"channel": {field: value}}, policy_set=..., rng=..., send_via=...,
    read_history=...)`: a Rig whose policies load from TOML files in tmp_path/policies (or
    the given PolicySet); its provider reads no history unless `read_history`."""
    rigs: list[Rig] = []
    policy_dir = tmp_path / "policies"

    def make(
        policies: dict[str, dict[str, object]] | None = None,
        *,
        policy_set: PolicySet | None = None,
        rng: random.Random | None = None,
        send_via: str = "messages",
        read_history: bool = False,
    ) -> Rig:
        policy_dir.mkdir(exist_ok=True)
        for channel, fields in (policies or {}).items():
            write_policy(policy_dir, channel, **fields)
        if policy_set is not None:
            fixed = policy_set

            def loader() -> PolicySet:
                return fixed

        else:

            def loader() -> PolicySet:
                return load_policy_dir(policy_dir, known_providers={"gmail"})

        provider = gmail_provider(
            name="gmail", timeout=CLIENT_TIMEOUT, send_via=send_via, read_history=read_history
        )
        rig = Rig(store_url, clock, relay, emulator, provider, loader, rng)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


RETRY_5M = {
    "on_unknown": "retry",
    "search_after": "5m",
    "search_interval": "5m",
    "confirm_misses": 2,
    "max_attempts": 3,
}


# -- invariant 2: timing of searches and resends after an Unknown ------------------------


def test_unknown_searches_on_schedule_and_resends_only_after_the_misses(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """fail-before-forward: nothing was sent. No search before search_after; the next ones
    search_interval apart; a Requeued (then a new Attempted) only after confirm_misses."""
    rig = make_rig(
        {
            "receipts": {
                "on_unknown": "retry",
                "search_after": "5m",
                "search_interval": "10m",
                "confirm_misses": 3,
                "max_attempts": 3,
            }
        }
    )
    relay.set_plan(FaultPlan(send=["fail-before-forward"]))  # then "pass"
    message_id = rig.submit("receipts", "inv2-a")
    t0 = clock()

    rig.tick()
    assert rig.state("inv2-a") is JobState.UNKNOWN
    assert rig.sends() == 1 and emulator.copies(message_id) == 0
    [unknown] = rig.of("inv2-a", "Unknown")
    assert unknown.search_due_at == t0 + timedelta(minutes=5)

    # Before search_after: not a single search request leaves, however often we tick.
    for seconds in (0, 1, 150, 148):
        rig.advance_and_tick(seconds)
    assert clock() == t0 + timedelta(seconds=299)
    assert rig.searches() == 0
    assert rig.names("inv2-a")[-1] == "Unknown"

    # At search_after: the first search.
    rig.advance_and_tick(1)
    assert rig.searches() == 1
    misses = rig.of("inv2-a", "SearchedMiss")
    assert [m.search for m in misses] == [1]
    assert misses[0].timestamp == t0 + timedelta(minutes=5)
    assert misses[0].next_search_at == t0 + timedelta(minutes=15)
    # The query recorded is the one Gmail was sent: the Message-ID without angle brackets.
    assert misses[0].query == "rfc822msgid:" + message_id.strip("<>")

    # The next search not before search_interval (10m), although search_after (5m) passed.
    for seconds in (300, 299):
        rig.advance_and_tick(seconds)
    assert rig.searches() == 1
    rig.advance_and_tick(1)
    assert rig.searches() == 2
    assert len(rig.of("inv2-a", "SearchedMiss")) == 2
    # Two misses of three: still no resend.
    assert "Requeued" not in rig.names("inv2-a")
    assert len(rig.of("inv2-a", "Attempted")) == 1

    rig.advance_and_tick(599)
    assert rig.searches() == 2
    assert "Requeued" not in rig.names("inv2-a")
    rig.advance_and_tick(1)  # the third miss: now believed; requeued in the sweep
    assert rig.searches() == 3
    misses = rig.of("inv2-a", "SearchedMiss")
    assert [m.timestamp - t0 for m in misses] == [timedelta(minutes=m) for m in (5, 15, 25)]
    assert rig.names("inv2-a")[-2:] == ["SearchedMiss", "Requeued"]
    assert len(rig.of("inv2-a", "Attempted")) == 1
    assert rig.sends() == 1

    # The next tick resends (same Message-ID), which passes: one copy in the end.
    rig.tick()
    assert rig.state("inv2-a") is JobState.CONFIRMED
    attempts = rig.of("inv2-a", "Attempted")
    assert [a.attempt for a in attempts] == [1, 2]
    assert rig.sends() == 2
    assert emulator.copies(message_id) == 1
    assert len(emulator.accepted()) == 1


@pytest.mark.parametrize(
    ("lag", "misses"),
    [pytest.param(120.0, 0, id="lag-120s"), pytest.param(400.0, 1, id="lag-400s")],
)
def test_dropped_response_is_confirmed_by_search_after_the_index_lag(
    make_rig: RigFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    clock: FakeClock,
    lag: float,
    misses: int,
) -> None:
    """drop-response: the mail was sent, the reply lost. With lag 120s < search_after 300s
    the first search finds it; with lag 400s the first search misses and, confirm_misses
    being 2, the second (at 600s) finds it. Either way: no resend, one copy."""
    rig = make_rig({"receipts": RETRY_5M})
    emulator.set_lag(lag)
    relay.set_plan(FaultPlan(send=["drop-response"]))
    message_id = rig.submit("receipts", "inv2-lag")
    t0 = clock()

    rig.tick()
    assert rig.state("inv2-lag") is JobState.UNKNOWN
    assert emulator.copies(message_id) == 1

    rig.advance_and_tick(299)
    assert rig.searches() == 0
    rig.advance_and_tick(1)
    assert rig.searches() == 1
    if misses:
        assert rig.state("inv2-lag") is JobState.UNKNOWN
        assert len(rig.of("inv2-lag", "SearchedMiss")) == 1
        rig.advance_and_tick(299)
        assert rig.searches() == 1
        rig.advance_and_tick(1)
        assert rig.searches() == 2

    assert rig.state("inv2-lag") is JobState.CONFIRMED
    [confirmed] = rig.of("inv2-lag", "Confirmed")
    assert confirmed.via == "search"
    assert confirmed.timestamp == t0 + timedelta(seconds=300 * (misses + 1))
    assert len(rig.of("inv2-lag", "SearchedMiss")) == misses
    assert "Requeued" not in rig.names("inv2-lag")

    for _ in range(3):
        rig.advance_and_tick(600)
    assert len(rig.of("inv2-lag", "Attempted")) == 1
    assert rig.sends() == 1
    assert emulator.copies(message_id) == 1


def test_a_dropped_reply_is_confirmed_through_the_history_at_once(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """The same lost reply with the history read (the default): confirmed via history in
    the tick of its Unknown, 5 minutes before the search could be made, with no search, on
    the real store and client; after a restart (kill -9) the claim's historyId answers too."""
    rig = make_rig({"receipts": RETRY_5M}, read_history=True)
    emulator.set_lag(400)
    relay.set_plan(FaultPlan(send=["drop-response", "drop-response"]))
    message_id = rig.submit("receipts", "hist-1")
    rig.tick()
    assert rig.state("hist-1") is JobState.CONFIRMED
    [confirmed] = rig.of("hist-1", "Confirmed")
    [unknown] = rig.of("hist-1", "Unknown")
    assert confirmed.via == "history" and confirmed.timestamp == unknown.timestamp
    assert rig.searches() == 0 and emulator.searches == []
    assert emulator.copies(message_id) == 1
    [attempted] = rig.of("hist-1", "Attempted")
    assert attempted.history_id is not None
    # A claim whose daemon died after the send: recovered at its deadline, read from its
    # own historyId (recorded with the claim) like any Unknown.
    recovered = rig.submit("receipts", "hist-2")
    mark = rig.provider.history_mark()
    rig.ledger.update(
        "hist-2",
        lambda job: job.claim(
            provider="gmail", deadline=clock() + timedelta(seconds=DEADLINE), at=clock(),
            history_id=mark,
        ),
    )  # fmt: skip
    rig.provider.send_raw(render(rig.ledger.get_job("hist-2")))  # the call that "crashed"
    rig.advance_and_tick(DEADLINE + 1)
    rig.tick()
    assert [e.via for e in rig.of("hist-2", "Confirmed")] == ["history"]
    assert emulator.copies(recovered) == 1 and rig.searches() == 0


def test_failed_search_is_no_miss(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """A search that gets no answer (503, dropped reply) is "no information", never "no
    hits": with confirm_misses = 1, counting it as a miss would resend a sent mail."""
    rig = make_rig({"receipts": {**RETRY_5M, "confirm_misses": 1}})
    relay.set_plan(FaultPlan(send=["drop-response"], search=["503", "drop-response"]))
    message_id = rig.submit("receipts", "blind")
    t0 = clock()
    rig.tick()

    def failing_tick(seconds: float) -> int:
        clock.advance(seconds)
        return rig.engine.tick().errors  # a failed search is reported as an error

    assert failing_tick(300) == 1  # 503 (Retry-After 1s)
    assert failing_tick(0.5) == 0  # not asked again before the Retry-After
    assert rig.searches() == 1
    assert failing_tick(0.5) == 1  # reply dropped
    assert rig.searches() == 2
    assert rig.names("blind")[-1] == "Unknown"
    rig.advance_and_tick(1)  # answered: the copy is there
    assert rig.searches() == 3
    assert rig.state("blind") is JobState.CONFIRMED
    [confirmed] = rig.of("blind", "Confirmed")
    assert confirmed.via == "search" and confirmed.timestamp == t0 + timedelta(seconds=302)
    assert rig.of("blind", "SearchedMiss") == []
    assert rig.sends() == 1
    assert emulator.copies(message_id) == 1


# -- invariant 1: two engines racing over the same due jobs ------------------------------


def test_two_engines_racing_make_one_call_per_job(
    store_url: str,
    clock: FakeClock,
    relay: FaultRelay,
    emulator: GmailEmulator,
    gmail_provider: Callable[..., GmailProvider],
    make_rig: RigFactory,
) -> None:
    jobs = 40
    first = make_rig({"receipts": {"on_unknown": "retry"}})
    # A second daemon: its own Ledger on the same store, its own provider object.
    second = make_rig()
    keys = [f"race-{i:02d}" for i in range(jobs)]
    message_ids = {key: first.submit("receipts", key) for key in keys}
    assert len(first.ledger.due("requested", clock(), 1000)) == jobs

    barrier = threading.Barrier(2)
    reports: dict[str, TickReport] = {}
    failures: list[BaseException] = []

    def run(name: str, rig: Rig) -> None:
        try:
            barrier.wait(timeout=30)
            reports[name] = rig.engine.tick()
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(name, rig))
        for name, rig in (("first", first), ("second", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert all(report.errors == 0 for report in reports.values()), reports
    # Every job was claimed by exactly one of them: the engines' own counts agree.
    assert sum(report.sent for report in reports.values()) == jobs, reports
    # They really raced: claims lost to the other engine's (optimistic concurrency).
    assert sum(report.skipped for report in reports.values()) > 0, reports

    # Nothing is left for either of them.
    assert first.tick().sent == 0 and second.tick().sent == 0

    assert first.sends() == jobs
    accepted = emulator.accepted()
    assert len(accepted) == jobs
    for key in keys:
        assert len(first.of(key, "Attempted")) == 1, first.names(key)
        assert first.state(key) is JobState.CONFIRMED
        assert emulator.copies(message_ids[key]) == 1


# -- invariant 6: an Attempted without an outcome after its deadline ---------------------


#: The engine modules that call `crash_point` (each holds its own reference to it).
CRASH_POINT_MODULES = ("daemon.engine.dispatch", "daemon.engine.search")


class Crash(BaseException):
    """Raised at an engine crash point: not an Exception, so the engine's per-job guard
    does not catch it and the tick stops right there, as a killed process would."""


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str | None], None]:
    """`crash_at("after-claim")` arms one of the engine's named crash points (in-process,
    instead of the SIGKILL the e2e tests use); `crash_at(None)` disarms it. The points are
    called in the engine's dispatch (after-claim, after-send) and search (after-search)
    modules, each of which imported `crash_point` for itself."""

    def arm(point: str | None) -> None:
        def crash_point(name: str) -> None:
            if name == point:
                raise Crash(name)

        for module in CRASH_POINT_MODULES:
            monkeypatch.setattr(f"{module}.crash_point", crash_point)

    return arm


@pytest.mark.parametrize("crash", ["claim-by-hand", "after-claim", "after-send"])
def test_attempt_without_outcome_becomes_unknown_after_its_deadline(
    make_rig: RigFactory,
    emulator: GmailEmulator,
    clock: FakeClock,
    crash_at: Callable[[str | None], None],
    crash: str,
) -> None:
    """The claim is durable, then the daemon "dies": before calling the provider, or
    after the provider accepted the mail but before the outcome was written. A restarted
    daemon (a new Ledger and Engine on the same store) leaves the job alone until the
    Attempted's deadline, then records it as Unknown and takes the sweep path."""
    crashed = make_rig({"receipts": {**RETRY_5M, "confirm_misses": 1}})
    message_id = crashed.submit("receipts", "inv6")
    t0 = clock()
    if crash == "claim-by-hand":
        crashed.crash_claim("inv6")
    else:
        crash_at(crash)
        with pytest.raises(Crash):
            crashed.engine.tick()
        crash_at(None)
    [attempted] = crashed.of("inv6", "Attempted")
    assert attempted.deadline == t0 + timedelta(seconds=DEADLINE)
    assert crashed.sends() == (1 if crash == "after-send" else 0)
    assert emulator.copies(message_id) == (1 if crash == "after-send" else 0)
    rig = make_rig()  # the restarted daemon
    sends_before = rig.sends()
    version = rig.ledger.get_job("inv6").version

    # Before the deadline the job is left alone: no event, no provider call.
    for seconds in (0, 0.5, 0.99):
        rig.advance_and_tick(seconds)
    assert clock() < t0 + timedelta(seconds=DEADLINE)
    assert rig.ledger.get_job("inv6").version == version
    assert rig.state("inv6") is JobState.ATTEMPTED
    assert rig.sends() == sends_before and rig.searches() == 0

    # At the deadline: Unknown with the crash reason; a search is scheduled, not a resend.
    clock.now = t0 + timedelta(seconds=DEADLINE)
    report = rig.tick()
    assert report.recovered == 1
    assert rig.state("inv6") is JobState.UNKNOWN
    [unknown] = rig.of("inv6", "Unknown")
    assert unknown.reason == CRASH_REASON
    assert unknown.attempt == 1
    assert unknown.search_due_at == clock() + timedelta(minutes=5)
    assert rig.sends() == sends_before and rig.searches() == 0

    # Then the sweep path: no search before search_after, one at it.
    rig.advance_and_tick(299)
    assert rig.searches() == 0
    rig.advance_and_tick(1)
    assert rig.searches() == 1
    if crash == "after-send":
        # Found the crashed attempt's copy: confirmed, never resent.
        assert rig.names("inv6")[-1] == "Confirmed"
        assert rig.of("inv6", "Confirmed")[0].via == "search"
    else:
        # One miss is believed (confirm_misses = 1): requeued, and the next tick resends.
        assert rig.names("inv6")[-2:] == ["SearchedMiss", "Requeued"]
        rig.tick()
        assert [a.attempt for a in rig.of("inv6", "Attempted")] == [1, 2]
    assert rig.state("inv6") is JobState.CONFIRMED
    assert rig.sends() == 1
    assert emulator.copies(message_id) == 1


# -- invariants 4 and 5: duplicates and irreversible channels ----------------------------


def test_duplicate_goes_to_review_and_is_never_resent(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    rig = make_rig({"receipts": {**RETRY_5M, "confirm_misses": 1}})
    relay.set_plan(FaultPlan(send=["drop-response"]))
    message_id = rig.submit("receipts", "inv4")
    rig.tick()
    assert rig.state("inv4") is JobState.UNKNOWN
    # A second copy with our Message-ID in the same mailbox (e.g. another system resent).
    emulator.inject(render(rig.ledger.get_job("inv4")), user=MAILBOX)
    assert emulator.copies(message_id) == 2

    rig.advance_and_tick(300)
    assert rig.state("inv4") is JobState.REVIEW
    assert rig.names("inv4")[-2:] == ["Duplicate", "Escalated"]
    [duplicate] = rig.of("inv4", "Duplicate")
    assert duplicate.hits == 2 and len(set(duplicate.provider_message_ids)) == 2
    [escalated] = rig.of("inv4", "Escalated")
    assert escalated.reason == "duplicate"
    assert escalated.policy == "receipts"
    assert escalated.fingerprint == rig.holder.current["receipts"].fingerprint

    # A human's "resend" is refused: two copies already exist.
    with pytest.raises(TransitionError):
        rig.ledger.update(
            "inv4", lambda job: job.resolve(Resolution.RESEND, note="", by="test", at=clock())
        )
    for _ in range(4):
        rig.advance_and_tick(900)
    assert rig.state("inv4") is JobState.REVIEW
    assert len(rig.of("inv4", "Attempted")) == 1
    assert "Requeued" not in rig.names("inv4")
    assert rig.sends() == 1
    assert emulator.copies(message_id) == 2


def _irreversible_validated() -> dict[str, object]:
    return {**RETRY_5M, "on_unknown": "search-then-review", "irreversible": True}


def _irreversible_around_validation() -> PolicySet:
    # "retry" with irreversible = true is refused at load; built around validation it
    # must still never resend (decisions check it too).
    policy = ChannelPolicy.model_construct(
        channel="payouts",
        provider="gmail",
        from_=BASE_POLICY["from"],
        message_id_domain=BASE_POLICY["message_id_domain"],
        irreversible=True,
        on_unknown="retry",
        search_after=300.0,
        search_interval=300.0,
        confirm_misses=2,
        max_attempts=3,
        retry_backoff=30.0,
        retry_backoff_max=3600.0,
    )
    return PolicySet({"payouts": policy})


@pytest.mark.parametrize("built", ["validated", "around-validation"])
def test_irreversible_channel_never_requeues(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, built: str
) -> None:
    if built == "validated":
        rig = make_rig({"payouts": _irreversible_validated()})
    else:
        rig = make_rig(policy_set=_irreversible_around_validation())
    relay.set_plan(FaultPlan(send=["fail-before-forward"]))
    rig.submit("payouts", "inv5")
    rig.tick()
    assert rig.state("inv5") is JobState.UNKNOWN
    rig.advance_and_tick(300)
    assert rig.state("inv5") is JobState.UNKNOWN
    rig.advance_and_tick(300)
    assert rig.state("inv5") is JobState.REVIEW
    assert rig.searches() == 2
    assert rig.of("inv5", "Escalated")[0].reason == "unknown-outcome"
    for _ in range(4):
        rig.advance_and_tick(900)
    assert "Requeued" not in rig.names("inv5")
    assert len(rig.of("inv5", "Attempted")) == 1
    assert rig.sends() == 1
    assert emulator.accepted() == []


# -- a provider that replaces our Message-ID ---------------------------------------------


@pytest.mark.parametrize("unknown", ["after-the-mark", "before-the-mark"])
def test_replaced_message_id_marks_the_handle_unreliable(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, unknown: str
) -> None:
    """A pass send confirmed by response; the read-back sees another Message-ID, so the
    handle is unreliable, and an Unknown goes to review without a search: at the Unknown
    (after the mark) or at its sweep (when the Unknown came first)."""
    rig = make_rig({"receipts": RETRY_5M})
    emulator.rewrite_message_id = True

    def confirm_and_mark() -> None:
        relay.set_plan(FaultPlan(send="pass"))
        rig.submit("receipts", "rewritten")
        rig.tick()
        assert rig.state("rewritten") is JobState.CONFIRMED
        assert rig.of("rewritten", "Confirmed")[0].via == "response"
        assert rig.ledger.handle_reliable("gmail") is False

    def drop() -> None:
        relay.set_plan(FaultPlan(send="drop-response"))
        rig.submit("receipts", "ambiguous")
        rig.tick()

    assert rig.ledger.handle_reliable("gmail") is True
    if unknown == "after-the-mark":
        confirm_and_mark()
        drop()
        # Straight to review in the same tick: no search was even scheduled.
        [event] = rig.of("ambiguous", "Unknown")
        assert event.search_due_at is None
    else:
        drop()
        assert rig.state("ambiguous") is JobState.UNKNOWN
        confirm_and_mark()
        rig.advance_and_tick(300)
    assert rig.state("ambiguous") is JobState.REVIEW
    assert rig.of("ambiguous", "Escalated")[0].reason == "handle-unreliable"
    for _ in range(3):
        rig.advance_and_tick(600)
    assert rig.searches() == 0
    assert len(rig.of("ambiguous", "Attempted")) == 1
    assert rig.sends() == 2


# -- max_attempts under transient rejections ---------------------------------------------


def test_quota_refusals_are_waited_out_past_max_attempts_then_sent_once(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """429 proves nothing was sent and the provider is over quota: each refusal waits at
    least its Retry-After, none counts against max_attempts, the circuit opens after three
    (then only its probe is let through), and once Gmail takes the message again it is sent
    exactly once, never to review (docs/operations.md, "Outages and quotas")."""
    max_attempts, retry_after = 2, 45.0
    rig = make_rig(
        {"receipts": {"on_unknown": "retry", "max_attempts": max_attempts}},
        rng=random.Random(20260101),
    )
    relay.set_plan(FaultPlan(send="429"))
    relay.retry_after = retry_after
    message_id = rig.submit("receipts", "throttled")

    refusals = max_attempts + 4
    for attempt in range(1, refusals + 1):
        rig.tick()
        assert rig.sends() == attempt
        rejected = rig.of("throttled", "Rejected")
        event = rejected[-1]
        assert len(rejected) == attempt and event.unavailable and event.status == 429
        assert (event.retry_at - event.timestamp).total_seconds() == retry_after
        assert rig.state("throttled") is JobState.REQUESTED
        # Not a call before retry_at (nor before the circuit's probe).
        clock.now = event.retry_at - timedelta(seconds=1)
        rig.tick()
        assert rig.sends() == attempt
        clock.now = event.retry_at
        if attempt >= 3:
            [circuit] = rig.engine.open_circuits()
            assert circuit.scope == "gmail" and circuit.failures == attempt

    relay.set_plan(FaultPlan())
    rig.tick()
    assert rig.state("throttled") is JobState.CONFIRMED
    assert rig.engine.open_circuits() == []
    assert "Escalated" not in rig.names("throttled")
    assert emulator.copies(message_id) == 1 and len(emulator.accepted()) == 1


def test_unknowns_resent_by_policy_stop_at_max_attempts(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator
) -> None:
    """Every call counts, whatever its outcome: after max_attempts Unknown-miss-resend
    rounds the next dispatch escalates (max-attempts) instead of calling again."""
    rig = make_rig({"receipts": {**RETRY_5M, "confirm_misses": 1, "max_attempts": 2}})
    relay.set_plan(FaultPlan(send="fail-before-forward"))
    rig.submit("receipts", "lost")
    rig.tick()  # call 1: Unknown
    rig.advance_and_tick(300)  # miss, believed: Requeued
    rig.tick()  # call 2: Unknown
    assert rig.sends() == 2
    rig.advance_and_tick(300)  # miss: Requeued
    assert rig.names("lost")[-1] == "Requeued"
    rig.tick()  # no call 3
    assert rig.state("lost") is JobState.REVIEW
    assert rig.names("lost")[-2:] == ["Requeued", "Escalated"]
    assert rig.of("lost", "Escalated")[0].reason == "max-attempts"
    for _ in range(3):
        rig.advance_and_tick(600)
    assert rig.sends() == 2
    assert len(rig.of("lost", "Attempted")) == 2
    assert emulator.accepted() == []


# -- a channel whose policy disappears ---------------------------------------------------


@pytest.mark.parametrize("step", ["dispatch", "recover", "sweep"])
def test_job_without_policy_goes_to_review(
    make_rig: RigFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    tmp_path: Path,
    step: str,
) -> None:
    rig = make_rig({"receipts": RETRY_5M, "other": RETRY_5M})
    if step == "sweep":
        relay.set_plan(FaultPlan(send=["drop-response"]))
    rig.submit("receipts", "orphan")
    if step == "recover":
        rig.crash_claim("orphan")
    elif step == "sweep":
        rig.tick()
        assert rig.state("orphan") is JobState.UNKNOWN
    sends = rig.sends()

    (tmp_path / "policies" / "receipts.toml").unlink()
    assert rig.holder.reload() is True
    assert "receipts" not in rig.holder.current and "other" in rig.holder.current

    rig.advance_and_tick(300)
    assert rig.state("orphan") is JobState.REVIEW
    assert rig.of("orphan", "Escalated")[0].reason == "no-policy"
    if step == "recover":
        assert rig.of("orphan", "Unknown")[0].reason == CRASH_REASON
    for _ in range(3):
        rig.advance_and_tick(600)
    assert rig.sends() == sends  # no call once the policy is gone
    assert rig.searches() == 0
    assert len(rig.of("orphan", "Attempted")) == (0 if step == "dispatch" else 1)


def test_a_message_that_cannot_be_built_goes_to_review_unclaimed(make_rig: RigFactory) -> None:
    rig = make_rig({"receipts": RETRY_5M})
    policy = rig.holder.current["receipts"]
    # A sender the policy model would refuse, stored by an older version, say.
    broken = Sender("not an address", policy.message_id_domain, policy.ref)
    rig.ledger.submit(
        parse_job(
            {
                "channel": "receipts",
                "key": "unbuildable",
                "to": "a@example.net",
                "subject": "s",
                "body": "b",
            }
        ),
        broken,
    )
    rig.tick()
    assert rig.state("unbuildable") is JobState.REVIEW
    assert rig.of("unbuildable", "Escalated")[0].reason == "rejected"
    assert rig.names("unbuildable") == ["Requested", "Escalated"]  # never claimed
    assert rig.sends() == 0


# -- the copy count after a resend (policy verify_after) ---------------------------------

SHORT_WINDOWS = {
    "on_unknown": "retry",
    "search_after": "60s",
    "search_interval": "60s",
    "confirm_misses": 2,
    "verify_after": "10m",
}


def test_a_duplicate_hidden_by_the_index_lag_is_caught_after_verify_after(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator
) -> None:
    """Windows (60s + 60s) shorter than the lag (400s): the dropped response's copy is
    invisible to both searches, the job is resent and confirmed by the resend's response.
    verify_after (10m) later the index shows both copies: Duplicate, Escalated, review."""
    rig = make_rig({"receipts": SHORT_WINDOWS})
    emulator.set_lag(400)
    relay.set_plan(FaultPlan(send=["drop-response"]))
    message_id = rig.submit("receipts", "hidden-dup")
    rig.tick()
    rig.advance_and_tick(60)
    rig.advance_and_tick(60)  # second miss believed: requeued
    rig.tick()  # the resend, confirmed by its response
    assert rig.state("hidden-dup") is JobState.CONFIRMED
    assert emulator.copies(message_id) == 2
    [confirmed] = rig.of("hidden-dup", "Confirmed")
    assert confirmed.verify_at == confirmed.timestamp + timedelta(minutes=10)
    searches = rig.searches()

    rig.advance_and_tick(599)
    assert rig.searches() == searches  # not before verify_after
    assert rig.state("hidden-dup") is JobState.CONFIRMED
    rig.advance_and_tick(1)
    assert rig.state("hidden-dup") is JobState.REVIEW
    assert rig.names("hidden-dup")[-2:] == ["Duplicate", "Escalated"]
    assert rig.of("hidden-dup", "Escalated")[0].reason == "duplicate"
    for _ in range(3):
        rig.advance_and_tick(600)
    assert rig.sends() == 2  # never a third


def test_a_job_confirmed_without_a_resend_is_not_verified(
    make_rig: RigFactory, emulator: GmailEmulator
) -> None:
    rig = make_rig({"receipts": SHORT_WINDOWS})
    rig.submit("receipts", "plain")
    rig.tick()
    [confirmed] = rig.of("plain", "Confirmed")
    assert confirmed.verify_at is None
    rig.advance_and_tick(3600)
    assert rig.searches() == 0
    assert rig.names("plain")[-1] == "Confirmed"


def test_a_verification_that_finds_no_copy_yet_looks_again_then_stops(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator
) -> None:
    """fail-before-forward, then the resend's copy is still not indexed at verify_after
    (lag 20m): the verification looks again after search_interval, confirm_misses times
    in all, then stops; the job stays confirmed (the provider confirmed the copy)."""
    rig = make_rig({"receipts": SHORT_WINDOWS})
    relay.set_plan(FaultPlan(send=["fail-before-forward"]))
    rig.submit("receipts", "slow-index")
    rig.tick()
    rig.advance_and_tick(60)
    rig.advance_and_tick(60)
    emulator.set_lag(1200)  # the resend's copy is indexed only 20 minutes later
    rig.tick()
    assert rig.state("slow-index") is JobState.CONFIRMED
    rig.advance_and_tick(600)
    rig.advance_and_tick(60)
    verified = rig.of("slow-index", "Verified")
    assert [(v.hits, v.next_verify_at is None) for v in verified] == [(0, False), (0, True)]
    assert rig.state("slow-index") is JobState.CONFIRMED
    searches = rig.searches()
    rig.advance_and_tick(3600)
    assert rig.searches() == searches


# -- an outage during searches: waited out behind the circuit -----------------------------


def test_refused_connections_during_searches_are_waited_out_behind_the_circuit(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """The relay refuses connections while three searches are due: they open the circuit
    (docs/operations.md "Outages and quotas"), the due searches then wait for one probe at
    a time instead of each backing off and retrying on its own, nothing is recorded, and
    once the relay passes again every job is confirmed by its search with one copy."""
    rig = make_rig({"receipts": RETRY_5M})
    relay.set_plan(FaultPlan(send="drop-response"))
    keys = [f"outage-{n}" for n in range(3)]
    message_ids = [rig.submit("receipts", key) for key in keys]
    rig.tick()
    assert all(rig.state(key) is JobState.UNKNOWN for key in keys)
    relay.stop()  # connection refused from here on
    clock.advance(300)  # every search is due
    failed = sum(rig.engine.tick().errors for _ in range(3))
    assert failed == 3, failed
    [opened] = rig.engine.open_circuits()
    assert opened.scope == "gmail" and opened.failures == 3
    probes = 0
    for _ in range(20):  # 20 s of outage: the probes back off 1, 2, 4, 8 s
        clock.advance(1)
        probes += rig.engine.tick().errors
    assert 1 <= probes <= 5, probes  # not 3 jobs x 20 retries
    for key in keys:
        assert rig.names(key)[-1] == "Unknown", rig.names(key)
    relay.set_plan(FaultPlan())
    relay.start()  # the same port: the provider answers again
    for _ in range(20):
        clock.advance(1)
        rig.engine.tick()
        if all(rig.state(key) is JobState.CONFIRMED for key in keys):
            break
    assert rig.engine.open_circuits() == []
    for key, message_id in zip(keys, message_ids, strict=True):
        assert rig.state(key) is JobState.CONFIRMED, rig.names(key)
        [confirmed] = rig.of(key, "Confirmed")
        assert confirmed.via == "search"
        assert rig.of(key, "SearchedMiss") == []
        assert emulator.copies(message_id) == 1
    assert rig.sends() == 3


def test_refused_connections_at_the_draft_step_are_waited_out_behind_the_circuit(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """send_via = "drafts" with the relay refusing connections: the draft step before the
    claim fails as unavailable, opens the circuit and uses none of `max_attempts = 1`; no
    claim is made; once the relay passes again each job is sent once through its draft."""
    rig = make_rig({"receipts": {**RETRY_5M, "max_attempts": 1}}, send_via="drafts")
    relay.stop()
    keys = [f"draft-outage-{n}" for n in range(3)]
    message_ids = [rig.submit("receipts", key) for key in keys]
    unavailable = sum(rig.engine.tick().unavailable for _ in range(3))
    assert unavailable == 3
    assert [c.failures for c in rig.engine.open_circuits()] == [3]
    clock.advance(1)
    assert rig.engine.tick().unavailable == 1  # the probe, and only the probe
    for key in keys:
        assert rig.names(key) == ["Requested"], rig.names(key)
    relay.start()
    for _ in range(10):
        clock.advance(2)
        rig.engine.tick()
        if all(rig.state(key) is JobState.CONFIRMED for key in keys):
            break
    for key, message_id in zip(keys, message_ids, strict=True):
        assert rig.state(key) is JobState.CONFIRMED, rig.names(key)
        assert len(rig.of(key, "Attempted")) == 1
        assert emulator.copies(message_id) == 1
    assert rig.sends() == 3 and rig.engine.open_circuits() == []


def test_a_fenced_draft_a_person_sent_by_hand_is_not_sent_again(
    make_rig: RigFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    clock: FakeClock,
    crash_at: Callable[[str | None], None],
) -> None:
    """send_via = "drafts": a daemon dies after its claim, before its drafts.send. The
    next daemon's sweep finds the draft unsent and records its fence, and the fence's
    drafts.delete never reaches Gmail (answered 503 by the relay). Before it is tried
    again a person presses Send on that draft in Gmail's web client, which sends it
    under a message id of its own. The next sweep found the draft gone and its message
    gone, took that for the fence's doing ("not sent", `DraftPending`) and, with
    `pending_draft = "send"`, sent the job again: two copies at the emulator. A draft
    gone without this daemon's deletion confirming it proves nothing: `DraftGone`, the
    search after `search_after` finds the person's copy, one copy."""
    crashed = make_rig({"receipts": {**RETRY_5M, "pending_draft": "send"}}, send_via="drafts")
    message_id = crashed.submit("receipts", "by-hand")
    crash_at("after-claim")
    with pytest.raises(Crash):
        crashed.engine.tick()
    crash_at(None)
    [draft_id] = emulator.drafts(MAILBOX)
    rig = make_rig(send_via="drafts")  # the restarted daemon
    clock.advance(DEADLINE + 0.1)
    relay.set_plan(FaultPlan(other=["pass", "503"]))  # the check's drafts.get; the delete's
    for _ in range(3):
        rig.engine.tick()
        if rig.of("by-hand", "DraftsDeleted"):
            break
    assert rig.names("by-hand")[-2:] == ["Unknown", "DraftsDeleted"], rig.names("by-hand")
    assert list(emulator.drafts(MAILBOX)) == [draft_id]  # the fence's deletion failed
    relay.set_plan(FaultPlan())
    emulator.send_draft_by_hand(draft_id)
    assert emulator.copies(message_id) == 1
    for _ in range(4):
        rig.advance_and_tick(2)
    rig.advance_and_tick(300)  # `search_after`
    rig.tick()
    assert emulator.copies(message_id) == 1, rig.names("by-hand")
    assert rig.sends() == 0  # the daemons' drafts.send calls: none got through
    assert "DraftPending" not in rig.names("by-hand")
    assert rig.state("by-hand") is JobState.CONFIRMED, rig.names("by-hand")
    assert rig.of("by-hand", "Confirmed")[0].via == "search"


def test_a_recorded_draft_a_person_sent_by_hand_before_its_claim_is_not_sent_again(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """send_via = "drafts", `pending_draft = "send"`: a drafts.send answered 503 leaves
    the draft unsent (`DraftPending`), due to be sent again. Before its next claim a
    person presses Send on that draft in Gmail's web client, which sends it under a
    message id of its own. The claim's draft step found the recorded draft gone and its
    message gone, and made and sent a new draft: two copies at the emulator. A recorded
    draft gone without a SENT message, with no person's resend since, is no proof that
    nothing was sent: the job goes to review (`unknown-outcome`), one copy."""
    rig = make_rig({"receipts": {**RETRY_5M, "pending_draft": "send"}}, send_via="drafts")
    message_id = rig.submit("receipts", "by-hand-2")
    relay.set_plan(FaultPlan(send=["503"]))
    rig.tick()
    assert rig.names("by-hand-2")[-2:] == ["Unknown", "DraftPending"], rig.names("by-hand-2")
    [draft_id] = emulator.drafts(MAILBOX)
    emulator.send_draft_by_hand(draft_id)
    for _ in range(3):
        rig.advance_and_tick(1)
    assert emulator.copies(message_id) == 1, rig.names("by-hand-2")
    assert rig.sends() == 1  # the 503 alone
    assert rig.state("by-hand-2") is JobState.REVIEW, rig.names("by-hand-2")
    job = rig.ledger.get_job("by-hand-2")
    assert job.reason == "unknown-outcome"
    assert emulator.drafts(MAILBOX) == {}


def test_a_persons_resend_seconds_after_a_hand_send_of_the_draft_sends_no_second_copy(
    make_rig: RigFactory, relay: FaultRelay, emulator: GmailEmulator, clock: FakeClock
) -> None:
    """send_via = "drafts", `pending_draft = "review"`: a drafts.send answered 503 leaves
    the draft unsent and the job in review with it recorded. Long after that attempt a
    person presses Send on the draft in Gmail's web client (a message id of its own; the
    search index shows the copy 30 s later) and an operator resends the job at once. The
    resend's fence found the draft gone, its search missed the copy, and the next tick
    sent a second: two copies at the emulator. The draft found gone counts as a possible
    send: the resend is refused until `search_after` from then, one copy."""
    from daemon.service_layer.problems import ServiceError
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.exceptions import Refusal

    rig = make_rig({"receipts": {**RETRY_5M, "pending_draft": "review"}}, send_via="drafts")
    message_id = rig.submit("receipts", "by-hand-3")
    relay.set_plan(FaultPlan(send=["503"]))
    rig.tick()
    assert rig.state("by-hand-3") is JobState.REVIEW, rig.names("by-hand-3")
    [draft_id] = emulator.drafts(MAILBOX)
    relay.set_plan(FaultPlan())
    clock.advance(600)  # the last attempt is long past `search_after`
    emulator.set_lag(30)
    emulator.send_draft_by_hand(draft_id)
    door = Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.holder.current),
        providers=lambda _: contextlib.nullcontext(rig.provider),
    )
    with pytest.raises(ServiceError) as refused:
        door.resolve("by-hand-3", Resolution.RESEND, note="not in Sent", by="alice")
    assert refused.value.kind is Refusal.CONFLICT, refused.value.message
    assert "resend after" in refused.value.message
    for _ in range(2):
        rig.advance_and_tick(1)
    assert emulator.copies(message_id) == 1, rig.names("by-hand-3")
    assert rig.sends() == 1  # the 503 alone
    assert rig.state("by-hand-3") is JobState.REVIEW
    assert rig.names("by-hand-3")[-1] == "DraftGone"


def claimed_and_held(
    ledger: Ledger, leases: Leases | None, clock: FakeClock, key: str, *, submit: bool = True
) -> None:
    """`key` submitted (unless `submit` is False), claimed for 30 s by "d1", and held by
    `leases` as a worker's call would hold it."""
    if submit:
        ledger.submit(receipt("receipts", key), SHOP)
    job = ledger.get_job(key)
    job.claim(provider="gmail", deadline=clock() + timedelta(seconds=30), at=clock(), daemon="d1")
    ledger.save_job(job)
    if leases is not None:
        leases.hold(job, 30.0, clock())


@pytest.mark.postgres
def test_a_claim_renewal_stuck_behind_a_row_lock_holds_up_no_other_lease(pg_url: str) -> None:
    """Two slow calls' leases fall due while another session holds one job's index row
    (a long transaction, an open psql). That job's renewal waits for the row (each try
    `[store] lock_timeout`, tried again for `store_wait`); the other's is written at once,
    not after it, when its lease could have lapsed (docs/architecture.md "Leases")."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    import psycopg
    from tests.conftest import PG_URL

    from ledger.stores.index import INDEX_TABLE
    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=1)
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        ledger.store_wait = 8.0  # the stuck save gives up after this (the default: 60 s)
        leases = Leases(ledger, clock, "d1", clock.elapsed)
        for key in ("k1", "k2"):
            claimed_and_held(ledger, leases, clock, key)
        clock.advance(11)  # both renewals due
        with psycopg.connect(PG_URL) as holder:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE', ["k1"]
            )
            started = time.monotonic()
            renewed = leases.renew_due()
            waited = time.monotonic() - started
            k2 = [type(e).__name__ for e in ledger.history("k2")]
            k1 = [type(e).__name__ for e in ledger.history("k1")]
            holder.rollback()
        assert waited < 5.0, "k2's renewal waited behind k1's row lock"
        assert renewed == 1 and "LeaseRenewed" in k2 and "LeaseRenewed" not in k1
        for _ in range(200):  # the row is free: k1's renewal lands
            if "LeaseRenewed" in [type(e).__name__ for e in ledger.history("k1")]:
                break
            time.sleep(0.05)
        assert ledger.get_job("k1").due_at == clock() + timedelta(seconds=30)
        leases.close()


@pytest.mark.postgres
def test_renewals_stuck_behind_row_locks_leave_the_pool_to_the_other_store_work(
    pg_url: str,
) -> None:
    """Four slow calls' leases fall due while another session holds all four jobs' index
    rows. Each waiting renewal holds a pooled connection: at most half the pool's (2 of 4,
    no overflow) wait at once, so a claim of another job still gets a connection at once
    instead of waiting for one (`store.connect_timeout`) and failing. Once the rows are
    free every renewal lands (docs/architecture.md "Leases")."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    import psycopg
    from tests.conftest import PG_URL

    from ledger.stores.index import INDEX_TABLE
    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(
        spec, pool_size=4, max_overflow=0, lock_timeout=30, connect_timeout=3
    )
    clock = FakeClock(datetime.now(UTC))
    keys = ["k1", "k2", "k3", "k4"]
    with Ledger(spec, clock=clock) as ledger:
        ledger.store_wait = 30.0
        leases = Leases(ledger, clock, "d1", clock.elapsed)
        for key in keys:
            claimed_and_held(ledger, leases, clock, key)
        ledger.submit(receipt("receipts", "other"), SHOP)
        clock.advance(11)  # every renewal due
        with psycopg.connect(PG_URL) as holder, psycopg.connect(PG_URL, autocommit=True) as look:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = ANY(%s) FOR UPDATE',
                [keys],
            )
            assert leases.renew_due() == 0
            waiting = 0
            for _ in range(20):  # the renewals reach their lock waits
                time.sleep(0.05)
                # Only the sessions waiting for this holder: another test running beside
                # this one (pytest -n 2) may have lock waits of its own in the database.
                row = look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    [holder.info.backend_pid],
                ).fetchone()
                waiting = max(waiting, 0 if row is None else int(row[0]))
            assert waiting == 2, waiting
            started = time.monotonic()
            claimed_and_held(ledger, None, clock, "other", submit=False)  # not behind them
            assert time.monotonic() - started < 2.0
            holder.rollback()
        for _ in range(200):  # the rows are free: the queued renewals land too
            if all("LeaseRenewed" in [type(e).__name__ for e in ledger.history(k)] for k in keys):
                break
            time.sleep(0.05)
        for key in keys:
            assert ledger.get_job(key).due_at == clock() + timedelta(seconds=30), key
        assert leases.renewed == 4
        leases.close()


@pytest.mark.postgres
def test_a_renewal_withdrawn_by_a_stopping_daemon_is_rolled_back_once_its_row_is_free(
    pg_url: str,
) -> None:
    """The daemon stops while a renewal waits for its job's row (another session holds
    it): `Leases.close` withdraws it after `close_wait`; once the row is free the save
    gets it, asks its guard, and rolls back. The stored deadline stays the claim's
    (docs/architecture.md "Leases")."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    import psycopg
    from tests.conftest import PG_URL

    from ledger.stores.index import INDEX_TABLE
    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=30)
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        leases = Leases(ledger, clock, "d1", clock.elapsed)
        claimed_and_held(ledger, leases, clock, "k1")
        deadline = ledger.get_job("k1").due_at
        clock.advance(11)
        with psycopg.connect(PG_URL) as holder:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE', ["k1"]
            )
            assert leases.renew_due() == 0
            leases.close_wait = 0.3
            started = time.monotonic()
            leases.close()
            assert time.monotonic() - started < 2.0
            holder.rollback()
        lease = leases.lease("k1")
        for _ in range(100):
            if lease is None or not lease.in_flight:
                break
            time.sleep(0.05)
        assert lease is not None and not lease.in_flight and not lease.renewing
        assert "LeaseRenewed" not in [type(e).__name__ for e in ledger.history("k1")]
        assert ledger.get_job("k1").due_at == deadline


@pytest.mark.postgres
@pytest.mark.parametrize("by", ["close", "call-ended"])
def test_a_renewal_waiting_for_a_pooled_connection_gives_up_at_once_at_a_stop(
    pg_url: str, by: str
) -> None:
    """A slow call's lease renewal falls due while every pooled connection is held by
    other store work (2 of 2, no overflow). It waits for a connection, not a row, so no
    guard is asked: before, `Leases.close` (the stop) and the worker whose call ended
    (`stop_renewing`) waited for it up to `[store] connect_timeout` and more. Now the
    wait gives up at once, nothing begun and nothing written (docs/architecture.md
    "Leases", docs/operations.md "Stopping")."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, pool_size=2, max_overflow=0, connect_timeout=10)
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        leases = Leases(ledger, clock, "d1", clock.elapsed)
        claimed_and_held(ledger, leases, clock, "k1")
        deadline = ledger.get_job("k1").due_at
        pool = ledger.recorder.datastore.pool  # type: ignore[attr-defined]
        taken = [pool.getconn(), pool.getconn()]  # the pool is exhausted
        try:
            clock.advance(11)
            assert leases.renew_due() == 0
            for _ in range(100):
                if pool.get_stats().get("requests_waiting", 0) >= 1:
                    break
                time.sleep(0.02)
            assert pool.get_stats().get("requests_waiting", 0) >= 1, pool.get_stats()
            lease = leases.lease("k1")
            assert lease is not None and lease.in_flight
            stop = leases.close if by == "close" else lambda: leases.stop_renewing(lease)
            stopper = threading.Thread(target=stop, daemon=True)
            started = time.monotonic()
            stopper.start()
            stopper.join(timeout=30)
            took = time.monotonic() - started
            assert not stopper.is_alive() and took < 2.0, f"took {took:.1f}s"
            for _ in range(100):
                if not lease.in_flight:
                    break
                time.sleep(0.02)
            assert not lease.in_flight and not lease.renewing
        finally:
            for conn in taken:
                pool.putconn(conn)
        leases.close()
        assert "LeaseRenewed" not in [type(e).__name__ for e in ledger.history("k1")]
        assert ledger.get_job("k1").due_at == deadline


@contextlib.contextmanager
def _renewal_and_pool(pg_url: str) -> Iterator[tuple[Ledger, SendJob, Any]]:
    """A ledger on a pool of 2 connections (no overflow, a 2 s wait for one, 1 s lock
    waits), job k1 claimed with a renewal pending, and a context in which the test holds
    both connections (the pool exhausted by other work)."""
    import dataclasses
    from datetime import UTC, datetime

    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, pool_size=2, max_overflow=0, connect_timeout=2, lock_timeout=1)
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        pool = ledger.recorder.datastore.pool  # type: ignore[attr-defined]
        claimed_and_held(ledger, None, clock, "k1")
        job = ledger.get_job("k1")
        job.renew_lease(deadline=clock() + timedelta(seconds=60), at=clock(), daemon="d1")

        @contextlib.contextmanager
        def exhausted() -> Iterator[None]:
            taken = [pool.getconn(), pool.getconn()]
            try:
                yield
            finally:
                for conn in taken:
                    pool.putconn(conn)

        yield ledger, job, exhausted


@pytest.mark.postgres
def test_a_save_waits_for_a_pooled_connection_once_not_ten_times(pg_url: str) -> None:
    """Every pooled connection is taken: a save waits `store.connect_timeout` for one and
    fails. The recorder's ten tries, for a connection lost under a statement, took the
    pool's timeout for one: ten waits (20 s here, 100 s by default)."""
    import time

    from eventsourcing.persistence import OperationalError

    with _renewal_and_pool(pg_url) as (ledger, job, exhausted):
        with exhausted():
            started = time.monotonic()
            with pytest.raises(OperationalError, match="couldn't get a connection"):
                ledger.save_job(job)
            took = time.monotonic() - started
        assert 1.5 < took < 5.0, f"took {took:.1f}s"
        ledger.save_job(job)  # a connection free again: saved


@pytest.mark.postgres
def test_a_stopping_daemons_outcome_waits_for_a_pooled_connection_only_within_its_window(
    pg_url: str,
) -> None:
    """Once the daemon stops, an outcome is tried only within one `[store] lock_timeout`
    (1 s here) of when it was asked (daemon/engine/commit.py): waiting for a pooled
    connection too, not `store.connect_timeout` (2 s here, 10 s by default), nor ten of
    them. Left unsaved, it is recovered at its claim's deadline."""
    import time

    from daemon.engine.commit import GroupCommit
    from ledger.stores.index import Withdrawn

    with _renewal_and_pool(pg_url) as (ledger, job, exhausted):
        stopping = threading.Event()
        stopping.set()
        commits = GroupCommit(ledger, window=0, stopping=stopping, stop_wait=1.0)
        told: list[BaseException | None] = []
        with exhausted():
            started = time.monotonic()
            commits.save_soon(job, told.append)
            commits.flush()
            took = time.monotonic() - started
        assert took < 1.8, f"took {took:.1f}s"
        assert len(told) == 1 and isinstance(told[0], Withdrawn), told
        assert "LeaseRenewed" not in [type(e).__name__ for e in ledger.history("k1")]


def _blocked_by(look: Any, holder: Any) -> int:
    """Sessions waiting for a lock `holder`'s session holds (only its own: another test
    beside this one, pytest -n 2, may have lock waits of its own in the database)."""
    row = look.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        [holder.info.backend_pid],
    ).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("row_freed", [True, False], ids=["row-freed", "row-held"])
def test_a_stop_while_a_renewal_waits_for_its_row_ends_in_time_and_sends_once(
    pg_url: str, row_freed: bool
) -> None:
    """A slow call's lease renewal waits for its job's row (another session holds it: a
    long transaction, an open psql) when the call answers and the daemon is stopped. The
    worker withdraws the renewal instead of waiting for its save (up to the store's
    minute, longer than `daemon.stop_timeout`), then saves the outcome, bounded by
    `[store] lock_timeout` once the daemon stops: the stop ends within a few lock
    timeouts. Row freed meanwhile: the outcome is saved, the renewal never lands. Row
    held throughout: nothing more is written, and a second daemon recovers the claim at
    its deadline as last written (Unknown), finds the one copy and confirms it: one send
    (docs/architecture.md "Leases")."""
    import dataclasses
    import time
    from datetime import UTC, datetime

    import psycopg
    from tests.conftest import PG_URL
    from tests.unit.engine_rig import policy

    from daemon.doubles.fake_provider import FakeProvider, Scripted
    from ledger.stores.index import INDEX_TABLE
    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=1)
    clock = FakeClock(datetime.now(UTC))
    provider = FakeProvider("fake", clock=clock)
    holder_policies = PolicyHolder(lambda: PolicySet({"receipts": policy("receipts")}))

    def engine(name: str) -> Engine:
        return Engine(
            ledger,
            holder_policies,
            {"fake": provider},
            provider_timeouts={"fake": 30.0},
            clock=clock,
            elapsed=clock.elapsed,  # as the Rig's: a lease ends when the test moves the clock
            concurrency=1,
            deadline_grace=5.0,
            daemon_name=name,
        )

    with Ledger(spec, clock=clock) as ledger:
        ledger.store_wait = 20.0  # a save stuck on the row gives up after this
        ledger.submit(receipt("receipts", "k1"), policy("receipts").sender)
        release = threading.Event()
        provider.script(Scripted.slow(release))
        first = engine("d1")
        first.hand_out()
        for _ in range(200):
            if provider.hanging:
                break
            time.sleep(0.01)
        assert provider.hanging == 1
        deadline = ledger.get_job("k1").due_at
        clock.advance(12)  # a third of the 35 s lease: its renewal is due
        with psycopg.connect(PG_URL) as holder, psycopg.connect(PG_URL, autocommit=True) as look:
            holder.execute(
                f'SELECT 1 FROM "{spec.schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE', ["k1"]
            )
            assert first.renew_leases() == 0  # its renewal waits for the row
            for _ in range(100):
                if _blocked_by(look, holder):
                    break
                time.sleep(0.02)
            assert _blocked_by(look, holder) == 1
            release.set()  # the call answers: its outcome waits for the row too
            time.sleep(0.2)
            first.stop()
            stopper = threading.Thread(target=first.close, daemon=True)
            started = time.monotonic()
            stopper.start()
            if row_freed:
                time.sleep(0.5)
                holder.rollback()
            stopper.join(timeout=30)
            took = time.monotonic() - started
            holder.rollback()
        assert not stopper.is_alive()
        assert took < 4.0, f"the stop took {took:.1f}s"
        names = [type(e).__name__ for e in ledger.history("k1")]
        assert "LeaseRenewed" not in names or "Confirmed" in names, names
        if row_freed:
            assert names[-1] == "Confirmed", names
        else:
            assert names == ["Requested", "Attempted"], names
            assert ledger.get_job("k1").due_at == deadline
            second = engine("d2")
            clock.advance(40)  # past the claim's deadline as last written
            for _ in range(10):
                second.tick()
                if ledger.get_job("k1").state is JobState.CONFIRMED:
                    break
                clock.advance(40)
            second.close()
            names = [type(e).__name__ for e in ledger.history("k1")]
            assert "Unknown" in names and names[-1] == "Confirmed", names
        assert provider.sends == 1
