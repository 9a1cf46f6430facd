"""Two doors, one job, the same moment, on the real stores (docs/review.md "Two people,
one job"): each actor has a Ledger of its own, as a second process has (the CLI beside
`sendledger api`, a person beside the daemon), and both saves are held at a barrier so
they reach SQLite or PostgreSQL together, after both read the same version. Exactly one
is stored; the other is refused naming what the winner wrote, and nothing of it lands
(tests/unit/test_human_races.py drives the same races in memory)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from tests.integration.test_handle_guard_stores import to_review
from tests.integration.test_ledger_store import SENDER, content

from daemon.doubles.fake_time import FakeClock
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob
from ledger.vocabulary import Resolution
from policies.loader import PolicySet


def together(ledgers: list[Ledger], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ledger's next save waits at one barrier for the others' before it writes."""
    barrier = threading.Barrier(len(ledgers), timeout=10)
    for ledger in ledgers:
        save = ledger.save_job

        def held(job: SendJob, *args: Any, _save: Any = save, **kwargs: Any) -> None:
            barrier.wait()
            _save(job, *args, **kwargs)

        monkeypatch.setattr(ledger, "save_job", held)


def race(actions: dict[str, Callable[[], object]]) -> dict[str, BaseException | None]:
    """Each action on its own thread at once; what each raised (None: it won)."""
    outcome: dict[str, BaseException | None] = {}

    def run(name: str, action: Callable[[], object]) -> None:
        try:
            action()
            outcome[name] = None
        except BaseException as exc:  # reported below, whatever it was
            outcome[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in actions.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return outcome


def door(ledger: Ledger) -> Services:
    return Services(ledger, lambda: ChannelPolicies(PolicySet()))


def types(ledger: Ledger, key: str) -> list[str]:
    return [type(event).__name__ for event in ledger.history(key)]


def test_two_people_deciding_at_the_same_moment_from_two_processes_one_wins(
    store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(store_url, clock=clock) as cli, Ledger(store_url, clock=clock) as api:
        cli.submit(content("k1"), SENDER)
        cli.save_job(to_review(cli, "k1", clock))
        seen = cli.get_job("k1").version
        together([cli, api], monkeypatch)
        outcome = race({
            "alice": lambda: door(cli).resolve("k1", Resolution.ABANDON, note="", by="alice"),
            "bob": lambda: door(api).resolve("k1", Resolution.SENT, note="in Sent", by="bob",
                                             expected_version=seen),
        })  # fmt: skip
        [winner] = [name for name, raised in outcome.items() if raised is None]
        [loser] = [raised for raised in outcome.values() if raised is not None]
        assert isinstance(loser, ServiceError) and loser.kind is Refusal.CONFLICT, loser
        decision = {"alice": "abandon", "bob": "sent"}[winner]
        assert f"resolved as {decision} by {winner}" in loser.message
        assert f"changed after version {seen}" in loser.message
        assert types(api, "k1").count("Resolved") == 1
        assert (
            api.get_job("k1").state.value == {"abandon": "abandoned", "sent": "confirmed"}[decision]
        )


def test_a_cancel_and_a_daemon_s_claim_at_the_same_moment_one_wins(
    store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever is stored, the other stores nothing: a claim that lost makes no call
    (ConcurrentUpdate), a cancel that lost is refused naming the attempt."""
    with Ledger(store_url, clock=clock) as daemon, Ledger(store_url, clock=clock) as cli:
        daemon.submit(content("k1"), SENDER)
        seen = cli.get_job("k1").version
        together([daemon, cli], monkeypatch)

        def claim() -> None:
            job = daemon.get_job("k1")
            job.claim(provider="fake", deadline=clock() + timedelta(seconds=30), at=clock(),
                      daemon="host-a")  # fmt: skip
            daemon.save_job(job)

        outcome = race({
            "claim": claim,
            "cancel": lambda: door(cli).cancel("k1", note="", by="alice"),
        })  # fmt: skip
        stored = types(cli, "k1")[seen:]
        if outcome["claim"] is None:
            refused = outcome["cancel"]
            assert isinstance(refused, ServiceError) and refused.kind is Refusal.CONFLICT
            assert "attempt 1 by host-a" in refused.message
            assert stored == ["Attempted"]
        else:
            assert isinstance(outcome["claim"], ConcurrentUpdate), outcome
            assert outcome["cancel"] is None
            assert stored == ["Cancelled"]
