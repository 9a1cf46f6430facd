"""Gmail's history as the second handle, end to end (docs/providers.md "What each handle
proves"): the daemon as a process, the Gmail emulator behind the fault relay, the channel's
`search_after = "1m"`. Fifty sends whose replies the relay drops are all confirmed through
the mailbox's history within 5 s of their Unknown, with no Message-ID search made (counted
at the emulator) and one copy each. With every history read failing at the relay, fifty
more settle through the search as before (their channel's `search_after` is a second, so
the test does not wait a minute). Then the emulator replaces Message-IDs: the first
confirmed send's read-back marks the handle unreliable, and a lost reply goes to review
with neither a history read nor a search, as the search handle always did. Effects are
counted in the emulator's acceptance log; the ledger is only read."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.e2e.daemon_kit import RETRY_POLICY, Rig, events_of, job
from tests.integration.api_kit import free_port

from testkit.relay import FaultPlan

JOBS = 50
CONFIRM_WITHIN = timedelta(seconds=5)
#: Every send's answer is dropped on purpose, and the history or the search settles each:
#: the pause of a scope's sends after ten in a row (docs/policies.md) would hold the rest.
UNPAUSED: dict[str, Any] = {**RETRY_POLICY, "pause_after_unanswered": 1000}
#: The must-show's channel: a miss is believed only after a minute of index lag.
SLOW_SEARCH: dict[str, Any] = {**UNPAUSED, "search_after": "1m", "search_interval": "30s"}
#: The fallback's channel: the search decides a second after the Unknown.
QUICK_SEARCH: dict[str, Any] = {**UNPAUSED, "search_after": "1s", "search_interval": "500ms"}


def _at(record: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(str(record["at"]).replace("Z", "+00:00"))


def _history_reads(rig: Rig) -> int:
    return sum(1 for entry in list(rig.relay.log) if entry["kind"] == "history")


def test_lost_replies_settle_through_the_history_then_the_search_and_a_rewrite_stops_both(
    tmp_path: Path,
) -> None:
    with Rig(
        tmp_path,
        read_history=True,
        concurrency=4,
        plan=FaultPlan(send="drop-response"),
        policies={"receipts": SLOW_SEARCH, "fallback": QUICK_SEARCH},
        api_port=free_port(),  # jobs go in through the daemon's API: no CLI process each
    ) as rig:
        rig.start_daemon()
        first = [job(f"h-{n}") for n in range(JOBS)]
        rig.submit_api(first)
        keys = [j["key"] for j in first]
        rig.wait_settled(keys, timeout=60)
        slow: list[str] = []
        for key in keys:
            history = rig.history(key)
            [unknown] = events_of(history, "Unknown")
            [confirmed] = events_of(history, "Confirmed")
            assert confirmed["via"] == "history", (key, [r["type"] for r in history])
            if _at(confirmed) - _at(unknown) > CONFIRM_WITHIN:
                slow.append(f"{key}: {_at(confirmed) - _at(unknown)}")
            assert rig.copies(key) == 1, key
        assert slow == [], slow
        assert not [q for q in rig.emulator.searches if "rfc822msgid" in q]
        assert rig.emulator.route_counts["profile"] >= 1  # the claims' shared historyId

        # The history fails at the relay (a 500): no information, and the search settles
        # every job as it did before the history handle existed.
        reads_before = _history_reads(rig)
        rig.relay.set_plan(FaultPlan(send="drop-response", history="500-after-forward"))
        second = [job(f"s-{n}", channel="fallback") for n in range(JOBS)]
        rig.submit_api(second)
        fallback = [j["key"] for j in second]
        rig.wait_settled(fallback, timeout=60)
        for key in fallback:
            history = rig.history(key)
            assert [r["via"] for r in events_of(history, "Confirmed")] == ["search"], key
            assert not events_of(history, "HistoryMissed"), key
            assert rig.copies(key) == 1, key
        assert _history_reads(rig) > reads_before  # it was asked, and failed

        # The emulator replaces Message-IDs: the first confirmed send's read-back marks the
        # provider's handle unreliable, for the history as for the search.
        rig.emulator.rewrite_message_id = True
        rig.relay.set_plan(FaultPlan(send="pass"))
        rig.submit_api([job("rewritten-pass")])
        rig.wait_state("rewritten-pass", "confirmed")
        rig.wait_for(
            lambda: not rig.ledger.handle_reliable("gmail"), "the handle marked unreliable"
        )
        reads_before, searches_before = _history_reads(rig), len(rig.emulator.searches)
        rig.relay.set_plan(FaultPlan(send="drop-response"))
        rig.submit_api([job("rewritten-lost")])
        rig.wait_state("rewritten-lost", "review")
        history = rig.history("rewritten-lost")
        [escalated] = events_of(history, "Escalated")
        assert escalated["reason"] == "handle-unreliable"
        [unknown] = events_of(history, "Unknown")
        assert unknown["history_due_at"] is None
        assert _history_reads(rig) == reads_before and len(rig.emulator.searches) == (
            searches_before
        )
        assert rig.emulator.copies(rig.message_id("rewritten-lost")) == 0  # its id replaced
        daemon = rig.daemon
        assert daemon is not None and daemon.terminate() == 0
