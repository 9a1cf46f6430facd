"""Searches, draft checks and the draft step under the circuit of their scope
(daemon/engine/circuit.py, search.py, drafts.py; docs/operations.md "Outages and quotas"):
a search that proves the provider unavailable counts as a failed send does, due searches
wait while the circuit is open except its one probe, and no failed or held search is ever
a miss."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine.circuit import CHECK, Admit, Circuits, CircuitSettings
from daemon.engine.search import SearchBackoff
from daemon.engine.work import Work
from daemon.providers.base import (
    ProviderBase,
    ProviderError,
    SearchResult,
    SendOutcome,
    next_call,
)
from ledger.vocabulary import ConfirmedVia, JobState

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def unknown_jobs(rig: EngineRig, count: int, prefix: str = "u") -> list[str]:
    """`count` jobs sent with their reply lost (a copy stored), due for a search in 60 s."""
    names = [f"{prefix}-{n}" for n in range(count)]
    for key in names:
        rig.submit("receipts", key)
    rig.provider.script(*[Scripted.dropped_response() for _ in names])
    rig.tick()
    assert all(rig.job(key).state is JobState.UNKNOWN for key in names)
    return names


def events_named(rig: EngineRig, key: str, name: str) -> int:
    return sum(1 for event in rig.events(key) if event == name)


def opened_by_searches(rig: EngineRig, failing: int) -> list[str]:
    """Three unknown jobs whose searches, due now, meet a refused connection `failing`
    times: the first three open the circuit."""
    keys = unknown_jobs(rig, 3)
    rig.clock.advance(60)
    rig.provider.fail_searches(failing, unavailable=True)
    for _ in range(2):
        rig.engine.tick()  # two check workers: three searches may take two ticks
    assert rig.provider.searches == 3
    assert [(c.scope, c.failures) for c in rig.engine.open_circuits()] == [("fake", 3)]
    return keys


def test_unavailable_searches_open_the_circuit_and_due_searches_wait_for_the_probe() -> None:
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    try:
        keys = opened_by_searches(rig, 3)
        rig.submit("receipts", "new")  # the scope's sends wait too
        for _ in range(5):
            rig.engine.tick()  # the clock stands still: no probe is due
        assert rig.provider.searches == 3 and rig.provider.sends == 3
        assert rig.job("new").state is JobState.REQUESTED
        rig.clock.advance(1)  # the probe: the send, which is answered; all go
        for _ in range(3):
            rig.engine.tick()
        assert rig.engine.open_circuits() == []
        for key in [*keys, "new"]:
            job = rig.job(key)
            assert job.state is JobState.CONFIRMED, (key, rig.events(key))
            assert rig.copies(key) == 1
        for key in keys:
            assert events_named(rig, key, "SearchedMiss") == 0
            assert "Requeued" not in rig.events(key) and "Escalated" not in rig.events(key)
    finally:
        rig.close()


def test_a_search_can_be_the_probe_and_a_failed_probe_waits_twice_as_long() -> None:
    rig = EngineRig(policy("receipts", on_unknown="search-then-review"))
    try:
        keys = opened_by_searches(rig, 4)
        rig.clock.advance(1)
        rig.engine.tick()  # one search probes, and fails
        assert rig.provider.searches == 4
        [opened] = rig.engine.open_circuits()
        assert opened.next_probe == rig.clock() + timedelta(seconds=2)
        rig.clock.advance(1)
        rig.engine.tick()
        assert rig.provider.searches == 4  # 2 s this time
        rig.clock.advance(1)
        for _ in range(3):
            rig.engine.tick()  # the probe answers: closed, and every due search is made
        assert rig.engine.open_circuits() == []
        assert rig.provider.searches == 4 + 3
        for key in keys:
            assert rig.job(key).state is JobState.CONFIRMED
            assert events_named(rig, key, "SearchedMiss") == 0
            assert rig.copies(key) == 1
    finally:
        rig.close()


def test_a_search_that_fails_with_an_answer_does_not_open_the_circuit() -> None:
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    try:
        unknown_jobs(rig, 3)
        rig.clock.advance(60)
        rig.provider.fail_searches(3)  # a 500 each: the provider answers
        rig.engine.tick()
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


def opened_by_sends(rig: EngineRig, refusals: int) -> str:
    """An unknown job, then three sends refused as unavailable (of `refusals` scripted):
    the circuit is open. The unknown job's key."""
    [key] = unknown_jobs(rig, 1)
    rig.provider.script(*[Scripted.unavailable() for _ in range(refusals)])
    for n in range(3):
        rig.submit("receipts", f"down-{n}")
        rig.tick()
    assert len(rig.engine.open_circuits()) == 1
    return key


def test_a_search_success_closes_a_circuit_opened_by_sends() -> None:
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    try:
        key = opened_by_sends(rig, 3)
        rig.clock.advance(60)  # the search is due, and it is the probe
        rig.engine.tick()
        assert rig.job(key).state is JobState.CONFIRMED
        assert rig.engine.open_circuits() == []
        assert all(rig.job(f"down-{n}").state is JobState.CONFIRMED for n in range(3))
    finally:
        rig.close()


def test_held_searches_leave_no_trace_and_never_reach_review() -> None:
    # One failure opens the circuit and no probe comes: searches wait as long as it takes.
    rig = EngineRig(policy("receipts", on_unknown="search-then-review", confirm_misses=1))
    rig.engine.circuits.settings = CircuitSettings(failures=1, probe_after=3000, probe_max=3000)
    try:
        keys = unknown_jobs(rig, 4)
        rig.clock.advance(60)
        rig.provider.fail_searches(1, unavailable=True)
        for _ in range(20):
            rig.engine.tick()
            rig.clock.advance(100)
        assert rig.provider.searches == 1
        for key in keys:
            assert rig.job(key).state is JobState.UNKNOWN
            assert rig.events(key)[-1] == "Unknown"  # nothing recorded since
    finally:
        rig.close()


def test_an_unavailable_read_back_counts_toward_the_circuit() -> None:
    rig = EngineRig(policy("receipts"))
    rig.engine.circuits.settings = CircuitSettings(failures=1)
    provider = rig.provider

    def down(provider_message_id: str) -> str | None:
        raise ProviderError("get: connection refused", unavailable=True)

    provider.read_message_id = down  # type: ignore[method-assign]
    try:
        rig.submit("receipts", "read-back")  # the first sends are all read back
        rig.tick()
        assert rig.job("read-back").state is JobState.CONFIRMED
        assert [c.scope for c in rig.engine.open_circuits()] == ["fake"]
    finally:
        rig.close()


# -- the draft step (send_via = "drafts") -------------------------------------------------


def drafts_rig(**policy_fields: Any) -> EngineRig:
    rig = EngineRig(policy("receipts", **policy_fields))
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    return rig


def drafts(rig: EngineRig) -> FakeDraftsProvider:
    assert isinstance(rig.provider, FakeDraftsProvider)
    return rig.provider


def test_an_outage_at_the_draft_step_is_waited_out_behind_the_circuit() -> None:
    rig = drafts_rig(max_attempts=1)
    try:
        keys = [f"d-{n}" for n in range(5)]
        for key in keys:
            rig.submit("receipts", key)
        drafts(rig).creates_unavailable(4)
        report = rig.engine.tick()
        assert report.errors == 0 and report.unavailable == 3
        assert len(rig.engine.open_circuits()) == 1
        creates = drafts(rig).drafts_created
        for _ in range(3):
            rig.engine.tick()  # held: not taken for its draft step
        assert drafts(rig).drafts_created == creates
        for key in keys:
            assert rig.job(key).state is JobState.REQUESTED
            assert "Attempted" not in rig.events(key)
        rig.clock.advance(1)
        rig.engine.tick()  # the probe's create fails: twice the wait
        rig.clock.advance(2)
        rig.engine.tick()  # the probe is sent; every job follows
        for key in keys:
            job = rig.job(key)
            assert job.state is JobState.CONFIRMED, (key, rig.events(key))
            assert job.attempts == 1 and rig.copies(key) == 1  # max_attempts = 1 was enough
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


def test_a_refused_draft_goes_to_review_and_is_never_sent() -> None:
    rig = drafts_rig()
    try:
        rig.submit("receipts", "refused")
        drafts(rig).refuse_creates(1)
        rig.engine.tick()
        job = rig.job("refused")
        assert job.state is JobState.REVIEW and job.reason == "rejected"
        assert "Attempted" not in rig.events("refused") and drafts(rig).draft_sends == 0
    finally:
        rig.close()


def test_an_unavailable_draft_check_in_the_sweep_counts_and_waits() -> None:
    rig = drafts_rig(on_unknown="retry")
    try:
        rig.submit("receipts", "crashed")
        rig.provider.script(Scripted.crash_during_call(stored=True))
        rig.engine.tick()  # the claim is saved, its outcome never
        rig.restart()
        rig.engine.circuits.settings = CircuitSettings(failures=1, probe_after=5, probe_max=5)
        rig.engine.recover_own_claims()
        assert rig.job("crashed").state is JobState.UNKNOWN
        drafts(rig).checks_unavailable(1)
        rig.engine.tick()
        assert len(rig.engine.open_circuits()) == 1
        assert rig.job("crashed").state is JobState.UNKNOWN
        rig.engine.tick()
        rig.clock.advance(5)
        rig.engine.tick()  # the probe: the draft answers SENT
        job = rig.job("crashed")
        assert job.state is JobState.CONFIRMED, rig.events("crashed")
        confirmed = [e for e in rig.ledger.history("crashed") if type(e).__name__ == "Confirmed"]
        assert confirmed[-1].via == ConfirmedVia.DRAFT
        assert rig.copies("crashed") == 1
    finally:
        rig.close()


def test_a_probe_whose_draft_step_crashed_is_handed_back() -> None:
    rig = drafts_rig()
    try:
        rig.submit("receipts", "probe")
        drafts(rig).creates_unavailable(3)
        for _ in range(3):
            rig.engine.tick()
        assert len(rig.engine.open_circuits()) == 1
        drafts(rig).crash_on_create()  # the probe's create is stored, then the daemon dies
        rig.clock.advance(1)
        assert rig.engine.tick().errors == 1
        rig.engine.tick()  # the next probe reuses the draft the crash left, and sends it
        assert rig.job("probe").state is JobState.CONFIRMED, rig.events("probe")
        assert rig.copies("probe") == 1 and drafts(rig).drafts_created == 1
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


def test_held_searches_at_the_head_of_the_index_do_not_starve_a_later_one() -> None:
    rig = EngineRig(policy("receipts", on_unknown="retry"), concurrency=1)
    try:
        early = unknown_jobs(rig, 3, prefix="early")  # due first
        rig.clock.advance(30)
        [late] = unknown_jobs(rig, 1, prefix="late")
        rig.clock.advance(60)  # all four due; the three early ones' searches fail
        rig.provider.fail_searches(3)
        for _ in range(6):  # the clock stands still: every backoff holds
            rig.engine.tick()
        assert rig.job(late).state is JobState.CONFIRMED, rig.events(late)
        assert all(rig.job(key).state is JobState.UNKNOWN for key in early)
        assert rig.provider.searches == 4
    finally:
        rig.close()


def test_sends_that_keep_failing_do_not_starve_the_searches_of_the_probe() -> None:
    """A daily sending limit: every send is refused as unavailable for hours while the
    searches would be answered. The probes alternate between the two kinds, so the
    search still gets through (and its answer closes the circuit)."""
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    try:
        key = opened_by_sends(rig, 100)
        for _ in range(4):
            rig.clock.advance(60)  # every probe is due at each tick; the search too
            rig.engine.tick()
            if rig.job(key).state is JobState.CONFIRMED:
                break
        assert rig.job(key).state is JobState.CONFIRMED, rig.events(key)
    finally:
        rig.close()


def test_the_probe_goes_to_sends_and_checks_in_turn() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=1.0))
    circuits.unavailable("s", T0)
    assert circuits.admit("s", T0, CHECK) is Admit.HOLD  # a check waits for the probe
    later = T0 + timedelta(seconds=1)
    assert circuits.admit("s", later) is Admit.PROBE  # the send asks first: it is due
    assert circuits.admit("s", later, CHECK) is Admit.HOLD  # and the check waits on
    circuits.unavailable("s", later)
    again = later + timedelta(seconds=1)
    assert circuits.next_probe("s") == again + timedelta(seconds=1)  # the check's turn
    assert circuits.admit("s", again) is Admit.HOLD
    assert circuits.admit("s", again, CHECK) is Admit.PROBE
    assert circuits.admit("s", again) is Admit.HOLD  # a send waits on
    circuits.unavailable("s", again)
    last = again + timedelta(seconds=1)
    assert circuits.admit("s", last, CHECK) is Admit.HOLD  # the send waited meanwhile
    assert circuits.admit("s", last) is Admit.PROBE


def test_a_turn_left_to_checks_that_never_come_is_taken_back() -> None:
    """The waiting check's job was settled elsewhere: after `probe_max` the send probes."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=5.0))
    circuits.unavailable("s", T0)
    assert circuits.admit("s", T0 + timedelta(seconds=1)) is Admit.PROBE
    assert circuits.admit("s", T0 + timedelta(seconds=1), CHECK) is Admit.HOLD
    circuits.unavailable("s", T0 + timedelta(seconds=1))  # the next probe is due at 3 s
    assert circuits.admit("s", T0 + timedelta(seconds=7)) is Admit.HOLD  # the check's turn
    assert circuits.next_probe("s") == T0 + timedelta(seconds=8)
    assert circuits.admit("s", T0 + timedelta(seconds=8)) is Admit.PROBE  # it never came


class TwoCalls(ProviderBase):
    """A search of two calls (as Graph's: pages, folders), whose quota scope goes to
    another daemon after the first (`lost()`)."""

    name = "paged"

    def __init__(self, lost: Callable[[], None]) -> None:
        self.lost = lost
        self.calls = 0

    def send_raw(self, raw: bytes) -> SendOutcome:
        raise AssertionError("no send here")

    def search(self, message_id: str) -> SearchResult:
        for _page in range(2):
            next_call(f"search {message_id}")
            self.calls += 1
            self.lost()
        return SearchResult(query=message_id, hits=())

    def read_message_id(self, provider_message_id: str) -> str | None:
        raise AssertionError("no read here")

    def close(self) -> None:
        pass


def test_a_check_stopped_between_its_calls_is_no_answer_and_no_failure() -> None:
    # The engine asks whether the job's scope is still its own before a check's call and,
    # through `calls_while`, between the calls one check makes: once it is not, the check
    # stops with no answer (never the empty result a whole search would be: a miss), and
    # nothing counts against the provider (no error, no backoff, no circuit).
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    ours = [True]
    backoff = SearchBackoff(Circuits(), clock, may_call=lambda work: ours[0])
    provider = TwoCalls(lambda: ours.__setitem__(0, False))
    counted: list[str] = []
    job = SimpleNamespace(key="k1", message_id="<m@x>", made_drafts=())
    work = SimpleNamespace(job=job, now=clock(), count=counted.append)
    assert backoff.search(cast(Work, work), provider) is None
    assert provider.calls == 1
    assert counted == [] and not backoff.held("k1", clock())
    ours[0], provider.lost = True, lambda: None
    assert backoff.search(cast(Work, work), provider) == SearchResult(query="<m@x>", hits=())
