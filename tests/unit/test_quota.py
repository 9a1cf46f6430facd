"""TokenBucket with an injected clock: no real sleeping."""

from __future__ import annotations

import threading

import pytest

from daemon.doubles.fake_time import FakeTime
from daemon.providers.quota import TokenBucket


def bucket(rate: float = 250.0, capacity: float | None = None) -> tuple[TokenBucket, FakeTime]:
    t = FakeTime()
    return TokenBucket(rate, capacity, clock=t, sleep=t.sleep), t


def test_starts_full_and_does_not_sleep_within_capacity() -> None:
    b, t = bucket()
    b.acquire(100)
    b.acquire(100)
    b.acquire(50)
    assert t.sleeps == []
    assert b.available == pytest.approx(0)


def test_sleeps_exactly_until_the_units_accrue() -> None:
    b, t = bucket()
    for _ in range(2):
        b.acquire(100)
    b.acquire(100)  # 50 left, 50 more needed at 250/s
    assert t.sleeps == [pytest.approx(0.2)]


def test_sustained_rate_never_exceeds_the_quota() -> None:
    b, t = bucket(rate=250.0)
    start = t.now
    spent = 0.0
    for units in [100, 5, 5, 100, 5, 100, 100, 5, 5, 5, 100] * 20:
        b.acquire(units)
        spent += units
        # Whatever the mix, units spent <= capacity + rate * elapsed.
        assert spent <= 250.0 + 250.0 * (t.now - start) + 1e-6


def test_refill_is_capped_at_capacity() -> None:
    b, t = bucket(rate=10.0, capacity=20.0)
    b.acquire(20)
    t.now += 3600
    assert b.available == pytest.approx(20.0)
    assert b.try_acquire(20)
    assert not b.try_acquire(1)


def test_try_acquire_never_sleeps_and_takes_nothing_on_failure() -> None:
    b, t = bucket(rate=100.0)
    assert b.try_acquire(60)
    assert not b.try_acquire(60)
    assert b.available == pytest.approx(40)
    t.now += 0.2
    assert b.try_acquire(60)
    assert t.sleeps == []


def test_capacity_defaults_to_one_second_of_rate() -> None:
    b, _ = bucket(rate=42.0)
    assert b.capacity == 42.0


def test_float_rounding_does_not_spin() -> None:
    # Sleeping the computed wait must be enough even when the sum rounds a hair short.
    b, t = bucket(rate=3.0, capacity=100.0)
    b.acquire(100)
    for _ in range(50):
        b.acquire(0.1)
    assert len(t.sleeps) == 50


def test_clock_going_backwards_earns_nothing() -> None:
    b, t = bucket(rate=10.0)
    b.acquire(10)
    t.now -= 50
    assert b.available == pytest.approx(0)
    t.now += 50.5
    assert b.available == pytest.approx(5)


@pytest.mark.parametrize(("rate", "capacity"), [(0, None), (-1, None), (10, 0), (10, -5)])
def test_rejects_bad_parameters(rate: float, capacity: float | None) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, capacity)


def test_rejects_impossible_requests() -> None:
    b, _ = bucket(rate=10.0)
    with pytest.raises(ValueError, match="capacity"):
        b.acquire(11)
    with pytest.raises(ValueError):
        b.try_acquire(-1)


def test_threads_share_the_budget() -> None:
    b, t = bucket(rate=100.0)
    start = t.now
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(10):
            b.acquire(10)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    # 800 units at 100/s with 100 saved up: at least 7 s of (fake) time must have passed.
    assert t.now - start >= 7.0 - 1e-6
    assert b.available <= 100.0


def test_history_reads_leave_a_sends_worth_in_the_bucket() -> None:
    """docs/providers.md "What each handle proves": a history read is paid only while a
    send's worth of quota stays behind it, so it never takes what a due send reserves."""
    from daemon.providers.gmail_history import pay_behind_sends

    b, t = bucket(rate=250.0)
    b.acquire(146)  # 104 left: a read of 5 would leave less than a send (100)
    pay_behind_sends(b, 5.0, t.sleep)
    assert t.sleeps and sum(t.sleeps) == pytest.approx(1 / 250)  # until 105 were there
    assert b.available == pytest.approx(100.0)
    assert b.try_acquire(100)  # the send that was due still finds its quota
    small, s = bucket(rate=100.0)  # too small a bucket to keep a send back: paid at once
    pay_behind_sends(small, 5.0, s.sleep)
    assert s.sleeps == [] and small.available == pytest.approx(95.0)
