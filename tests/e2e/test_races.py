"""No race between people, leases and the daemon (issue 25's "Must show"): the daemon as a
process, the Gmail (or Graph) emulator behind the fault relay, every effect counted at
the emulator, never in the daemon's records (docs/review.md "Two people, one job",
docs/architecture.md "Leases", "Drafts never outlive their job" and "Outages: waited out,
not escalated", docs/operations.md "Outages and quotas").

Each scenario repeats its race 30 times or more inside one daemon run (two daemons at
once for give_up_after's two orders): many jobs, each meeting the race at an offset drawn
from a seeded `random.Random` (`RACES_SEED` replays a failing run's draws), with
durations scaled down to a few hundred milliseconds:

1. two doors (the CLI and the HTTP API) resending one job in review at once;
2. a slow drafts provider (grace = timeout): nothing recorded unsent that was sent, no
   live claim recovered;
3. messages mode, a slow send and a slow read-back together past the lease: no review;
4. a Graph check while the send is in flight: every job sent once;
5. hangs with `concurrency = 4`: at most four jobs Unknown per hang of the whole provider,
   and never a job sent into a known hang unless a read answered first;
6. `give_up_after` in both queue orders, its channel's jobs given up on time, the other
   channel's waiting.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from tests.e2e.daemon_kit import (
    API_AUTH,
    MAILBOX,
    RETRY_POLICY,
    ForkServer,
    Rig,
    events_of,
    job,
    shared_fork_server,
)
from tests.e2e.test_crash_matrix import POLICY
from tests.e2e.test_graph_daemon import GRAPH_POLICY, GraphRig
from tests.e2e.test_review_outage import LEGAL
from tests.e2e.test_review_outage import job as legal_job

from daemon.engine.recover import REASON as RECOVERED
from ledger.job import NOT_OURS, STOPPED, WITHHELD
from testkit.mailservers import free_port
from testkit.relay import FaultPlan, Mode

SEED = int(os.environ.get("RACES_SEED", "25"))


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def rng_for(scenario: str) -> random.Random:
    return random.Random(f"{SEED}:{scenario}")


def at(record: Mapping[str, Any]) -> float:
    """An event's time (`history --json`'s ISO `at`) in epoch seconds."""
    return datetime.fromisoformat(str(record["at"])).timestamp()


def run_at(moments: Sequence[tuple[float, Callable[[], None]]]) -> None:
    """Each action on a thread of its own at its `time.monotonic()` moment; returns when
    all have returned (an action records its own answer)."""

    def later(moment: float, action: Callable[[], None]) -> None:
        time.sleep(max(0.0, moment - time.monotonic()))
        action()

    threads = [threading.Thread(target=later, args=pair, daemon=True) for pair in moments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a scheduled action never returned"


# -- 1. two doors resending at once ------------------------------------------------------

#: The legal channel of tests/e2e/test_review_outage.py (an unknown outcome goes straight
#: to a human). A resend searches first, and no sooner than `search_after` after the last
#: attempt: here longer than the emulator's index lag, so that search sees every copy.
LEGAL_LAGGED: dict[str, Any] = {**LEGAL, "search_after": "600ms"}
PAIRS = 34
LAG = 0.3
#: The second door acts up to this long after the first (the issue's 0.6-2.2 s, scaled
#: to search_after): before the first door's decision is saved, while its resend is in
#: flight, back in review before search_after, and after it (its copy searchable).
MAX_OFFSET = 1.5


@dataclass
class Door:
    """One person's resend of one job through one door, and its answer."""

    name: str  # "cli" or "api"
    key: str
    started: float = 0.0
    took: float = 0.0
    code: int | None = None  # the exit code, or the HTTP status
    text: str = ""

    @property
    def won(self) -> bool:
        return self.code in (0, 200)

    @property
    def refused(self) -> bool:
        return self.code in (3, 409)


def resend_by_cli(rig: Rig, server: ForkServer, door: Door) -> None:
    """`sendledger review resolve KEY --as resend`, forked from a process that imported
    sendledger once (a console script's start costs a second of CPU; 34 of them would
    cost the machine more than the race)."""
    door.started = time.monotonic()
    argv = ["--config", str(rig.config), "review", "resolve", door.key, "--as", "resend"]
    log = rig.dir / f"{door.key}.log"
    door.code, door.text = server.run([*argv, "--by", "cli"], rig.dir, log, env=rig.child_env())
    door.took = time.monotonic() - door.started


def resend_by_api(rig: Rig, door: Door, expected_version: int | None) -> None:
    door.started = time.monotonic()
    body: dict[str, Any] = {"as": "resend"}
    if expected_version is not None:
        body["expected_version"] = expected_version  # what the page's form carries
    answer = httpx.post(
        f"{rig.api_url}/v1/review/{quote(door.key, safe='')}/resolve",
        json=body,
        headers=API_AUTH,
        timeout=60,
    )
    door.code, door.text = answer.status_code, answer.text
    door.took = time.monotonic() - door.started


def why_refused(text: str) -> str:
    """What the loser was told, in one word (docs/review.md "Resolve", "Two people")."""
    for phrase, word in (
        ("changed after version", "moved-on"),
        ("not in review", "not-in-review"),
        ("may not show its copy yet", "index-lag"),
        ("found: resolve as sent", "copy-found"),
    ):
        if phrase in text:
            return word
    return "other: " + text.strip()[-200:]


def calls_made(history: list[dict[str, Any]]) -> int:
    """The job's claims that were followed by a provider call."""
    calls: int = sum(e["type"] == "Attempted" for e in history) - sum(
        e["type"] == "Rejected" and e.get("reason") in (NOT_OURS, WITHHELD, STOPPED)
        for e in history
    )
    return calls


def test_two_doors_resending_at_once_one_wins_the_other_is_refused(tmp_path: Path) -> None:
    rng = rng_for("doors")
    keys = [f"notice-{n:02d}" for n in range(PAIRS)]
    rig = Rig(
        tmp_path,
        lag=LAG,
        concurrency=4,
        timeout="5s",  # the race needs no timeout: a loaded machine must not make one
        # Each job's first send is lost before Gmail sees it (review, no copy); every
        # later send, the one resend a job may get, arrives and its answer is dropped,
        # so the resent job comes back to review with its copy in the mailbox.
        plan=FaultPlan(send=["fail-before-forward"] * PAIRS, default="drop-response"),
        policies={"legal": LEGAL_LAGGED},
        api_port=free_port(),
    )
    server = shared_fork_server()
    with rig:
        rig.start_daemon()
        rig.submit_api([legal_job(key) for key in keys])
        rig.wait_for(lambda: all(rig.state(k) == "review" for k in keys), "every job in review")
        assert all(rig.copies(k) == 0 for k in keys)
        seen = {key: row.version for key in keys if (row := rig.row(key)) is not None}
        time.sleep(0.7)  # past search_after since the first attempts: a resend may search

        doors: dict[str, tuple[Door, Door]] = {}
        moments: list[tuple[float, Callable[[], None]]] = []
        start = time.monotonic() + 0.3
        for n, key in enumerate(keys):
            cli, api = Door("cli", key), Door("api", key)
            doors[key] = (cli, api)
            # Every other API call carries the version its person saw, as the page does.
            actions = [
                partial(resend_by_cli, rig, server, cli),
                partial(resend_by_api, rig, api, seen[key] if n % 2 else None),
            ]
            rng.shuffle(actions)  # either door first
            begin = start + n * 0.1 + rng.uniform(0.0, 0.1)
            # Small offsets are the likelier: both doors inside one decision is the race.
            offset = MAX_OFFSET * rng.random() ** 2
            moments += [(begin, actions[0]), (begin + offset, actions[1])]
        run_at(moments)

        # Whoever won, its resend was sent and its answer dropped: back in review.
        rig.wait_for(
            lambda: all(rig.state(k) == "review" and rig.types(k).count("Attempted") >= 2
                        for k in keys),
            "every resent job back in review",
        )  # fmt: skip
        wrong, refusals = [], Counter[str]()
        for key, (cli, api) in doors.items():
            history = rig.history(key)
            resolved = events_of(history, "Resolved")
            winners = [door for door in (cli, api) if door.won]
            losers = [door for door in (cli, api) if door.refused]
            if len(winners) != 1 or len(losers) != 1 or len(resolved) != 1:
                wrong.append(f"{key}: cli {cli.code} {cli.text!r}; api {api.code} {api.text!r}")
                continue
            refusals[why_refused(losers[0].text)] += 1
            assert resolved[0]["by"] == {"cli": "cli", "api": "e2e"}[winners[0].name]
        copies = {key: rig.copies(key) for key in keys}
        twice = sorted(key for key, count in copies.items() if count >= 2)
        print(
            f"\ntwo doors: {PAIRS} pairs, losers refused {dict(refusals)}; "
            f"cli won {sum(doors[k][0].won for k in keys)}; keys with 2 copies: {len(twice)}; "
            f"offsets {min(abs(c.started - a.started) for c, a in doors.values()):.2f}-"
            f"{max(abs(c.started - a.started) for c, a in doors.values()):.2f} s; a door took "
            f"{max(d.took for pair in doors.values() for d in pair):.2f} s at most"
        )
        assert twice == [], "\n".join(f"{k}: {rig.types(k)}" for k in twice) + rig.diagnostics()
        assert wrong == [], "\n".join(wrong) + "\n" + rig.diagnostics()
        assert set(copies.values()) == {1}, copies
        # The first send and the winner's resend: the loser sent nothing.
        # (A claim saved too late on a loaded machine makes no call: `NOT_OURS`, and the
        # circuit's `WITHHELD`; not a send, and sent again later.)
        extra = {k: rig.types(k) for k in keys if calls_made(rig.history(k)) != 2}
        assert extra == {}, str(extra) + rig.diagnostics()
        assert sum(refusals.values()) == PAIRS and not [w for w in refusals if "other" in w]
        # Some pairs did decide on the same version: the race itself, not only its edges.
        assert refusals["moved-on"] > 0, refusals


# -- 2. and 3. a slow provider: a live claim is never recovered -----------------------------

SLOW_JOBS = 32


def slow_rig(
    folder: Path,
    *,
    rng: random.Random,
    plan: FaultPlan,
    slow: tuple[float, float],
    timeout: float,
    grace: float,
    policy: Mapping[str, Any],
    provider_extra: str = "",
) -> Rig:
    """The Gmail emulator behind a relay that answers the requests `plan` marks `slow`
    after `slow[0]` plus up to `slow[1]` seconds (drawn from `rng`'s seed), each within
    the provider's `timeout`; every send read back (`readback_first`), a send worker
    for every job, so they all meet the slow provider at once."""
    assert sum(slow) <= timeout - 0.5, "each call must answer within its timeout, with room"
    return Rig(
        folder,
        plan=plan,
        relay_options={
            "slow_seconds": slow[0],
            "slow_jitter": slow[1],
            "seed": rng.randrange(1 << 30),
        },
        timeout=f"{timeout * 1000:.0f}ms",
        deadline_grace=f"{grace * 1000:.0f}ms",
        concurrency=SLOW_JOBS,
        provider_extra=f"readback_first = 1000\n{provider_extra}",
        policies={"receipts": policy},
        api_port=free_port(),
    )


def send_slowly(rig: Rig, keys: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Submit, run the daemon until every job is settled; each job's history."""
    rig.start_daemon()
    rig.submit_api([job(key) for key in keys])
    rig.wait_settled(keys, timeout=60)
    return {key: rig.history(key) for key in keys}


def recovered(histories: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Jobs whose claim recovery took for a crash ("no outcome recorded by the attempt's
    deadline"): in one live daemon, never."""
    return sorted(
        key
        for key, history in histories.items()
        if any(event["reason"] == RECOVERED for event in events_of(history, "Unknown"))
    )


def renewed(histories: Mapping[str, Sequence[Mapping[str, Any]]]) -> int:
    return sum(bool(events_of(history, "LeaseRenewed")) for history in histories.values())


def test_a_slow_drafts_provider_records_nothing_unsent_that_was_sent(tmp_path: Path) -> None:
    """deadline_grace = timeout; drafts.list, drafts.create, drafts.send and the read-back
    each answer late but within the timeout, together well past the lease the claim
    would have had if it were counted from before the draft step."""
    rng = rng_for("drafts")
    keys = [f"draft-{n:02d}" for n in range(SLOW_JOBS)]
    rig = slow_rig(
        tmp_path,
        rng=rng,
        plan=FaultPlan(send="slow", search="slow", other="slow"),
        slow=(0.8, 0.2),
        timeout=1.5,
        grace=1.5,
        policy={**RETRY_POLICY, "pending_draft": "review"},
        provider_extra='send_via = "drafts"\n',
    )
    with rig:
        histories = send_slowly(rig, keys)
        copies = {key: rig.copies(key) for key in keys}
        unsent_but_sent = sorted(
            key for key, history in histories.items()
            if events_of(history, "DraftPending") and copies[key] > 0
        )  # fmt: skip
        states = Counter(r.state for r in rig.rows())
        print(
            f"\nslow drafts: {len(keys)} jobs, states {dict(states)}, recorded unsent with a "
            f"copy {len(unsent_but_sent)}, own claims recovered {len(recovered(histories))}, "
            f"leases renewed on {renewed(histories)} jobs, copies {dict(Counter(copies.values()))}"
        )
        assert unsent_but_sent == [], {k: rig.types(k) for k in unsent_but_sent}
        assert recovered(histories) == [], rig.diagnostics()
        assert max(copies.values()) == 1, copies
        assert renewed(histories) > 0  # the calls did outlast a third of their timeout
        # Once confirmed, a job's drafts are deleted (`search_after` later): none is left.
        confirmed = [key for key in keys if rig.state(key) == "confirmed"]
        rig.wait_for(
            lambda: all(
                any(e["why"] == "tidy" for e in events_of(rig.history(k), "DraftsDeleted"))
                for k in confirmed
            ),
            "every confirmed job's drafts tidied",
        )
        assert rig.emulator.drafts(MAILBOX) == {}


def test_a_slow_send_and_read_back_past_the_lease_need_no_review(tmp_path: Path) -> None:
    """Messages mode: the send and the Message-ID read-back each answer within the
    timeout, together past timeout + grace; a review channel, so any Unknown would show."""
    rng = rng_for("readback")
    keys = [f"slow-{n:02d}" for n in range(SLOW_JOBS)]
    timeout, grace, slow = 2.0, 0.2, (1.2, 0.2)
    assert 2 * slow[0] > timeout + grace  # the lease runs out before the worker is done
    rig = slow_rig(
        tmp_path,
        rng=rng,
        plan=FaultPlan(send="slow", search="slow"),
        slow=slow,
        timeout=timeout,
        grace=grace,
        policy={**RETRY_POLICY, "on_unknown": "review"},
    )
    with rig:
        histories = send_slowly(rig, keys)
        states = Counter(r.state for r in rig.rows())
        unknown = sum(len(events_of(h, "Unknown")) for h in histories.values())
        copies = {key: rig.copies(key) for key in keys}
        print(
            f"\nslow send + read-back: {len(keys)} jobs, states {dict(states)}, Unknown "
            f"{unknown}, leases renewed on {renewed(histories)} jobs, copies "
            f"{dict(Counter(copies.values()))}"
        )
        assert states == {"confirmed": len(keys)}, rig.diagnostics()
        assert unknown == 0 and recovered(histories) == []
        assert set(copies.values()) == {1}, copies
        assert all(
            [e["via"] for e in events_of(h, "Confirmed")] == ["response"]
            for h in histories.values()
        )
        assert renewed(histories) == len(keys)  # every call outlived a third of its timeout


# -- 4. a Graph check during a send ---------------------------------------------------------

GRAPH_JOBS = 40
MAILBOXES = tuple(f"Receipts {n} <receipts-{n}@shop.example>" for n in "abcd")
SENDERS: dict[str, Any] = {"allowed_from": ["*@shop.example"]}


class Checker:
    """Watches the jobs' states; once a job's claim is stored (`attempted`: its send is
    in flight), asks `POST /v1/review/{key}/check` after a random part of the slow send,
    once per job, each on a thread of its own."""

    def __init__(self, rig: Rig, keys: Sequence[str], rng: random.Random, within: float) -> None:
        self.rig, self.rng, self.within = rig, rng, within
        self.waiting = set(keys)
        self.answers: dict[str, dict[str, Any]] = {}
        self.failures: list[str] = []
        self._threads: list[threading.Thread] = []
        self._watch = threading.Thread(target=self._run, daemon=True)
        self._watch.start()

    def _run(self) -> None:
        end = time.monotonic() + 60
        while self.waiting and time.monotonic() < end:
            for row in self.rig.rows():
                if row.key in self.waiting and row.state == "attempted":
                    self.waiting.discard(row.key)
                    delay = self.rng.uniform(0.0, self.within)
                    thread = threading.Timer(delay, self._check, args=(row.key,))
                    thread.start()
                    self._threads.append(thread)
            time.sleep(0.02)

    def _check(self, key: str) -> None:
        url = f"{self.rig.api_url}/v1/review/{quote(key, safe='')}/check"
        try:
            answer = httpx.post(url, headers=API_AUTH, timeout=30)
        except httpx.HTTPError as exc:
            self.failures.append(f"{key}: {exc!r}")
            return
        if answer.status_code != 200:
            self.failures.append(f"{key}: {answer.status_code} {answer.text}")
        else:
            self.answers[key] = answer.json()

    def join(self) -> None:
        self._watch.join(timeout=70)
        for thread in self._threads:
            thread.join(timeout=40)


OUTCOMES = ("Confirmed", "Unknown", "Rejected")  # what ends a send in a job's history


def searched_during_the_send(rig: Rig, key: str) -> bool:
    """Whether a `$filter` search for the job's Message-ID reached the mailbox between
    its claim and its outcome: the check's (the daemon searches a confirmed job never;
    its tidy comes `search_after` later)."""
    history = rig.history(key)
    claim = next(n for n, event in enumerate(history) if event["type"] == "Attempted")
    outcome = next((e for e in history[claim:] if e["type"] in OUTCOMES), None)
    if outcome is None:
        return False
    wanted = f"internetMessageId eq '{rig.message_id(key)}'"
    return any(
        entry["kind"] == "search"
        and wanted in unquote(entry["path"])
        and at(history[claim]) <= entry["at"] <= at(outcome)
        for entry in list(rig.relay.log)
    )


def test_a_graph_check_during_a_send_never_costs_the_send(tmp_path: Path) -> None:
    """A person's check only reads (docs/review.md "Check"): on Graph, where every send
    is a draft first, a check while the send is in flight must not delete that draft."""
    rng = rng_for("graph")
    keys = [f"graph-{n:02d}" for n in range(GRAPH_JOBS)]
    # Slow enough for a check to land inside the send on a loaded machine too: with 1.2 s
    # (jitter 0.6) 18-40 of the 40 checks landed inside at load averages of 5-12.
    slow = (2.0, 0.6)
    rig = GraphRig(
        tmp_path,
        timeout="3s",
        # Four mailboxes (`user = "{from}"`), served in turn: about two sends in each, and
        # Graph takes 4 requests in flight per mailbox, so the checks find room.
        concurrency=2 * len(MAILBOXES),
        relay_options={
            "slow_seconds": slow[0],
            "slow_jitter": slow[1],
            "seed": rng.randrange(1 << 30),
        },
        api_port=free_port(),
        policies={"receipts": {**GRAPH_POLICY, **SENDERS, "on_unknown": "search-then-review"}},
    )
    rig.relay.set_plan(FaultPlan(send="slow"))  # the draft's send waits; its draft exists
    with rig:
        rig.start_daemon()
        rig.wait_api()
        checker = Checker(rig, keys, rng, within=slow[0] / 3)
        senders = itertools.cycle(MAILBOXES)
        rig.submit_api([{**job(key), "from": next(senders)} for key in keys])
        rig.wait_settled(keys, timeout=60)
        checker.join()
        in_flight = [a for a in checker.answers.values() if not a["recorded"]]
        during = [key for key in keys if searched_during_the_send(rig, key)]
        states = Counter(r.state for r in rig.rows())
        copies = {key: rig.emulator.copies(rig.message_id(key)) for key in keys}
        mailboxes = Counter(entry["user"] for entry in rig.emulator.accepted())
        unknown = sum(len(events_of(rig.history(k), "Unknown")) for k in keys)
        print(
            f"\ngraph check during a send: {len(keys)} jobs, {len(checker.answers)} checks, "
            f"{len(during)} searched while the send was in flight ({len(in_flight)} found the "
            f"claim not yet settled: not recorded), states {dict(states)}, Unknown "
            f"{unknown}, copies {dict(Counter(copies.values()))} in mailboxes {dict(mailboxes)}"
        )
        assert checker.failures == [], checker.failures
        assert states == {"confirmed": len(keys)}, rig.diagnostics()
        assert set(copies.values()) == {1}, copies
        # The race must have been run, not won by luck: half the checks inside a send at
        # least (what a loaded machine still gives; every one of them is held to the above).
        assert len(during) >= len(keys) // 2, (len(during), checker.answers)
        assert all(a["state"] == "attempted" for a in in_flight)


# -- 5. hangs with concurrency = 4 ----------------------------------------------------------

HANG: Mode = "hang-before-forward"
#: Every request of the provider held and never forwarded, sends, searches and the ping
#: alike: a proxy or a server that stopped answering. The whole hang costs the sends in
#: flight when it began, four at the most.
EVERYTHING_HANGS = FaultPlan(send=HANG, search=HANG, other=HANG)
#: Only the sends held; reads answer. Each probe's ping answers and lets one send through
#: to find out whether sends work again, so past the first four a job goes into the hang
#: only after such an answer. See docs/architecture.md
#: "Outages: waited out, not escalated".
SENDS_HANG = FaultPlan(send=HANG)
HANGS = (
    ("everything", EVERYTHING_HANGS),
    ("sends only", SENDS_HANG),
    ("everything", EVERYTHING_HANGS),
)
HANG_TIMEOUTS = 4  # each hang lasts this many provider timeouts
HANG_JOBS = 100


def hang_of(
    unknown: Sequence[tuple[str, float, float]], windows: Sequence[tuple[float, float]]
) -> list[list[str]]:
    """The jobs whose Unknown came of each hang: each (key, claimed, recorded) whose call,
    from its claim to its Unknown, was in flight at some moment of the hang, so the relay
    may have held it. On a loaded machine an Unknown is recorded late, well after a
    timeout past the hang's end: its call's span still says which hang held it, where
    the moment it was recorded does not. A call in flight through no hang that ended
    Unknown is a false alarm."""
    per_hang: list[list[str]] = [[] for _ in windows]
    for key, claimed, moment in unknown:
        # The first such hang: its call reached the relay right after its claim.
        for n, (began, ended) in enumerate(windows):
            if claimed <= ended and moment >= began:
                per_hang[n].append(key)
                break
    return per_hang


def calls_ended_unknown(history: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, str]]:
    """Each Unknown of a job's history with the claim it ended: (claimed, recorded, reason)."""
    found: list[tuple[float, float, str]] = []
    claimed = None
    for event in history:
        if event["type"] == "Attempted":
            claimed = at(event)
        elif event["type"] == "Unknown":
            found.append(
                (at(event) if claimed is None else claimed, at(event), str(event.get("reason")))
            )
    return found


def out_of_windows(
    reasons: Sequence[tuple[str, float, float, str]],
    windows: Sequence[tuple[float, float]],
) -> str:
    """The Unknowns no hang explains (`hang_of`), each with its claim's and its own time
    and its reason next to the hangs' windows, so a red run says why a healthy send was
    taken for ambiguous; "" when there are none."""
    outside = [
        f"{key} claimed {claimed:.3f}, Unknown at {moment:.3f}: {reason}"
        for key, claimed, moment, reason in sorted(reasons, key=lambda r: r[2])
        if not any(hang_of([(key, claimed, moment)], windows))
    ]
    if not outside:
        return ""
    spans = ", ".join(f"{began:.3f}-{ended:.3f}" for began, ended in windows)
    return f"Unknown outside every hang (windows {spans}): " + "; ".join(outside)


def sent_unprobed(
    log: Sequence[Mapping[str, Any]],
    began: float,
    ended: float,
    timeout: float,
    first_unknown: float | None = None,
) -> list[float]:
    """Sends the relay held during a hang that went in after the daemon knew of the hang
    (its first timeout: the first Unknown the hang caused, as the daemon recorded it; on a
    loaded machine a timeout ends later than the first held send plus the timeout) with
    no read of the provider answered since the previous held send: each such one is a job
    sent into a known hang."""
    held = sorted(
        e["at"]
        for e in log
        if e["kind"] == "send" and e["mode"] == HANG and began <= e["at"] <= ended
    )
    if not held:
        return []
    known = held[0] + timeout if first_unknown is None else max(held[0] + timeout, first_unknown)
    answered = [
        e["at"]
        for e in log
        if e["kind"] != "send" and e["upstream_status"] is not None and began <= e["at"] <= ended
    ]
    return [
        this
        for before, this in itertools.pairwise(held)
        if this >= known and not any(before < moment < this for moment in answered)
    ]


def forwarded_at_least(rig: Rig, count: int) -> bool:
    return len(rig.sends(forwarded=True)) >= count


HANG_CALL_TIMEOUT = 0.5
FLOWING = FaultPlan(send="slow")  # 0.02-0.12 s a send: four are nearly always in flight


def hang_rig(tmp_path: Path, rng: random.Random) -> Rig:
    """Four workers sending a flow of jobs through the relay, its hangs held past the
    client's timeout (two of them), then closed."""
    timeout = HANG_CALL_TIMEOUT
    return Rig(
        tmp_path,
        plan=FLOWING,
        relay_options={"slow_seconds": 0.02, "slow_jitter": 0.1, "seed": rng.randrange(1 << 30)},
        hang_seconds=2 * timeout,  # held past the client's timeout, then closed
        timeout=f"{timeout * 1000:.0f}ms",
        deadline_grace="500ms",
        concurrency=4,
        daemon_extra='circuit_probe_after = "200ms"\ncircuit_probe_max = "400ms"\n',
        policies={"receipts": POLICY},  # the crash matrix's: searched 500 ms after
        api_port=free_port(),
    )


def test_a_hang_costs_at_most_the_four_calls_in_flight(tmp_path: Path) -> None:
    """Three hangs, each 4 provider timeouts long (the issue's 15 s at a 4 s timeout),
    at random moments into a flow of 100 jobs sent four at a time: a hang of the whole
    provider costs at most the four sends in flight when it began, one of its sends only
    one more job for each read that answered; every other job is sent once after."""
    rng = rng_for("hang")
    keys = [f"hang-{n:03d}" for n in range(HANG_JOBS)]
    timeout = HANG_CALL_TIMEOUT
    rig = hang_rig(tmp_path, rng)
    windows: list[tuple[float, float]] = []
    with rig:
        rig.start_daemon()
        rig.submit_api([job(key) for key in keys])
        for _what, plan in HANGS:
            flowing_again = partial(forwarded_at_least, rig, len(rig.sends(forwarded=True)) + 4)
            rig.wait_for(flowing_again, "sends flowing")
            time.sleep(rng.uniform(0.0, 0.5))
            waiting = sum(rig.state(key) == "requested" for key in keys)
            assert waiting >= 8, f"only {waiting} jobs left to send into the hang"
            began = time.time()
            rig.relay.set_plan(plan)
            time.sleep(HANG_TIMEOUTS * timeout)
            rig.relay.set_plan(FLOWING)
            windows.append((began, time.time()))
        rig.wait_for(
            partial(all_in, rig, keys, "confirmed"),
            "every job confirmed after the hangs",
            timeout=60,
        )
        reasons = [
            (key, claimed, moment, reason)
            for key in keys
            for claimed, moment, reason in calls_ended_unknown(rig.history(key))
        ]
        unknown = [(key, claimed, moment) for key, claimed, moment, _ in reasons]
        per_hang = hang_of(unknown, windows)
        log = list(rig.relay.log)
        held = [
            sum(
                e["kind"] == "send" and e["mode"] == HANG and began <= e["at"] <= ended for e in log
            )
            for began, ended in windows
        ]
        firsts = [
            min((m for _, _, m in unknown if began <= m <= ended + timeout + 0.5), default=None)
            for began, ended in windows
        ]
        unprobed = [
            sent_unprobed(log, began, ended, timeout, first)
            for (began, ended), first in zip(windows, firsts, strict=True)
        ]
        copies = Counter(rig.copies(key) for key in keys)
        print(
            f"\nhangs: {HANG_JOBS} jobs, {len(HANGS)} hangs of {HANG_TIMEOUTS * timeout:g} s "
            f"({', '.join(what for what, _ in HANGS)}): Unknown per hang "
            f"{[len(k) for k in per_hang]} (total {len(unknown)}), sends held per hang {held}, "
            f"sent into a known hang unprobed {[len(u) for u in unprobed]}, copies {dict(copies)}"
        )
        for (what, _plan), jobs, sends, blind in zip(HANGS, per_hang, held, unprobed, strict=True):
            if what == "everything":
                assert len(jobs) <= 4 and sends <= 4, (what, jobs, sends, rig.diagnostics())
                # Within those four, a send may reach the relay after the first Unknown: one
                # timeout with no other call in flight is not taken for a hang (a slow call
                # can outlive a deadline, daemon/engine/circuit.py), and on a loaded machine
                # fewer than four may be in flight when the hang begins (CI: [1] blind of 4).
                continue
            assert blind == [], (what, blind, rig.diagnostics())
        # None outside a hang: a healthy send taken for ambiguous is a false alarm.
        outside = out_of_windows(reasons, windows)
        assert not outside, outside
        assert copies == {1: HANG_JOBS}, copies


def test_a_pause_of_the_daemon_during_a_hang_of_its_sends_sends_nothing_into_it_unprobed(
    tmp_path: Path,
) -> None:
    """The sends-only hang above with the daemon stopped (SIGSTOP) 0.7 s every 1.3 s:
    the held sends' waits passed their timeout during a stop, the relay closed what it
    held meanwhile, and on resuming the calls ended "connection closed without a
    response", an answer for the circuit: it never opened, and the next four jobs went
    into the hang unprobed (1 run of 10 before; daemon/providers/early_answers.py
    `AnswerReader._no_answer_in_time`)."""
    rng = rng_for("pause-hang")
    keys = [f"paused-hang-{n:02d}" for n in range(40)]
    timeout = HANG_CALL_TIMEOUT
    with hang_rig(tmp_path, rng) as rig:
        daemon = rig.start_daemon()
        rig.submit_api([job(key) for key in keys])
        rig.wait_for(partial(forwarded_at_least, rig, 4), "sends flowing")
        time.sleep(rng.uniform(0.0, 0.3))
        stopped = threading.Event()

        def pause_now_and_then() -> None:
            while not stopped.is_set():
                os.kill(daemon.pid, signal.SIGSTOP)
                time.sleep(0.7)
                os.kill(daemon.pid, signal.SIGCONT)
                stopped.wait(0.6)

        began = time.time()
        rig.relay.set_plan(SENDS_HANG)
        pauser = threading.Thread(target=pause_now_and_then, daemon=True)
        pauser.start()
        try:
            time.sleep(HANG_TIMEOUTS * timeout + 1.0)
            rig.relay.set_plan(FLOWING)
        finally:
            stopped.set()
            pauser.join(5)
            os.kill(daemon.pid, signal.SIGCONT)
        ended = time.time()
        rig.wait_for(partial(all_in, rig, keys, "confirmed"), "every job confirmed", timeout=60)
        unknown = [
            moment
            for key in keys
            for _claimed, moment, _reason in calls_ended_unknown(rig.history(key))
        ]
        first = min((m for m in unknown if began <= m <= ended + timeout + 0.5), default=None)
        blind = sent_unprobed(list(rig.relay.log), began, ended, timeout, first)
        print(f"\npaused in a sends-only hang: {len(unknown)} Unknown, unprobed {blind}")
        assert blind == [], (blind, rig.diagnostics())
        assert Counter(rig.copies(key) for key in keys) == {1: len(keys)}


PAUSES = 3  # stops of the daemon's process during a healthy flow


def test_a_pause_of_the_daemon_turns_no_healthy_send_unknown(tmp_path: Path) -> None:
    """The clean-clone CI's red run of the test above: four healthy sends Unknown within
    63 ms, outside every hang. Its shape is a pause of the daemon's process (a loaded
    machine) past the 0.5 s timeout while its four calls were in flight: their answers
    arrived meanwhile, and the reader looked at the clock before the socket and ended
    each "timed out". Stopped here (SIGSTOP) three times for 1.5 timeouts, on the code
    before: 3 or 4 such Unknowns at the same millisecond in 3 of 3 runs. A call still
    writing when stopped is cut at its lease by design (no write past the moment another
    daemon may recover its claim): its reason says so, and it is not a false alarm."""
    rng = rng_for("pause")
    keys = [f"pause-{n:02d}" for n in range(40)]
    timeout = 0.5
    rig = Rig(
        tmp_path,
        plan=FaultPlan(send="slow"),
        relay_options={"slow_seconds": 0.02, "slow_jitter": 0.1, "seed": rng.randrange(1 << 30)},
        timeout=f"{timeout * 1000:.0f}ms",
        deadline_grace="500ms",
        concurrency=4,
        policies={"receipts": POLICY},
        api_port=free_port(),
    )
    with rig:
        daemon = rig.start_daemon()
        rig.submit_api([job(key) for key in keys])
        for _ in range(PAUSES):
            flowing = partial(forwarded_at_least, rig, len(rig.sends(forwarded=True)) + 4)
            rig.wait_for(flowing, "sends flowing")
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                time.sleep(1.5 * timeout)
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
        rig.wait_for(partial(all_in, rig, keys, "confirmed"), "every job confirmed", timeout=60)
        unknown = [
            f"{key} at {at(event):.3f}: {event.get('reason')}"
            for key in keys
            for event in events_of(rig.history(key), "Unknown")
        ]
        print(f"\npauses: {len(keys)} jobs, {PAUSES} stops of {1.5 * timeout:g} s: {unknown}")
        assert [u for u in unknown if "lease ends" not in u] == [], unknown
        assert Counter(rig.copies(key) for key in keys) == {1: len(keys)}


# -- 6. give_up_after in both orders -------------------------------------------------------

GIVE_UP_AFTER = 1.5
PER_GROUP = 16  # jobs of each channel in each order
PATIENT: dict[str, Any] = {**RETRY_POLICY}  # waits as long as the outage lasts
IMPATIENT: dict[str, Any] = {**RETRY_POLICY, "give_up_after": f"{GIVE_UP_AFTER * 1000:.0f}ms"}


def waited_since(history: Sequence[Mapping[str, Any]]) -> float:
    """When the job began to wait for the provider (docs/policies.md "Provider outages"):
    its first refusal as unavailable, else when it was due (its `send_at`)."""
    refused = [e for e in events_of(history, "Rejected") if e["unavailable"]]
    if refused:
        return at(refused[0])
    return datetime.fromisoformat(str(history[0]["send_at"])).timestamp()


#: The two orders, each in a daemon and provider of its own (one queue each): the channel
#: that waits without limit at the head, the one that gives up behind it; and the reverse.
ORDERS = (("patient", "impatient"), ("impatient", "patient"))


def all_in(rig: Rig, keys: Sequence[str], state: str) -> bool:
    states = rig.states()  # one read of the index, not one per job
    return all(states.get(key) == state for key in keys)


def jobs_in_order(order: Sequence[str], base: float, rng: random.Random) -> list[dict[str, Any]]:
    """PER_GROUP jobs of each channel, the first channel's due before the second's, each
    at a random moment of its half second."""
    return [
        {**job(f"{place}-{channel}-{n:02d}", channel=channel), "send_at": iso(due)}
        for place, channel in enumerate(order)
        for n in range(PER_GROUP)
        for due in [base + place * 0.5 + rng.uniform(0.0, 0.5)]
    ]


def test_give_up_after_holds_for_every_job_whatever_its_place_in_the_queue(
    tmp_path: Path,
) -> None:
    """Two channels on one provider that refuses connections, one with `give_up_after`,
    their jobs due in both orders (two daemons at once, one order each): every job of
    the give-up channel goes to review close to its own give-up time, wherever it stands
    in its queue; the other channel's jobs wait, then are sent once the provider is back."""
    rng = rng_for("give-up")
    with contextlib.ExitStack() as stack:
        rigs = {
            order: stack.enter_context(
                Rig(
                    tmp_path / "-first-".join(order),
                    concurrency=2,
                    daemon_extra='circuit_probe_after = "300ms"\ncircuit_probe_max = "600ms"\n',
                    policies={"patient": PATIENT, "impatient": IMPATIENT},
                    api_port=free_port(),
                )
            )
            for order in ORDERS
        }
        for rig in rigs.values():
            rig.relay.stop()  # connection refused until it starts again
            rig.start_daemon()
        for rig in rigs.values():
            rig.wait_api()
        base = time.time() + 1.0
        jobs = {order: jobs_in_order(order, base, rng) for order in ORDERS}
        for order, rig in rigs.items():
            rig.submit_api(jobs[order])
        # Stored well before the first give-up time (a job stored after its send_at is
        # due at once, and its give-up time is still its own).
        assert time.time() < base + GIVE_UP_AFTER - 0.5, "the submits took too long"

        late: dict[str, float] = {}
        for order, rig in rigs.items():
            impatient = [j["key"] for j in jobs[order] if j["channel"] == "impatient"]
            rig.wait_for(
                partial(all_in, rig, impatient, "review"),
                f"every job of the give-up channel in review ({order[0]} first)",
                timeout=20,
            )
            for key in impatient:
                history = rig.history(key)
                [escalated] = events_of(history, "Escalated")
                assert escalated["reason"] == "provider-unavailable", history
                late[f"{order[0]} first: {key}"] = at(escalated) - (
                    waited_since(history) + GIVE_UP_AFTER
                )
        # The other channel's jobs are still waiting, each longer than give_up_after.
        last_due = max(
            datetime.fromisoformat(j["send_at"]).timestamp()
            for j in jobs[ORDERS[0]] + jobs[ORDERS[1]]
        )
        time.sleep(max(0.0, last_due + GIVE_UP_AFTER + 0.5 - time.time()))
        patient = {
            order: [j["key"] for j in jobs[order] if j["channel"] == "patient"] for order in ORDERS
        }
        waiting = Counter(rig.state(key) for order, rig in rigs.items() for key in patient[order])
        for order, rig in rigs.items():
            rig.relay.start()  # the provider is back, on the same port
            rig.wait_for(
                partial(all_in, rig, patient[order], "confirmed"),
                "the waiting channel's jobs sent once the provider is back",
            )
        print(
            f"\ngive_up_after: {len(late)} jobs given up ({PER_GROUP} behind the other "
            f"channel's jobs, {PER_GROUP} ahead), late by {min(late.values()):.3f}-"
            f"{max(late.values()):.3f} s; the other channel's {sum(waiting.values())} "
            f"{dict(waiting)} past give_up_after, then sent"
        )
        assert all(-0.01 <= delay <= 1.0 for delay in late.values()), late
        assert waiting == {"requested": PER_GROUP * len(ORDERS)}, waiting
        for order, rig in rigs.items():
            assert all(rig.copies(j["key"]) == (j["channel"] == "patient") for j in jobs[order])


pytestmark = pytest.mark.timeout(240)
