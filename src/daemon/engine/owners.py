"""Scope owners: one daemon at a time works for each quota scope (docs/performance.md
"Several daemons", docs/architecture.md "Leases").

A quota scope is what one quota is spent from: a provider, or one mailbox of it where the
quota is per mailbox (`Provider.scope_of`). Daemons sharing a store each own some scopes
through a lease in the store (`ledger/stores/scopes.py`) and load, claim, send, search,
read back and tidy only for the scopes they own, so whatever the number of daemons a
mailbox is sent at the rate of one quota bucket: its owner's.

- **The round** (`balance`, every tick, before the due jobs are read): which scopes have
  work due within a lease (`Ledger.scopes_due`: the job index keeps each job's channel,
  From mailbox and attempt provider, so no job is loaded to know); how many daemons
  share them (their heartbeats, and the owners of live leases); this daemon's fair
  share, ceil(scopes / daemons). It takes free scopes (no row, a lease that ended by its
  clock, or its own) up to its share, each daemon preferring other scopes (a hash of its
  name and the scope), and gives up a scope that has had nothing due for a lease, and the
  ones above its share when another daemon is below its share and nothing is free. The
  answer is the `ScopeFilter` the tick's due reads use (`Ledger.due`).
- **The renewal** (`renew_due`, from the round and from a thread of its own): once a third
  of the lease has passed, one write renews every lease held and the heartbeat. A lease not
  renewed (another daemon took it, or it was forgotten) is dropped at once.
- **When to act** (`may_call`): only while this daemon's clock is more than
  `daemon.deadline_grace` before the lease's end. Another daemon takes a scope only after
  that end by its own clock, so with clocks within the grace of each other the two never
  act on one scope at once, and a daemon whose renewals fail (the store is gone, the
  process was stopped) stops by itself before anyone else starts. A call already made
  stays its own until it ends (its claim's lease, `leases.py`).
- **A channel moved to another provider** (a reload) leaves its jobs' attempts on the
  provider they were made on, where their searches, draft checks, tidies and bounce
  reads are made (`runner.provider_for`): ownership is asked for that provider's scope
  (`OurScopes.may_call`'s `provider`). The index keeps each job's attempt provider
  beside its channel (`IndexRow.attempt_provider`), so every daemon's round counts that
  scope as work from the index alone, whichever daemon made the attempt, and whoever
  holds it has the due reads take the channel's rows of that mailbox too. A row that
  does not say (one a daemon of an earlier release wrote during a rolling upgrade, until
  a start fills it) is still told by a worker's ask (`want`): for a horizon from then
  the scope counts as work in this daemon's round.
- **A name another process held** (`wait_for_predecessor`, on a store whose name lock
  can end under a live holder: PostgreSQL). A database restart ends the lock while its
  daemon lives, and a new process may take the name before the old one's next tick finds
  it lost; the name's leases are the new process's to take at once, but the old one may
  still be finishing calls there. A scope found under the name with a live lease, while
  the name's heartbeat was live at this process's join (the old one did not stop: a stop
  removes it), is held but not called for until the old holder's calls there are past
  their deadline: the longest provider timeout plus the grace from the take, as a claim's
  lease, plus one tick (it starts calls until its next tick's name check). A stopped
  predecessor, SQLite and memory (a lock that ends only with its holder) take the name's
  scopes back at once, and so does a process whose predecessor is provably gone: the
  heartbeat says which process wrote it (`process_mark.py`), and a kill -9 followed by a
  restart on the same host leaves a mark of a process the kernel no longer has. A
  process writes its mark only once no earlier process of the name may still be calling
  (its own wait over): a mark read later vouches for every process before it.
- **The clocks** (`clock_off`, as often as the renewer looks, and after any jump): that
  rule needs the daemons' clocks within the grace of each other, so each holds its own to
  the store's (PostgreSQL's, read between two looks at its own): more than half the grace
  off, beyond what the read took, and it stands aside (`aside`): it drops its scopes and
  its heartbeat, so the others share its work, and acts on no job, recoveries included,
  until its clock is back.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from daemon.engine.clock import Clock
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.process_mark import ProcessMark, gone, read_mark, this_process
from daemon.providers.base import Provider
from ledger.stores.identity import IdentityTaken, NameSession
from ledger.stores.index import DueScope, ScopeFilter, ScopeGroup
from ledger.stores.scopes import ScopeLease, ScopeLeaseStore
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")

#: A lease is renewed once this share of it has passed since it was last written.
RENEW_SHARE = 1 / 3


@dataclass(frozen=True)
class _Work:
    """What the round found due: each scope's provider and the mailboxes of its jobs."""

    providers: dict[str, str]  # scope -> provider name
    mailboxes: dict[str, set[str]]  # scope -> the From mailboxes with work
    #: scope -> the channels whose jobs need it though the channel's provider is another
    #: (their attempts' provider, from the index or `ScopeOwners.want`)
    moved: dict[str, set[str]] = field(default_factory=dict)


class ScopeOwners:
    """The scopes this daemon owns. Thread-safe: the tick balances, a thread renews, the
    workers ask `may_call`."""

    def __init__(
        self,
        store: ScopeLeaseStore,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        *,
        daemon: str,
        lease: float,
        grace: float,
        horizon: float,
        clock: Clock,
        process: ProcessMark | None = None,
    ) -> None:
        """`lease`: seconds a lease runs from its last write (more than `grace`);
        `horizon`: seconds ahead a job's due time makes its scope wanted (a lease plus
        the longest call, so that a scope with a call in flight is never idle);
        `process`: the mark its heartbeat carries, this process's by default."""
        self._store = store
        self._policies = policies
        self._providers = providers
        self._daemon = daemon
        self._lease = lease
        self._grace = grace
        self.horizon = horizon
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}  # scope -> its stored lease's end (our clock)
        self._idle_since: dict[str, float] = {}
        #: scope -> (provider, mailbox, channel, when last asked): the scopes of attempts
        #: made on a provider their channel has left (`want`).
        self._wanted: dict[str, tuple[str, str, str, float]] = {}
        self._renewed_at: float | None = None  # None: not joined yet
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ensured = False
        #: This daemon's name was taken by another process (`disown`).
        self.disowned = False
        #: Seconds an earlier holder of the name may still call after a scope is taken
        #: from under it (`wait_for_predecessor`); None: the name's lock ends only with
        #: its holder, whose calls ended with it.
        self._predecessor_calls: float | None = None
        #: Whether the name's heartbeat was live when this process first joined: the
        #: earlier holder did not stop (None: not joined yet, or not asked).
        self._predecessor_live: bool | None = None
        #: Whether an earlier process of the name may be alive, its heartbeat live or
        #: lapsed (a pause): this process's own mark waits for its calls (`_mark`).
        self._predecessor_unproven = False
        self._process = process or this_process()
        #: When this process first joined (our clock): its own heartbeat's mark is written
        #: only once an earlier live process's calls are past (`_mark`).
        self._joined_at: float | None = None
        #: Raises IdentityTaken once the name is another process's (`check_name_by`).
        self._name_check: Callable[[], None] | None = None
        #: The session holding the name, which the renewal's write asks (`check_name_by`).
        self._name_session: Callable[[], NameSession | None] | None = None
        #: scope -> when the earlier holder's calls there are past their deadline (our
        #: clock): held, not called for before then.
        self._calls_from: dict[str, float] = {}
        self._ever_held: set[str] = set()
        #: Seconds this daemon's clock was off the store's, beyond half the grace, at the
        #: last look; None while within it (`clock_off`).
        self.aside: float | None = None
        #: How often the clock is held to the store's: as often as the renewer looks.
        self._look = min(max(lease * RENEW_SHARE / 4, 0.02), 5.0)
        self._checked_at: float | None = None
        #: When the renewals (or the rounds) began to fail since one was last written, and
        #: why: `/healthz` says so while it lasts (`renewal_failure`).
        self._failing_since: float | None = None
        self._failure = ""
        # For tests and the log.
        self.taken = 0
        self.released = 0
        self.lost = 0

    # -- what the workers ask -----------------------------------------------------------

    def may_call(self, scope: str, now: datetime) -> bool:
        """Whether a call for `scope` may start now: it is ours, and its lease ends more
        than the grace from now."""
        until = self._held.get(scope)
        if until is None or now.timestamp() >= until - self._grace:
            return False
        after = self._calls_from.get(scope)
        return after is None or now.timestamp() >= after

    def owned(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def wait_for_predecessor(self, calls: float) -> None:
        """The name's lock can end under a live holder (PostgreSQL): a scope taken while
        an earlier process of the name held it is called for only `calls` seconds after
        the take (the longest provider timeout plus the grace, its calls' deadline, plus
        the tick in which it may still start one)."""
        self._predecessor_calls = calls

    def check_name_by(
        self, check: Callable[[], None], session: Callable[[], NameSession | None] | None = None
    ) -> None:
        """The name's lock can end under a live holder (PostgreSQL): `check` (the lock's,
        raising IdentityTaken once another process took the name) is asked before each
        renewal. The leases are under the name, not the process: without it a process
        whose tick is held up kept renewing them, and calling, past the new holder's
        `wait_for_predecessor`, until that tick's own name check. `session` (the lock's
        `IdentityLock.session`): the renewal's write is made only while it holds the
        name, so a name taken between the check and the write renews nothing."""
        self._name_check = check
        self._name_session = session

    def want(self, scope: str, provider: str, mailbox: str, channel: str, now: datetime) -> None:
        """A job of `channel` from `mailbox` needs `scope` (of `provider`, where its attempt
        was made) though its channel's provider is another now: the round counts it as
        work for a horizon and, held, reads those rows too. The index says so of every row
        this release wrote (`Ledger.scopes_due`); this covers a row that does not say
        (written by a daemon of an earlier release during a rolling upgrade)."""
        with self._lock:
            self._wanted[scope] = (provider, mailbox, channel, now.timestamp())

    # -- the round ----------------------------------------------------------------------

    def balance(self, due: Iterable[DueScope], now: datetime) -> ScopeFilter:
        """One round (see the module): `due` is `Ledger.scopes_due` up to the horizon.
        The filter of the due rows this daemon works on."""
        at = now.timestamp()
        if self.disowned:
            return self._filter(_Work({}, {}))
        try:
            self._ensure()
        except Exception as exc:
            self._failed(at, exc)
            raise
        self.renew_due(now)
        if self.aside is not None:
            return self._filter(_Work({}, {}))
        work = self._work(due, at)
        with self._lock:
            for scope, after in list(self._calls_from.items()):
                if at >= after:
                    del self._calls_from[scope]
        wanted = set(work.providers)
        rows = {row.scope: row for row in self._store.leases()}
        members = set(self._store.members(at)) | {self._daemon}
        live = [row for row in rows.values() if row.lease_until > at]
        sharers = members | {row.owner for row in live}
        total = len(wanted | {row.scope for row in live})
        share = math.ceil(total / len(sharers)) if total else 0
        self._give_up_idle(wanted, at)
        mine = set(self.owned())
        free = [s for s in wanted - mine if _free(rows.get(s), self._daemon, at)]
        others = Counter(row.owner for row in live if row.owner != self._daemon)
        below = any(others[m] < share for m in sharers - {self._daemon})
        if len(mine) > share and not free and below:
            extra = sorted(mine, key=self._preference)[share:]
            self._release(extra, at)
            mine -= set(extra)
        wanted_now = sorted(free, key=self._preference)[: max(share - len(mine), 0)]
        if wanted_now:
            # Under the lock a stand-aside (and `disown`) clears the scopes with, and asked
            # again there: the renewer's thread may have found the clock off since the
            # look above, and a scope taken after that would be held and acted on by the
            # clock it found off (`_stand_aside`).
            with self._renewing:
                if self.aside is not None or self.disowned:
                    return self._filter(_Work({}, {}))
                taken = self._store.take(self._daemon, wanted_now, at, at + self._lease)
                self._inherit([row.scope for row in taken], rows, at)
                with self._lock:
                    self._held.update((row.scope, row.lease_until) for row in taken)
            self.taken += len(taken)
            if taken:
                log.info(
                    "scope%s %s: taken (lease %gs)",
                    "s" if len(taken) > 1 else "",
                    ", ".join(row.scope for row in taken),
                    self._lease,
                )
        return self._filter(work)

    def _inherit(self, taken: list[str], rows: Mapping[str, ScopeLease], at: float) -> None:
        """Of `taken`, those an earlier live process of the name held (`rows` as read
        before the take): not called for until its calls there are past their deadline,
        which counts from now, after the take, when its lease stopped being its own."""
        wait = self._predecessor_calls
        if wait is not None and self._predecessor_live:
            after = self._clock().timestamp() + wait
            for scope in taken:
                row = rows.get(scope)
                inherited = row is not None and row.owner == self._daemon and row.lease_until > at
                if inherited and scope not in self._ever_held:
                    self._calls_from.setdefault(scope, after)
                    log.warning(
                        "scope %s: held by an earlier process of this name, which may still "
                        "be calling: no call for %gs", scope, wait,
                    )  # fmt: skip
        self._ever_held.update(taken)

    def _work(self, due: Iterable[DueScope], at: float) -> _Work:
        policies = self._policies.current
        providers: dict[str, str] = {}
        mailboxes: dict[str, set[str]] = {}
        moved: dict[str, set[str]] = {}
        for channel, mailbox, attempted_on in due:
            policy = policies.get(channel)
            if policy is None or mailbox is None:
                continue  # no policy: review, no scope spent; not filled yet
            # Its next calls go where its attempt was made when that is another provider
            # than its channel's now (a reload moved the channel): that scope's work.
            name = attempted_on or policy.provider
            provider = self._providers.get(name)
            if provider is None:
                continue  # not ours
            scope = provider.scope_of(mailbox)
            providers[scope] = name
            mailboxes.setdefault(scope, set()).add(mailbox)
            if name != policy.provider:
                moved.setdefault(scope, set()).add(channel)
        with self._lock:
            for scope, (name, mailbox, channel, asked) in list(self._wanted.items()):
                if at - asked > self.horizon:
                    del self._wanted[scope]  # no job has asked for it for a horizon
                    continue
                providers[scope] = name
                mailboxes.setdefault(scope, set()).add(mailbox)
                moved.setdefault(scope, set()).add(channel)
        return _Work(providers, mailboxes, moved)

    def _filter(self, work: _Work) -> ScopeFilter:
        """The due rows of the scopes held: per provider, every mailbox when this daemon
        holds every scope of it that has work (a new mailbox is then read at once, and
        `may_call` keeps it waiting until the next round takes its scope), else the
        mailboxes of the scopes it holds."""
        policies = self._policies.current
        with self._lock:
            # A scope an earlier process of the name may still call for is read once its
            # calls are past their deadline (`_inherit`), not offered to workers before.
            held = set(self._held) - set(self._calls_from)
        groups = []
        for name in sorted({policy.provider for policy in policies.values()}):
            if name not in self._providers:
                continue
            scopes = {scope for scope, provider in work.providers.items() if provider == name}
            ours = scopes & held
            if not ours:
                continue
            channels = tuple(sorted(c for c, p in policies.items() if p.provider == name))
            if ours == scopes:
                groups.append(ScopeGroup(channels))
            else:
                mailboxes = sorted({m for scope in ours for m in work.mailboxes[scope]})
                groups.append(ScopeGroup(channels, tuple(mailboxes)))
        # The rows of a moved channel whose attempts' scope is held here: its own
        # provider's group names the channel only where this daemon holds that scope.
        # Only those attempted there (or whose row does not say): the channel's other
        # rows are its provider's scopes' work.
        for scope in sorted(held & work.moved.keys()):
            moved = tuple(sorted(work.moved[scope])), tuple(sorted(work.mailboxes[scope]))
            groups.append(ScopeGroup(*moved, attempted_on=work.providers[scope]))
        return ScopeFilter(tuple(groups), tuple(sorted(policies)))

    def _preference(self, scope: str) -> bytes:
        # Each daemon orders the scopes its own way: two taking at once mostly differ.
        return hashlib.sha256(f"{self._daemon}\n{scope}".encode()).digest()

    def _give_up_idle(self, wanted: set[str], at: float) -> None:
        """Scopes held with nothing due within the horizon for a whole lease are released
        (a store of many mailboxes keeps leases only for those with work)."""
        with self._lock:
            idle = set(self._held) - wanted
            for scope in list(self._idle_since):
                if scope not in idle:
                    del self._idle_since[scope]
            for scope in idle:
                self._idle_since.setdefault(scope, at)
            done = sorted(s for s in idle if at - self._idle_since[s] >= self._lease)
        if done:
            self._release(done, at)

    # -- holding, renewing, releasing ---------------------------------------------------

    def _ensure(self) -> None:
        if not self._ensured:
            self._store.ensure()
            self._ensured = True

    def renew_due(self, now: datetime | None = None) -> None:
        """Renew the leases and the heartbeat once a third of the lease has passed since
        they were written (the first call joins). Raises when the store cannot be
        written: the leases then end as written, and `may_call` stops in time."""
        at = (now or self._clock()).timestamp()
        # The clock at most every `_look` seconds (a store read), and at once after a jump
        # either way: not only when a renewal is due, since a clock set back makes the
        # leases look longer than they are and would put the renewal off too.
        if self._checked_at is None or abs(at - self._checked_at) >= self._look:
            self._checked_at = at
            if self._stand_aside(self.clock_off()):
                return
        elif self.aside is not None:
            return
        if self._renewed_at is not None and at < self._renewed_at + self._lease * RENEW_SHARE:
            return
        if self._name_check is not None and not self.disowned:
            # Outside `_renewing`: the check's own handling of a lost name disowns too.
            try:
                self._name_check()
            except IdentityTaken:
                self.disown()
                return
            except Exception as exc:
                self._failed(at, exc)
                raise
        with self._renewing:
            if self.disowned or self.aside is not None:
                return
            if self._renewed_at is not None and at < self._renewed_at + self._lease * RENEW_SHARE:
                return
            until = at + self._lease
            with self._lock:
                scopes = sorted(self._held)
            try:
                self._ensure()
                if self._predecessor_live is None and self._predecessor_calls is not None:
                    # Before this process's first beat writes over the name's row.
                    self._judge_predecessor(at)
                if self._joined_at is None:
                    self._joined_at = at
                held_by = self._held_by()
                self._store.beat(self._daemon, until, self._mark(at), held_by)
                renewed = self._store.renew(self._daemon, scopes, until, held_by)
            except Exception as exc:
                self._failed(at, exc)
                raise
            self._failing_since = None
            kept = {row.scope: row.lease_until for row in renewed}
            with self._lock:
                for scope in scopes:
                    if scope not in self._held:
                        continue  # released meanwhile
                    if scope in kept:
                        self._held[scope] = kept[scope]
                    else:
                        del self._held[scope]
                        self.lost += 1
                        log.warning("scope %s: lease lost (taken by another daemon)", scope)
            self._renewed_at = at
            # Rows whose lease ended a lease ago are free whether or not they are there.
            self._store.forget(at - self._lease)

    def predecessor_gone(self) -> bool:
        """At start-up, before this process's first beat writes over the name's row:
        whether the heartbeat names a process provably gone (`process_mark.py`), so that
        its claims are not waited for either (`Engine.predecessor_gone`). The join judges
        the scopes by the same read."""
        self._ensure()
        return self._judge_predecessor(self._clock().timestamp()) == "gone"

    def _judge_predecessor(self, at: float) -> str:
        found = self._predecessor(at)
        if self._predecessor_calls is not None:
            self._predecessor_live = found == "may call"
            self._predecessor_unproven = found in ("may call", "lapsed")
        return found

    def _predecessor(self, at: float) -> Literal["none", "gone", "lapsed", "may call"]:
        """Whether the name's earlier process may still be calling: its heartbeat is live
        (it did not stop) and does not name a process provably gone (`process_mark.py`):
        one on another host, one alive, or a row that names none (an earlier release's,
        or one whose own predecessor's calls may still run) may. "lapsed": a heartbeat
        not renewed for a lease, whose scopes are taken at once as before, though its
        process may be alive (paused)."""
        beat = self._store.heartbeat(self._daemon)
        if beat is None:
            return "none"
        mark = None if beat.process is None else read_mark(beat.process)
        if mark is None or not gone(mark):
            return "lapsed" if beat.seen_until <= at else "may call"
        log.info(
            "daemon.name %r: its earlier process (%s) is gone: its claims and the name's "
            "scopes are taken at once", self._daemon, mark.describe(),
        )  # fmt: skip
        return "gone"

    def _mark(self, at: float) -> str | None:
        """The mark this heartbeat carries: none while an earlier process of the name
        may still be calling (`wait_for_predecessor`), so that a process which takes the
        name after this one dies waits for that one's calls too."""
        if self._process is None:
            return None
        if self._predecessor_unproven and self._predecessor_calls is not None:
            joined = self._joined_at if self._joined_at is not None else at
            if at < joined + self._predecessor_calls:
                return None
        return self._process.text()

    def _failed(self, at: float, exc: Exception) -> None:
        if self._failing_since is None:
            self._failing_since = at
        self._failure = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]

    def renewal_failure(self, now: datetime | None = None) -> str | None:
        """Why this daemon could not write its leases and heartbeat for a third of a lease
        since the first failure (the next chance missed too), else None. Its scopes' calls
        stop in time by themselves (`may_call`), so it sends nothing while the store says
        nothing of it: `/healthz` reports it."""
        since = self._failing_since
        if since is None or self.disowned:
            return None
        failing = (now or self._clock()).timestamp() - since
        if failing < self._lease * RENEW_SHARE:
            return None
        return f"scope leases not renewed for {failing:.0f}s: {self._failure}"

    def clock_failure(self) -> tuple[float, str] | None:
        """While this daemon stands aside for its clock (`aside`): how far off it was at
        the last look (seconds, positive: ahead) and why it acts on nothing, for
        `/healthz`; else None. Its log says so once, when it stands aside."""
        off = self.aside
        if off is None or self.disowned:
            return None
        return off, (
            f"clock {off:+.1f}s off the store's, more than half of daemon.deadline_grace "
            f"({self._grace / 2:g}s): acting on no scope and no job until it is back "
            "(check NTP)"
        )

    def clock_off(self) -> float | None:
        """How far this daemon's clock is off the store's (seconds, positive: ahead) when
        that is more than half the grace beyond the time the read took, else None. Half:
        two daemons each within it of the store are within the grace of each other."""
        before = self._clock().timestamp()
        try:
            store = self._store.store_time()
        except Exception:  # the store is away: the renewal, when due, says so
            return self.aside
        after = self._clock().timestamp()
        if store is None:
            return None
        margin = self._grace / 2
        if store < before - margin:
            return before - store
        if store > after + margin:
            return after - store
        return None

    def _stand_aside(self, off: float | None) -> bool:
        """Act on `clock_off`'s answer: stand aside while it is off (True), come back
        when it is not. Aside, nothing is written with the clock that is off: the leases
        end as last written, and only the heartbeat is removed, so that the others'
        shares no longer count this daemon."""
        if off is None and self.aside is None:
            return False
        with self._renewing:
            if off is None:
                if self.aside is not None:
                    log.warning("clock: back within %gs of the store's; sharing the scopes "
                                "again", self._grace / 2)  # fmt: skip
                    self.aside = None
                    self._renewed_at = None  # the next renewal joins again
                return False
            if self.aside is None:
                log.error(
                    "clock: %+.1fs off the store's; daemons sharing a store need their "
                    "clocks within daemon.deadline_grace (%gs) of each other: acting on no "
                    "scope and no job until it is back within %gs (check NTP)",
                    off, self._grace, self._grace / 2,
                )  # fmt: skip
                with self._lock:
                    self._held.clear()
                    self._idle_since.clear()
                if not self.disowned:
                    self._store.leave(self._daemon, self._held_by())
            self.aside = off
            return True

    def _release(self, scopes: list[str], at: float) -> None:
        """Stop acting on `scopes` now and let another daemon take them once the grace
        has passed (what a call made just before may still need); this daemon may take
        them back before. Not while a renewal runs: it would extend them again."""
        with self._renewing:
            with self._lock:
                # Only those still held: a stand-aside (or `disown`) since they were
                # chosen dropped the others, whose leases end as last written; released,
                # by the clock it found off, they could run far past that end.
                scopes = [scope for scope in scopes if scope in self._held]
                for scope in scopes:
                    self._held.pop(scope, None)
                    self._idle_since.pop(scope, None)
            if not scopes:
                return
            # The grace counts from now, when `may_call` stopped saying yes, not from the
            # round's start: the round's store reads may have taken a while, and a call
            # that asked just before needs the whole grace.
            until = max(at, self._clock().timestamp()) + self._grace
            self._store.release(self._daemon, scopes, until, self._held_by())
        self.released += len(scopes)
        log.info("scope%s %s: released", "s" if len(scopes) > 1 else "", ", ".join(scopes))

    # -- the renewer thread of a running daemon ---------------------------------------

    def start(self) -> None:
        """Renew on a thread of its own, so that a tick held up by the store does not let
        the leases lapse."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="scope-renewer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._look):
            try:
                self.renew_due()
            except Exception as exc:
                log.warning("scope leases not renewed (%s: %s)", type(exc).__name__, exc)

    def _held_by(self) -> NameSession | None:
        """The session holding the name, that each write under it asks of the server (the
        renewal's, the releases, the stop's leave): none where the lock ends only with
        the process, or no name is held."""
        return None if self._name_session is None else self._name_session()

    def disown(self) -> None:
        """This daemon's name was taken by another process (the store dropped the lock
        that held it, `Ledger.hold_identity`): the rows under the name are that process's
        now, and it may have taken back the scopes as its own. From now on this daemon
        acts on no scope and writes nothing under the name: no round, no renewal, and no
        release or leave when it stops, which would end the other process's leases a
        grace from then while that process, by its own last write, still acts on them
        (another daemon would take them meanwhile)."""
        self._stop.set()  # the renewer thread ends at its next look
        with self._renewing, self._lock:
            self.disowned = True
            self._held.clear()
            self._idle_since.clear()

    def close(self) -> None:
        """A stopping daemon, its calls done: every scope released (another daemon takes
        them once the grace has passed) and the heartbeat removed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._renewed_at is None or self.disowned:
            return  # never joined, or the name (and its rows) went to another process
        try:
            self._release(self.owned(), self._clock().timestamp())
            # Only while this process holds the name, as the releases: one that took it
            # meanwhile (a restart ended this one's session) keeps its heartbeat.
            self._store.leave(self._daemon, self._held_by())
        except Exception as exc:
            log.warning("scope leases not released (%s: %s)", type(exc).__name__, exc)


class OurScopes:
    """The scopes one engine works for, as its tick's last round found them: what its due
    reads keep (`filter`) and what a step asks before it calls (`may_call`). Every scope
    when the engine shares the store with no daemon (`owners` None). The tick sets
    `filter` each round; the tick and the workers read it."""

    def __init__(
        self,
        owners: ScopeOwners | None,
        providers: Mapping[str, Provider],
        mailbox_of: Callable[[str], str],
    ) -> None:
        """`mailbox_of`: the index's mailbox of a From (`Ledger.mailbox_of`)."""
        self.owners = owners
        self._providers = providers
        self._mailbox_of = mailbox_of
        #: The due rows of the scopes owned, from the last round (`ScopeOwners.balance`).
        self.filter: ScopeFilter | None = None

    def none_yet(self) -> bool:
        """Sharing the scopes, and no round has told which are ours: no due row is."""
        return self.owners is not None and self.filter is None

    def may_call(
        self,
        policy: ChannelPolicy | None,
        from_addr: str,
        now: datetime,
        provider: str | None = None,
    ) -> bool:
        """Whether this daemon may call for a job of `policy` from `from_addr` now: it owns
        the job's quota scope, named as the round names it (from the index's mailbox).
        `provider`: the one the call is made on when not the policy's (an attempt made on
        a provider the channel has left since: `runner.provider_for`)."""
        if self.owners is None or policy is None:
            return True  # no policy: no call, the job goes to review
        name = provider or policy.provider
        found = self._providers.get(name)
        if found is None:
            return True  # no call: the dispatch reviews it or reports the configuration
        mailbox = self._mailbox_of(from_addr)
        scope = found.scope_of(mailbox)
        if name != policy.provider:
            # Whatever the answer: held, it stays wanted while such jobs ask for it.
            self.owners.want(scope, name, mailbox, policy.channel, now)
        return self.owners.may_call(scope, now)


def _free(row: ScopeLease | None, daemon: str, at: float) -> bool:
    return row is None or row.owner == daemon or row.lease_until <= at


def horizon(lease: float, timeouts: Iterable[float]) -> float:
    """How far ahead a due job makes its scope wanted: a lease, plus the longest call."""
    return lease + max(timeouts, default=30.0)
