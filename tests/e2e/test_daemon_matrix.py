"""The seed's crash-boundary matrix, end to end: the daemon as a process, the real Gmail
client stack, the fault relay in front of the bundled Gmail emulator.

Effects are counted in the emulator's acceptance log only. These are EMULATOR results: they
show the daemon's logic against a faithful stand-in, not that Gmail behaves the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from tests.e2e.daemon_kit import (
    RETRY_POLICY,
    RefusingGmailEmulator,
    Rig,
    events_of,
    job,
)

from testkit.relay import FaultPlan, Mode

# One job per fault; the daemon dispatches them in submission order (concurrency 1), so the
# relay's send queue gives each job's FIRST send its fault. Every later send passes.
MATRIX: list[tuple[str, Mode]] = [
    ("m-pass", "pass"),
    ("m-drop", "drop-response"),
    ("m-fail", "fail-before-forward"),
    ("m-500", "500-after-forward"),
    ("m-429", "429"),
    ("m-400", "pass"),  # the emulator refuses its recipient with 400
]
REFUSED = "refused@bounce.example"
# One worker runs the module: under `--dist loadgroup` its tests were spread over both, and
# each worker ran the module's matrix (a daemon over six jobs, 2.85 s) for its share.
pytestmark = pytest.mark.xdist_group("daemon_matrix")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    folder = tmp_path_factory.mktemp("matrix")
    emulator = RefusingGmailEmulator(
        lag=0.3, acceptance_log=folder / "acceptance.jsonl", refuse_to=[REFUSED]
    )
    with Rig(
        folder,
        emulator=emulator,
        plan=FaultPlan(send=[mode for _, mode in MATRIX]),
        concurrency=1,
    ) as rig:
        jobs = [
            job(key, to=REFUSED if key == "m-400" else f"{key}@example.com") for key, _ in MATRIX
        ]
        created = rig.submit(jobs)
        assert [c["state"] for c in created] == ["requested"] * len(MATRIX)
        daemon = rig.start_daemon()
        rig.wait_settled([key for key, _ in MATRIX])
        # A little longer: a sweeper that wrongly touched a settled job would show up now.
        time.sleep(1.0)
        assert daemon.terminate() == 0, daemon.tail()
        yield rig


def _confirmations(history: list[dict[str, Any]]) -> list[str]:
    return [str(record["via"]) for record in events_of(history, "Confirmed")]


def test_fail_before_forward_is_searched_then_resent_once(matrix: Rig) -> None:
    """Gmail never got it: Unknown, `confirm_misses` empty searches, Requeued, a second
    attempt, confirmed by that response; the acceptance log has exactly one copy."""
    history = matrix.history("m-fail")
    types = [r["type"] for r in history]
    assert types == [
        "Requested",
        "Attempted",
        "Unknown",
        "SearchedMiss",
        "SearchedMiss",
        "Requeued",
        "Attempted",
        "Confirmed",
    ], types
    assert RETRY_POLICY["confirm_misses"] == 2
    assert [r["attempt"] for r in events_of(history, "Attempted")] == [1, 2]
    assert _confirmations(history) == ["response"]
    assert matrix.state("m-fail") == "confirmed"
    assert matrix.copies("m-fail") == 1


def test_searches_wait_for_search_after_and_interval(matrix: Rig) -> None:
    """Invariant 2 with real clocks: the first search no sooner than search_after (800ms)
    after the Unknown, the next at least search_interval (400ms) later."""
    history = matrix.history("m-fail")
    unknown = _at(events_of(history, "Unknown")[0])
    misses = [_at(r) for r in events_of(history, "SearchedMiss")]
    assert misses[0] - unknown >= 0.8
    assert misses[1] - misses[0] >= 0.4


def test_drop_response_is_found_by_search_never_resent(matrix: Rig) -> None:
    """Gmail accepted it and the reply was lost: the sweeper finds it by Message-ID and
    confirms it; one Attempted, one copy, no resend."""
    history = matrix.history("m-drop")
    types = [r["type"] for r in history]
    assert types == ["Requested", "Attempted", "Unknown", "Confirmed"], types
    assert _confirmations(history) == ["search"]
    assert matrix.copies("m-drop") == 1
    assert matrix.copies_in_log_file(matrix.message_id("m-drop")) == 1


def test_pass_is_confirmed_by_response_and_never_searched(matrix: Rig) -> None:
    """The happy path ends confirmed via the response; the sweeper never touches it: no
    SearchedMiss in its history and no rfc822msgid: search for it in the relay's log."""
    history = matrix.history("m-pass")
    types = [r["type"] for r in history]
    assert types == ["Requested", "Attempted", "Confirmed"], types
    assert _confirmations(history) == ["response"]
    assert not events_of(history, "SearchedMiss")
    assert matrix.searches_for("m-pass") == []
    # The probe works: the jobs that were searched for do show up in the relay's log.
    assert matrix.searches_for("m-drop")
    assert matrix.copies("m-pass") == 1


def test_500_after_forward_is_confirmed_by_search(matrix: Rig) -> None:
    """Gmail sent it, then answered 500: Unknown (not a refusal), found by search."""
    history = matrix.history("m-500")
    types = [r["type"] for r in history]
    assert types == ["Requested", "Attempted", "Unknown", "Confirmed"], types
    assert "500" in str(events_of(history, "Unknown")[0]["reason"])
    assert _confirmations(history) == ["search"]
    assert matrix.copies("m-500") == 1


def test_429_is_a_transient_rejection_then_sent(matrix: Rig) -> None:
    """429 means definitely not sent: Rejected (transient, with a retry time), sent again
    after the backoff, confirmed by the response; one copy."""
    history = matrix.history("m-429")
    types = [r["type"] for r in history]
    assert types == ["Requested", "Attempted", "Rejected", "Attempted", "Confirmed"], types
    rejected = events_of(history, "Rejected")[0]
    assert rejected["transient"] is True
    assert rejected["status"] == 429
    assert rejected["retry_at"] is not None
    assert _confirmations(history) == ["response"]
    assert matrix.copies("m-429") == 1


def test_permanent_400_goes_to_review_with_zero_copies(matrix: Rig) -> None:
    """A definite refusal (400) is never retried: Rejected (permanent), Escalated with
    reason "rejected"; nothing in the acceptance log."""
    history = matrix.history("m-400")
    types = [r["type"] for r in history]
    assert types == ["Requested", "Attempted", "Rejected", "Escalated"], types
    rejected = events_of(history, "Rejected")[0]
    assert rejected["transient"] is False
    assert rejected["status"] == 400
    assert events_of(history, "Escalated")[0]["reason"] == "rejected"
    assert matrix.state("m-400") == "review"
    assert matrix.copies("m-400") == 0
    assert isinstance(matrix.emulator, RefusingGmailEmulator)
    assert matrix.emulator.refused == [REFUSED]


def test_matrix_totals_in_the_acceptance_log(matrix: Rig) -> None:
    """Across the matrix: one copy per sent job, none for the refused one, no duplicates."""
    accepted = matrix.emulator.accepted()
    expected = {matrix.message_id(key) for key, _ in MATRIX if key != "m-400"}
    assert sorted(entry["message_id"] for entry in accepted) == sorted(expected)


def _at(record: dict[str, Any] | Any) -> float:
    return datetime.fromisoformat(str(record["at"]).replace("Z", "+00:00")).timestamp()


# -- index lag against the policy's windows ---------------------------------------------


def _lag_rig(folder: Any, *, lag: float, **windows: Any) -> Rig:
    return Rig(
        folder,
        lag=lag,
        plan=FaultPlan(send=["drop-response"]),
        policies={"receipts": {**RETRY_POLICY, **windows}},
    )


def test_lag_longer_than_the_first_search_still_one_copy(tmp_path: Any) -> None:
    """Index lag 1.2s, first search after 0.3s: the early searches miss, but three misses
    0.6s apart span 1.5s > lag, so the third search sees the copy. Dropped response ->
    confirmed via search, one Attempted, one copy."""
    with _lag_rig(
        tmp_path, lag=1.2, search_after="300ms", search_interval="600ms", confirm_misses=3
    ) as rig:
        rig.submit([job("lag-1")])
        daemon = rig.start_daemon()
        rig.wait_settled(["lag-1"])
        assert daemon.terminate() == 0, daemon.tail()
        history = rig.history("lag-1")
        types = [r["type"] for r in history]
        assert types.count("Attempted") == 1, types
        assert 1 <= types.count("SearchedMiss") <= 2, types  # the lag made the first miss
        assert types[-1] == "Confirmed" and _confirmations(history) == ["search"], types
        assert rig.copies("lag-1") == 1


def test_windows_shorter_than_the_lag_cause_a_duplicate_which_is_caught(tmp_path: Any) -> None:
    """DOCUMENTS the failure the policy windows exist to prevent, and the net under it.

    The index lags 2s, but the channel believes a miss after two searches 0.2s apart (0.4s
    in all) and its policy is `on_unknown = "retry"`. A dropped response (Gmail HAS the mail)
    is then searched too early, both searches miss, the daemon concludes "not sent" and
    resends the same Message-ID: the acceptance log shows TWO copies, and the resend's
    response confirms the job.

    Because the job was resent without proof, the daemon counts its copies once more
    `verify_after` (here 3s, longer than the lag) after the confirmation: the search now
    sees both copies, records Duplicate and Escalated(duplicate), and the job goes to
    review. The duplicate mail went out all the same.

    Hence: search_after + (confirm_misses - 1) * search_interval must exceed the provider's
    index lag, with a margin, on every channel that may resend; verify_after only tells.
    """
    with _lag_rig(
        tmp_path,
        lag=2.0,
        search_after="200ms",
        search_interval="200ms",
        confirm_misses=2,
        verify_after="3s",
    ) as rig:
        rig.submit([job("short-1")])
        daemon = rig.start_daemon()
        rig.wait_state("short-1", "review", timeout=60)
        assert daemon.terminate() == 0, daemon.tail()
        history = rig.history("short-1")
        types = [r["type"] for r in history]
        assert types == [
            "Requested",
            "Attempted",
            "Unknown",
            "SearchedMiss",
            "SearchedMiss",
            "Requeued",
            "Attempted",
            "Confirmed",
            "Duplicate",
            "Escalated",
        ], types
        assert _confirmations(history) == ["response"]
        confirmed = next(r for r in history if r["type"] == "Confirmed")
        duplicate = next(r for r in history if r["type"] == "Duplicate")
        assert confirmed["verify_at"] is not None
        assert duplicate["at"] >= confirmed["verify_at"]
        assert duplicate["hits"] == 2
        assert history[-1]["reason"] == "duplicate"
        # The effect that matters, counted where it happens: two copies, and no third.
        assert rig.copies("short-1") == 2
        check = rig.cli_json("review", "check", "short-1")
        assert len(check["hits"]) == 2, check


def test_a_resent_job_with_one_copy_is_verified_and_stays_confirmed(tmp_path: Any) -> None:
    """fail-before-forward: nothing reached the provider, the resend is the only copy.
    The verification after the resend counts one copy: Verified, still confirmed."""
    with Rig(
        tmp_path,
        lag=0.3,
        plan=FaultPlan(send=["fail-before-forward"]),
        policies={"receipts": {**RETRY_POLICY, "verify_after": "1s"}},
    ) as rig:
        rig.submit([job("verify-1")])
        daemon = rig.start_daemon()
        rig.wait_for(lambda: "Verified" in rig.types("verify-1"), "the verification", timeout=30)
        assert daemon.terminate() == 0, daemon.tail()
        history = rig.history("verify-1")
        types = [r["type"] for r in history]
        assert types[-2:] == ["Confirmed", "Verified"], types
        assert history[-1]["hits"] == 1
        assert rig.state("verify-1") == "confirmed"
        assert rig.copies("verify-1") == 1


# -- channels that never resend on their own ---------------------------------------------

REVIEW_POLICY: dict[str, Any] = {**RETRY_POLICY, "on_unknown": "review"}
IRREVERSIBLE_POLICY: dict[str, Any] = {
    **RETRY_POLICY,
    "from": "Payouts <payouts@shop.example>",
    "on_unknown": "search-then-review",
    "irreversible": True,
}
HUMAN_JOBS: list[tuple[str, str, Mode]] = [
    ("rv-drop", "manual", "drop-response"),
    ("rv-fail", "manual", "fail-before-forward"),
    ("irr-drop", "payouts", "drop-response"),
    ("irr-fail", "payouts", "fail-before-forward"),
]


def test_review_and_irreversible_channels_never_resend_on_their_own(tmp_path: Any) -> None:
    """`on_unknown = "review"` and an irreversible `search-then-review` channel: an
    ambiguous send is never sent again without a human.

    - review channel: dropped response and never-forwarded both go straight to review
      (reason unknown-outcome) with one Attempted; the acceptance log has 1 and 0 copies.
    - irreversible channel: the dropped response is found by search and confirmed (one
      copy, nothing resent); the never-forwarded one misses and goes to review.
    Then a human decides: `--as resend` makes the daemon send exactly once more (confirmed,
    one copy); `--as sent` confirms via operator without any call.
    """
    policies = {"manual": REVIEW_POLICY, "payouts": IRREVERSIBLE_POLICY}
    plan = FaultPlan(send=[mode for _, _, mode in HUMAN_JOBS])
    with Rig(tmp_path, plan=plan, policies=policies, concurrency=1) as rig:
        rig.submit([job(key, channel=channel) for key, channel, _ in HUMAN_JOBS])
        daemon = rig.start_daemon()
        keys = [key for key, _, _ in HUMAN_JOBS]
        rig.wait_settled(keys)
        # Past every search window: nothing more may happen on its own.
        time.sleep(1.5)
        states = {key: rig.state(key) for key in keys}
        assert states == {
            "rv-drop": "review",
            "rv-fail": "review",
            "irr-drop": "confirmed",
            "irr-fail": "review",
        }, states
        for key in keys:
            assert rig.types(key).count("Attempted") == 1, (key, rig.types(key))
        assert len(rig.sends()) == len(HUMAN_JOBS)  # no send beyond the first of each
        assert rig.copies("rv-drop") == 1
        assert rig.copies("rv-fail") == 0
        assert rig.copies("irr-drop") == 1
        assert rig.copies("irr-fail") == 0
        assert rig.types("rv-drop") == ["Requested", "Attempted", "Unknown", "Escalated"]
        assert not events_of(rig.history("rv-drop"), "SearchedMiss")  # straight to a human
        irr_fail = rig.types("irr-fail")
        assert irr_fail == [
            "Requested",
            "Attempted",
            "Unknown",
            "SearchedMiss",
            "SearchedMiss",
            "Escalated",
        ], irr_fail
        assert _confirmations(rig.history("irr-drop")) == ["search"]
        for key in ("rv-drop", "rv-fail", "irr-fail"):
            assert events_of(rig.history(key), "Escalated")[0]["reason"] == "unknown-outcome"
        listed = {row["key"]: row for row in rig.cli_json("review", "list")}
        assert set(listed) == {"rv-drop", "rv-fail", "irr-fail"}
        assert listed["rv-drop"]["message_id"] == rig.message_id("rv-drop")

        # A human: resend the two that were never forwarded, confirm the one that was.
        rig.cli_parallel(
            ["review", "resolve", "rv-fail", "--as", "resend", "--by", "tester"],
            ["review", "resolve", "irr-fail", "--as", "resend", "--by", "tester"],
            ["review", "resolve", "rv-drop", "--as", "sent", "--note", "seen it", "--by", "tester"],
        )
        rig.wait_for(
            lambda: rig.state("rv-fail") == rig.state("irr-fail") == "confirmed",
            "the resent jobs to be confirmed",
        )
        time.sleep(0.5)
        assert daemon.terminate() == 0, daemon.tail()

        for key in ("rv-fail", "irr-fail"):
            history = rig.history(key)
            types = [r["type"] for r in history]
            # A resend searches first, now, and records what it found: nothing.
            assert types[-5:] == ["Escalated", "Checked", "Resolved", "Attempted", "Confirmed"]
            checked = events_of(history, "Checked")[0]
            assert (checked["by"], checked["provider_message_ids"]) == ("tester", [])
            assert types.count("Attempted") == 2
            assert events_of(history, "Resolved")[0]["decision"] == "resend"
            assert _confirmations(history) == ["response"]
            assert rig.copies(key) == 1
        history = rig.history("rv-drop")
        assert [r["type"] for r in history][-2:] == ["Resolved", "Confirmed"]
        assert _confirmations(history) == ["operator"]
        assert events_of(history, "Resolved")[0]["by"] == "tester"
        assert [r["type"] for r in history].count("Attempted") == 1
        assert rig.copies("rv-drop") == 1
        assert len(rig.sends()) == len(HUMAN_JOBS) + 2  # exactly the two resends
