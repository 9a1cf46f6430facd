"""FaultPlan and request classification: pure, no sockets."""

from __future__ import annotations

import threading

import pytest

from testkit.relay import MODES, Delays, FaultPlan, Mode, classify


@pytest.mark.parametrize(
    ("method", "target", "kind"),
    [
        ("POST", "/gmail/v1/users/me/messages/send", "send"),
        ("POST", "/upload/gmail/v1/users/a%40b.c/messages/send?uploadType=multipart", "send"),
        ("GET", "/gmail/v1/users/me/messages?q=rfc822msgid%3Ax", "search"),
        ("GET", "/gmail/v1/users/me/messages/0123456789abcdef?format=metadata", "search"),
        ("POST", "/token", "token"),
        ("GET", "/gmail/v1/users/me/profile", "other"),
        ("GET", "/gmail/v1/users/me/messages/send", "other"),
        ("POST", "/gmail/v1/users/me/messages/import", "other"),
    ],
)
def test_classify(method: str, target: str, kind: str) -> None:
    assert classify(method, target) == kind


def test_single_mode_is_permanent_and_sequences_are_consumed() -> None:
    plan = FaultPlan(send=["drop-response", "503"], search="hang", default="429")
    assert [plan.next_mode("send") for _ in range(4)] == ["drop-response", "503", "429", "429"]
    assert [plan.next_mode("search") for _ in range(3)] == ["hang"] * 3
    assert plan.next_mode("token") == "pass"
    assert plan.next_mode("other") == "pass"


def test_empty_sequence_means_default() -> None:
    assert FaultPlan(send=[], default="503").next_mode("send") == "503"


def test_unknown_modes_and_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault mode"):
        FaultPlan(send="explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown request kind"):
        FaultPlan().next_mode("upload")
    with pytest.raises(ValueError):
        FaultPlan.random(1, {"pass": 0})
    with pytest.raises(ValueError):
        FaultPlan.random(1, {"pass": -1, "503": 1})


def test_random_plan_is_reproducible_per_kind() -> None:
    weights: dict[Mode, float] = {"pass": 5.0, "drop-response": 1.0, "fail-before-forward": 1.0}
    search: dict[Mode, float] = {"pass": 1.0, "503": 1.0}
    first = FaultPlan.random(42, weights, search)
    second = FaultPlan.random(42, weights, search)
    # Interleaving searches differently must not change the send sequence.
    sends_first = [first.next_mode("send") for _ in range(50)]
    sends_second = []
    for _ in range(50):
        second.next_mode("search")
        sends_second.append(second.next_mode("send"))
    assert sends_first == sends_second
    assert set(sends_first) <= set(weights)
    assert len(set(sends_first)) > 1
    assert FaultPlan.random(43, weights).next_mode("token") == "pass"
    assert all(mode in MODES for mode in sends_first)


def test_next_mode_is_thread_safe() -> None:
    plan = FaultPlan(send=["503"] * 1000, default="pass")
    seen: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(250):
            mode = plan.next_mode("send")
            with lock:
                seen.append(mode)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen.count("503") == 1000
    assert seen.count("pass") == 1000


def test_slow_delays_are_the_base_plus_a_seeded_random_part() -> None:
    assert [Delays(0.5).next() for _ in range(3)] == [0.5, 0.5, 0.5]
    first = Delays(0.5, 0.25, seed=7)
    again = Delays(0.5, 0.25, seed=7)
    draws = [first.next() for _ in range(20)]
    assert draws == [again.next() for _ in range(20)]  # a failing run draws the same again
    assert all(0.5 <= delay <= 0.75 for delay in draws) and len(set(draws)) > 1
    assert draws != [Delays(0.5, 0.25, seed=8).next() for _ in range(20)]
    with pytest.raises(ValueError, match="0 or more seconds"):
        Delays(-1.0)
    with pytest.raises(ValueError, match="0 or more seconds"):
        Delays(1.0, -0.1)


def test_the_relay_counts_graph_sends_and_searches() -> None:
    assert classify("POST", "/v1.0/users/u/messages/AAM=/send") == "send"
    assert classify("POST", "/v1.0/users/u/sendMail") == "send"
    assert classify("GET", "/v1.0/users/u/messages?$filter=x") == "search"
    assert classify("GET", "/v1.0/users/u/mailFolders/sentitems/messages/AAM=") == "search"
    assert classify("POST", "/v1.0/users/u/messages") == "other"  # the draft's creation
