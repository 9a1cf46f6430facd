"""A stopping daemon starts no provider call (docs/operations.md "Stopping"), the calls
that follow a send in its worker included: the sampled Message-ID read-back of a
confirmed send, and the draft's check after an unknown one. Each may take the provider's
whole timeout, and the send's outcome is recorded only after them: begun after the stop
signal, behind a send that itself took most of `daemon.stop_timeout`, they outlasted the
stop's bound, the daemon stopped without waiting, and the outcome was lost (recovered as
unknown at the next start: a search, or a person's review of a job known to be sent)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from ledger.vocabulary import JobState

LEGAL = policy("legal", on_unknown="review", pending_draft="review")


@contextmanager
def legal_rig(provider: Callable[[FakeClock], FakeProvider] | None = None) -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, provider=provider)
    try:
        yield rig
    finally:
        rig.close()


def calls_of(provider: FakeProvider, method: str) -> list[Any]:
    """The first argument of each call of the provider's `method` from now on."""
    seen: list[Any] = []
    answer = getattr(provider, method)

    def counted(first: Any) -> Any:
        seen.append(first)
        return answer(first)

    setattr(provider, method, counted)
    return seen


def stopped_during_the_send(rig: EngineRig, fate: Callable[[threading.Event], Scripted]) -> None:
    """Job k1's send in flight (answering with `fate` once released), the stop asked
    meanwhile, then the send's answer."""
    release = threading.Event()
    rig.submit("legal", "k1")
    rig.provider.script(fate(release))
    rig.engine.hand_out()
    assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
    assert rig.provider.hanging == 1
    rig.engine.stop()  # SIGTERM, while the call is out
    release.set()
    assert rig.engine.settle(timeout=10)


def answer_lost(release: threading.Event) -> Scripted:
    """A send that made its copy and whose answer is lost (not a timeout: its draft is
    asked at once, in the worker), once released."""
    lost = Scripted.dropped_response()
    return Scripted(lost.outcome, stored=True, hangs_until=release)


def test_a_send_that_answers_after_the_stop_is_recorded_without_its_read_back() -> None:
    with legal_rig() as rig:
        reads = calls_of(rig.provider, "read_message_id")
        stopped_during_the_send(rig, Scripted.slow)
        assert reads == [], "a read-back was started after the stop"
        assert rig.events("k1") == ["Requested", "Attempted", "Confirmed"]


def test_a_draft_send_unknown_after_the_stop_leaves_its_check_to_the_next_run() -> None:
    with legal_rig(lambda clock: FakeDraftsProvider("fake", clock=clock)) as rig:
        checks = calls_of(rig.provider, "check_draft")
        stopped_during_the_send(rig, answer_lost)
        assert checks == [], "a draft check was started after the stop"
        assert rig.job("k1").state is JobState.UNKNOWN, rig.events("k1")
        rig.restart()
        rig.tick()  # the next run asks the draft: sent by that call
        assert len(checks) == 1 and rig.job("k1").state is JobState.CONFIRMED
        assert rig.copies("k1") == 1


def test_a_read_back_still_runs_while_the_daemon_is_not_stopping() -> None:
    with legal_rig() as rig:
        reads = calls_of(rig.provider, "read_message_id")
        rig.submit("legal", "k1")
        rig.tick()
        assert len(reads) == 1 and rig.job("k1").state is JobState.CONFIRMED
