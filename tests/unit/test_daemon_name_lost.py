"""The daemon checks its name before every tick (a PostgreSQL restart drops the lock that
holds it): lost to another process, it stops claiming and `run` ends as a name taken at
start-up does (IdentityTaken, exit 3); while the check cannot be made, no tick runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.unit.daemon_thread import serve_on_a_thread

from daemon.bootstrap import bootstrap
from daemon.config.settings import settings_from_dict
from daemon.doubles.fake_provider import FakeProvider
from daemon.runtime import Daemon, run_once
from daemon.webhooks.delivery_threads import start_webhooks
from daemon.webhooks.signing import new_secret
from ledger.application import Ledger
from ledger.stores.identity import IdentityTaken
from policies.loader import PolicySet


class FlakyName:
    """Held at start-up; then `failures` checks fail with `error`."""

    ends_only_with_holder = False  # a PostgreSQL session: it can end under the daemon

    def __init__(self, error: Exception, failures: int) -> None:
        self.error = error
        self.failures = failures
        self.checks = 0
        self.released = False

    def check(self) -> None:
        self.checks += 1
        if self.checks <= self.failures:
            raise self.error

    def session(self) -> None:
        return None

    def release(self) -> None:
        self.released = True


def _daemon(
    ledger: Ledger,
    lock: FlakyName,
    webhooks: dict[str, Any] | None = None,
    *,
    share_scopes: bool = True,
    **daemon: str,
) -> Daemon:
    settings = settings_from_dict(
        {
            "store": {"url": "memory://"},
            "daemon": {"tick": "20ms", "name": "n1", **daemon},
            "webhooks": webhooks or {},
        }
    )
    ledger.hold_identity = lambda name: lock  # type: ignore[method-assign]
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=PolicySet,
        providers={"fake": FakeProvider("fake", clock=ledger.clock)},
        share_scopes=share_scopes,
    )
    return Daemon(service, settings.daemon.tick)


def _webhook(tmp_path: Path) -> dict[str, str]:
    """A webhook whose endpoint nothing answers: its lease row is what the tests read."""
    secret = tmp_path / "hook-secret"
    secret.write_text(new_secret() + "\n")
    return {"url": "http://127.0.0.1:9/hook", "secret_file": str(secret)}


def test_a_lost_name_stops_the_daemon_with_identity_taken() -> None:
    lock = FlakyName(IdentityTaken("n1", "db"), failures=1_000)
    with Ledger("memory://") as ledger:
        daemon = _daemon(ledger, lock)
        runner, outcome = serve_on_a_thread(daemon)
        runner.join(timeout=20)
        assert not runner.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], IdentityTaken)
        assert daemon.health.ticks == 0  # no tick ran without the name
        assert lock.released
        # The scope leases under the name are the other process's: none released.
        owners = daemon.engine.owners
        assert owners is not None and owners.disowned and owners.owned() == []


def test_a_check_that_cannot_be_made_skips_the_tick() -> None:
    lock = FlakyName(OSError("database unreachable"), failures=3)
    with Ledger("memory://") as ledger:
        daemon = _daemon(ledger, lock)
        runner = threading.Thread(target=daemon.serve)
        runner.start()
        try:
            for _ in range(500):
                if daemon.health.ticks:
                    break
                threading.Event().wait(0.01)
            # The three failed checks ran no tick; the fourth check let one run.
            assert daemon.health.ticks >= 1
            assert lock.checks >= 4
            assert daemon.health.last_error == "OSError: database unreachable"
        finally:
            daemon.request_stop()
            runner.join(timeout=20)
        assert not runner.is_alive()


def test_a_name_taken_at_start_up_leaves_no_worker_running() -> None:
    """Refused at start-up (exit 3), the daemon stops the engine's workers that its
    bootstrap started, as its stop would: a caller in the same process (`try`, a test)
    is left no thread waiting for work."""

    def taken(name: str) -> FlakyName:
        raise IdentityTaken(name, "db")

    with Ledger("memory://") as ledger:
        daemon = _daemon(ledger, FlakyName(OSError(), failures=0))
        ledger.hold_identity = taken  # type: ignore[method-assign]
        workers = [t for t in threading.enumerate() if t.name.endswith("@n1")]
        assert workers  # the send workers, started by bootstrap
        with pytest.raises(IdentityTaken):
            daemon.serve()
        for worker in workers:
            worker.join(timeout=5)
        assert [t.name for t in workers if t.is_alive()] == []


def test_a_lost_name_leaves_the_webhook_lease_to_the_process_that_took_it(
    tmp_path: Path,
) -> None:
    """The other process holds the webhook's lease under the same name: the daemon that
    lost the name stops without giving it up. Given up (its lease ended at once), a third
    daemon would take the webhook and send beside that process's pass in flight."""
    webhook = _webhook(tmp_path)
    lock = FlakyName(IdentityTaken("n1", "db"), failures=1_000)
    with Ledger("memory://") as ledger:
        positions = ledger.positions()
        taken = positions.claim("ops", "n1", time.time(), 60.0)  # the other process's
        assert taken is not None
        daemon = _daemon(ledger, lock, webhooks={"ops": webhook})
        with pytest.raises(IdentityTaken):
            daemon.serve()
        (row,) = positions.read_all()
        assert (row.owner, row.lease_until) == ("n1", taken.lease_until)


def test_a_lost_name_found_by_the_scope_renewal_stops_a_daemon_whose_tick_is_held_up() -> None:
    """The name's scope leases are under the name, not the process: while its tick was
    held up (a slow store read, a stuck round), a daemon whose name another process took
    kept renewing them, and its workers calling for those scopes, past the new process's
    wait for its calls, until that tick's own name check. The renewal asks the name
    first: lost, it renews nothing, the scopes are dropped and the daemon stops."""
    lock = FlakyName(IdentityTaken("n1", "db"), failures=0)
    held_up, go_on = threading.Event(), threading.Event()
    with Ledger("memory://") as ledger:
        daemon = _daemon(ledger, lock, scope_lease="0.3s", deadline_grace="0.1s")
        hand_out = daemon.engine.hand_out

        def slow_round() -> Any:
            held_up.set()
            go_on.wait(timeout=20)
            return hand_out()

        daemon.engine.hand_out = slow_round  # type: ignore[method-assign]
        runner, outcome = serve_on_a_thread(daemon)
        try:
            assert held_up.wait(timeout=20)
            lock.failures, lock.checks = 1_000, 0  # another process took the name
            owners = daemon.engine.owners
            assert owners is not None
            deadline = time.monotonic() + 10
            while not owners.disowned and time.monotonic() < deadline:
                time.sleep(0.01)
            assert owners.disowned and owners.owned() == []
        finally:
            go_on.set()
        runner.join(timeout=20)
        assert len(outcome) == 1 and isinstance(outcome[0], IdentityTaken)


def test_a_lost_name_found_by_the_scope_renewal_stops_a_one_shot_run_held_up() -> None:
    """`run --once` holds the name and renews its scope leases on a thread as the daemon
    does, but its one tick never asks the name: a run held up in it (slow calls) kept
    renewing them after another process took the name, then delivered its webhooks under
    it. Its renewal asks the name too, and the run ends as the daemon's does (exit 3)."""
    lock = FlakyName(IdentityTaken("n1", "db"), failures=0)
    held_up, go_on = threading.Event(), threading.Event()
    with Ledger("memory://") as ledger:
        daemon = _daemon(ledger, lock, scope_lease="0.3s", deadline_grace="0.1s")
        engine = daemon.engine
        tick = engine.tick

        def slow_tick() -> Any:
            held_up.set()
            go_on.wait(timeout=20)
            return tick()

        engine.tick = slow_tick  # type: ignore[method-assign]
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                run_once(daemon.service)
            except BaseException as exc:
                outcome.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            assert held_up.wait(timeout=20)
            assert engine.owners is not None
            engine.owners.renew_due()  # joined, as the tick's round would have
            lock.failures, lock.checks = 1_000, 0  # another process took the name
            deadline = time.monotonic() + 10
            while not engine.owners.disowned and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.owners.disowned and engine.owners.owned() == []
            assert engine._stopping.is_set()  # no new call either
        finally:
            go_on.set()
        runner.join(timeout=20)
        assert not runner.is_alive()
        # Exit 3 as the daemon's, before its webhooks' delivery writes under the name.
        assert len(outcome) == 1 and isinstance(outcome[0], IdentityTaken)


def test_a_name_the_renewer_finds_lost_before_the_webhooks_start_leaves_their_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scope renewer starts before the webhooks' threads: a name it finds taken in
    between was never told to them, and the daemon's stop gave up the webhook's lease
    the other process holds under the same name."""
    webhook = _webhook(tmp_path)
    lock = FlakyName(IdentityTaken("n1", "db"), failures=0)
    with Ledger("memory://") as ledger:
        positions = ledger.positions()
        daemon = _daemon(
            ledger, lock, webhooks={"ops": webhook}, scope_lease="0.3s", deadline_grace="0.1s"
        )
        held: list[Any] = []

        def late_start(*args: Any, **kwargs: Any) -> Any:
            lock.failures, lock.checks = 1_000, 0  # another process took the name
            taken = positions.claim("ops", "n1", time.time(), 60.0)  # and the webhook
            assert taken is not None
            held.append(taken)
            owners = daemon.engine.owners
            assert owners is not None
            deadline = time.monotonic() + 10
            while not owners.disowned and time.monotonic() < deadline:
                time.sleep(0.01)
            assert owners.disowned
            return start_webhooks(*args, **kwargs)

        monkeypatch.setattr("daemon.runtime.start_webhooks", late_start)
        with pytest.raises(IdentityTaken):
            daemon.serve()
        (row,) = positions.read_all()
        assert (row.owner, row.lease_until) == ("n1", held[0].lease_until)


@pytest.mark.parametrize("scopes", ["shared, none owned", "not shared"])
def test_a_one_shot_run_whose_name_is_taken_during_its_tick_exits_3(
    tmp_path: Path, scopes: str
) -> None:
    """`run --once` asked its name only at its scope renewals, every third of
    `scope_lease`: a tick shorter than that (or an engine that shares no scopes) never
    asked it after start-up, so a name taken during the tick went unnoticed, and the run
    delivered its webhooks under it (the other process's lease rows) and exited 0. The
    run asks the name once its tick has ended: taken, it delivers nothing, exit 3."""
    lock = FlakyName(IdentityTaken("n1", "db"), failures=0)
    with Ledger("memory://") as ledger:
        service = _daemon(
            ledger, lock, webhooks={"ops": _webhook(tmp_path)},
            share_scopes=scopes != "not shared", scope_lease="600s", deadline_grace="1s",
        ).service  # fmt: skip
        tick = service.engine.tick

        def taken_during_tick() -> Any:
            report = tick()
            lock.failures, lock.checks = 1_000, 0  # another process took the name
            return report

        service.engine.tick = taken_during_tick  # type: ignore[method-assign]
        with pytest.raises(IdentityTaken):
            run_once(service)
        assert ledger.positions().read_all() == []  # no delivery claimed the webhook
        assert lock.released
