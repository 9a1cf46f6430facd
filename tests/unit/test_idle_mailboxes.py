"""Cost flat in the number of mailboxes (docs/performance.md "Many mailboxes, one daemon"):
a provider acting as each job's From mailbox keeps an entry per mailbox only while it is
used, drops it once a fresh one would equal it (never a bucket in debt or a call in
flight), keeps a dropped mailbox's live token until it expires, and a tick, a /metrics
render and a /healthz check cost the same whether 10 or hundreds of mailboxes sent once
and went idle. Work is counted (calls, entries looked at), on injected time."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_mailboxes import delegated

import daemon
from daemon.api.health import HealthSources, check_health
from daemon.api.metrics import Metrics, Sources
from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeTime
from daemon.engine import Engine
from daemon.providers.base import Provider, ProviderBase, SearchResult, SendOutcome
from daemon.providers.mailboxes import IDLE_AFTER, Mailboxes
from daemon.providers.quota import GMAIL_SEND_UNITS, TokenBucket
from ledger.content import parse_job

DAEMON_CODE = str(Path(daemon.__file__).parent)


def calls_in_daemon(action: Callable[[], object]) -> int:
    """Python calls into the daemon package's code while `action` runs on this thread
    (the store's own work, which the memory store does by scanning, is not counted)."""
    count = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_filename.startswith(DAEMON_CODE):
            count += 1

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return count


# -- the registry ------------------------------------------------------------------------


class Box:
    """An entry with a quota bucket, as Gmail's mailbox has: idle once the bucket is full."""

    def __init__(self, time: FakeTime) -> None:
        self.bucket = TokenBucket(250.0, 150.0, clock=time, sleep=time.sleep)

    def idle_at(self, now: float) -> float | None:
        wait = self.bucket.until_full()
        return None if wait <= 0.0 else now + wait


def test_a_tick_looks_only_at_the_mailboxes_whose_time_has_come() -> None:
    time = FakeTime(0.0)
    made: list[str] = []

    def box(address: str) -> Box:
        made.append(address)
        return Box(time)

    boxes = Mailboxes(box, clock=time)
    for n in range(1000):
        boxes.get(f"m{n}@example.com")
    assert boxes.get("Shop <M1@EXAMPLE.com>") is boxes.get("m1@example.com")
    assert len(made) == len(boxes) == 1000  # one entry per mailbox, made on first use
    for _ in range(50):  # 50 ticks within the idle time: nothing looked at
        time.now += 1.0
        assert boxes.forget_idle() == 0
    assert boxes.looked == 0
    time.now = IDLE_AFTER
    assert boxes.forget_idle() == 1000
    assert boxes.looked == 1000 and len(boxes) == 0  # each looked at once, and dropped
    for _ in range(50):
        time.now += 1.0
        boxes.forget_idle()
    assert boxes.looked == 1000  # nothing is left to look at
    boxes.get("m1@example.com")
    assert made[-1] == "m1@example.com" and len(boxes) == 1  # made again on its next use


def test_a_mailbox_in_use_or_in_debt_is_kept_and_looked_at_again_when_it_says() -> None:
    time = FakeTime(0.0)
    boxes: Mailboxes[Box] = Mailboxes(lambda _address: Box(time), clock=time)
    used, debt = boxes.get("used@example.com"), boxes.get("debt@example.com")
    time.now = IDLE_AFTER - 1.0
    assert boxes.get("used@example.com") is used  # used again: its idle time starts over
    time.now = IDLE_AFTER
    debt.bucket.acquire(150.0)  # emptied: 0.6 s until a fresh bucket would equal it
    assert boxes.forget_idle() == 0  # both kept: one used a second ago, one in debt
    assert boxes.entries() == [used, debt] and boxes.looked == 2
    time.now += 0.3
    assert boxes.forget_idle() == 0
    assert boxes.looked == 2  # the one in debt is not looked at every tick...
    time.now += 0.3
    assert boxes.forget_idle() == 1  # ...but when it said it would be full again
    assert boxes.entries() == [used] and boxes.looked == 3
    time.now = 2 * IDLE_AFTER - 1.0
    assert boxes.forget_idle() == 1  # a minute after its last use
    assert len(boxes) == 0


# -- the Gmail provider ------------------------------------------------------------------


def test_gmail_keeps_a_bucket_in_debt_and_a_call_in_flight(tmp_path: Path) -> None:
    time = FakeTime(0.0)
    # 1 unit a second: an emptied bucket takes 100 s to be full again.
    provider = delegated(tmp_path, time, quota_units_per_second=1.0)
    slow, busy = provider.mailbox("slow@example.com"), provider.mailbox("busy@example.com")
    provider.mailbox("idle@example.com")
    assert slow.reserve_send() == 0.0
    time.now = IDLE_AFTER  # slow got 60 of its 100 units back: still in debt
    with busy.calling():  # a call in flight (its token in use)
        assert provider.forget_idle() == 1  # only the idle one
    assert provider.mailboxes.entries() == [slow, busy]
    time.now = GMAIL_SEND_UNITS - 1.0
    assert provider.forget_idle() == 1  # busy, its call over; slow one unit short
    assert provider.mailboxes.entries() == [slow]
    time.now = GMAIL_SEND_UNITS
    assert provider.forget_idle() == 1  # full again: equal to a fresh one
    assert len(provider.mailboxes) == 0
    provider.close()


def test_a_dropped_mailboxs_live_token_serves_it_again_until_it_expires(
    tmp_path: Path,
) -> None:
    time = FakeTime(0.0)
    provider = delegated(tmp_path, time)
    alice = provider.mailbox("alice@example.com")
    expiry = datetime.now(UTC).replace(tzinfo=None) + timedelta(hours=1)
    alice.credentials.token, alice.credentials.expiry = "tok-alice", expiry
    provider.mailbox("bob@example.com")  # never fetched a token
    time.now = IDLE_AFTER
    assert provider.forget_idle() == 2
    assert provider.kept_tokens() == 1
    again = provider.mailbox("Alice <ALICE@example.com>")
    assert again is not alice and again.credentials.token == "tok-alice"
    assert again.credentials.valid  # no second token fetch for alice within the hour
    assert provider.kept_tokens() == 0
    time.now += IDLE_AFTER
    assert provider.forget_idle() == 1
    assert provider.kept_tokens() == 1
    time.now += 3600.0  # past the expiry: forgotten, a fresh token will be fetched
    provider.forget_idle()
    assert provider.kept_tokens() == 0
    assert provider.mailbox("alice@example.com").credentials.token is None
    provider.close()


def test_a_view_that_outlived_its_mailboxs_drop_spends_the_new_bucket(tmp_path: Path) -> None:
    time = FakeTime(0.0)
    provider = delegated(tmp_path, time, quota_units_per_second=250.0)
    queued = provider.for_job("alice@example.com", None)  # a job held behind a circuit
    assert queued.scope() == "gmail/alice@example.com"  # queued by its scope
    time.now = IDLE_AFTER
    assert provider.forget_idle() == 1
    fresh = provider.for_job("alice@example.com", None)  # a job loaded after the drop
    assert fresh.reserve_send() == 0.0
    # One bucket for the mailbox: 150 units, so the queued job's send must wait.
    assert queued.reserve_send() > 0.0
    provider.close()


def gmail_idle_cost(folder: Path, mailboxes: int) -> int:
    """Calls of a tick's `forget_idle` and a scrape's `quota_available` once `mailboxes`
    that each sent once were dropped."""
    folder.mkdir()
    time = FakeTime(0.0)
    provider = delegated(folder, time)
    for n in range(mailboxes):
        mailbox = provider.mailbox(f"m{n}@example.com")
        assert mailbox.reserve_send() == 0.0
        mailbox.pay_send()
    time.now = IDLE_AFTER
    assert provider.forget_idle() == mailboxes
    cost = calls_in_daemon(lambda: [(provider.forget_idle(), provider.quota_available())])
    provider.close()
    return cost


def test_gmail_drops_idle_mailboxes_and_then_costs_nothing_per_mailbox(tmp_path: Path) -> None:
    assert gmail_idle_cost(tmp_path / "big", 400) == gmail_idle_cost(tmp_path / "small", 10)


# -- the engine, its metrics and its health check ------------------------------------------


class BoxedFake(ProviderBase):
    """The fake provider acting as each job's From mailbox, its per-mailbox state kept as
    Gmail's is (a bucket per mailbox in `Mailboxes`, the gauge the lowest bucket)."""

    def __init__(self, inner: FakeProvider, time: FakeTime) -> None:
        self.inner = inner
        self.name = inner.name
        self.response_ids_readable = inner.response_ids_readable
        self.mailboxes: Mailboxes[Box] = Mailboxes(lambda _address: Box(time), clock=time)

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        self.mailboxes.get(from_addr)
        return BoxView(self, from_addr)

    def forget_idle(self) -> int:
        return self.mailboxes.forget_idle()

    def quota_available(self) -> float | None:
        return min((box.bucket.available for box in self.mailboxes.entries()), default=150.0)

    def send_raw(self, raw: bytes) -> SendOutcome:
        raise AssertionError("every job's send goes through its mailbox")

    def search(self, message_id: str) -> SearchResult:
        raise AssertionError("every job's search goes through its mailbox")

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.inner.read_message_id(provider_message_id)

    def close(self) -> None:
        self.inner.close()


class BoxView(ProviderBase):
    def __init__(self, owner: BoxedFake, from_addr: str) -> None:
        self.owner, self.from_addr = owner, from_addr
        self.name = owner.name
        self.response_ids_readable = owner.response_ids_readable

    def scope(self) -> str:
        return f"{self.name}/{self.from_addr}"

    def reserve_send(self) -> float:
        bucket = self.owner.mailboxes.get(self.from_addr).bucket
        return 0.0 if bucket.try_acquire(GMAIL_SEND_UNITS) else bucket.wait_for(100.0)

    def send_raw(self, raw: bytes) -> SendOutcome:
        return self.owner.inner.send_raw(raw)

    def search(self, message_id: str) -> SearchResult:
        return self.owner.inner.search(message_id)

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.owner.inner.read_message_id(provider_message_id)

    def close(self) -> None:
        pass


def idle_costs(mailboxes: int) -> tuple[int, int, int]:
    """One job per mailbox, all confirmed; then (calls of three idle ticks while the
    mailboxes are kept, entries left after the idle time, calls of three idle ticks,
    /metrics renders and /healthz checks once they are dropped)."""
    rig = EngineRig(policy("receipts", allowed_from=["*@example.com"]))
    time = FakeTime(0.0)
    boxed = BoxedFake(rig.provider, time)
    metrics = Metrics(Sources(rig.ledger, {"fake": boxed}))
    engine = Engine(
        rig.ledger,
        rig.holder,
        {"fake": boxed},
        provider_timeouts={"fake": 10.0},
        clock=rig.clock,
        elapsed=rig.clock.elapsed,
        concurrency=2,
        observer=metrics,
    )
    metrics.sources.circuits = engine.open_circuits
    health = HealthSources(
        rig.ledger, lambda: rig.policies, lambda: None, ["fake"], circuits=engine.open_circuits
    )
    try:
        sender = rig.policies["receipts"]
        for n in range(mailboxes):
            content = parse_job(
                {
                    "channel": "receipts",
                    "key": f"k{n}",
                    "to": "c@example.net",
                    "subject": "s",
                    "body": "b",
                    "from": f"Shop <m{n}@example.com>",
                }
            )
            rig.ledger.submit(content, sender.sender_for(content.sender))
        assert engine.tick().confirmed == mailboxes
        assert len(boxed.mailboxes) == mailboxes
        time.now, _ = IDLE_AFTER / 2, rig.clock.advance(IDLE_AFTER / 2)
        kept = calls_in_daemon(lambda: [engine.hand_out() for _ in range(3)])
        assert len(boxed.mailboxes) == mailboxes  # idle, but not for long enough yet
        time.now, _ = IDLE_AFTER, rig.clock.advance(IDLE_AFTER / 2)
        engine.hand_out()
        left = len(boxed.mailboxes)
        dropped = calls_in_daemon(
            lambda: [(engine.hand_out(), metrics.render(), check_health(health)) for _ in range(3)]
        )
        return kept, left, dropped
    finally:
        engine.close()
        rig.close()


def test_idle_ticks_scrapes_and_health_checks_cost_the_same_for_10_and_300_mailboxes() -> None:
    small, big = idle_costs(10), idle_costs(300)
    assert small[1] == big[1] == 0  # every idle mailbox dropped by the tick
    assert big[0] == small[0], (small, big)  # kept: no tick looks at them
    assert big[2] == small[2], (small, big)  # dropped: nothing left to look at
