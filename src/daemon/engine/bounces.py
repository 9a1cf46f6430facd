"""Bounces: delivery reports about confirmed jobs, found in their mailboxes and recorded
on them (docs/how-it-works.md "Bounces", docs/architecture.md "Bounces on the job").

A channel with `watch_bounces` has its confirmed jobs watched for that long (the job's
`WatchingBounces` event; the index keeps the watched jobs' mailboxes, each with the
provider its jobs were sent on, where their reports are). The work is per
mailbox, not per job: once per `daemon.bounce_interval`, one read of each mailbox with
watched jobs lists the candidate reports received within the longest window of its
channels (`Provider.read_reports`) and reads the ones not read before; each is parsed as
hostile input (`ledger/delivery_reports.py`) and attributed only by its original
Message-ID, exact and ours, to a job of that very mailbox, which records it once
(`SendJob.record_bounce`, saved with the version it was read at). So a daemon watching
thousands of jobs makes one read per mailbox per interval, and a job costs nothing until a
report names it.

A read runs on a check worker, only while its mailbox has no send waiting in the queue, its
circuit admits it, and (daemons sharing the store) this daemon owns the mailbox's quota scope
(`owners.py`: the watched mailboxes count as work of their scopes, so each is read by its
owner alone, not once per daemon) (a failure counts toward that circuit as a search's does), so a
bounce read never delays a due send. What was read is remembered in memory (the ids, and
what each turned out to be) for as long as the mailbox lists it; after a restart the
window is read again and a report already recorded is refused by the job itself. A report
about a job that is not confirmed yet (its outcome still unknown) waits in memory and is
tried again at each read until the job is watched or the report leaves the window.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from daemon.engine.circuit import CHECK, Admit, Circuits
from daemon.engine.clock import Clock
from daemon.engine.commit import GroupCommit
from daemon.engine.observer import EngineObserver, notify
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.report import Counter
from daemon.engine.work import Work, provider_for
from daemon.providers.base import FoundReport, Provider, ProviderError
from ledger.application import ConcurrentUpdate, Ledger
from ledger.delivery_reports import (
    MAX_REPORT_BYTES,
    DeliveryReport,
    ReportRefusal,
    ReportRefused,
    read_report,
)
from ledger.display import quoted
from ledger.exceptions import known as known_value
from ledger.job import BounceRefused, SendJob, bounce_recipients
from ledger.message import message_date
from ledger.stores.index import IndexRow, WatchHold
from ledger.vocabulary import JobState
from policies import decisions
from policies.decisions import retry_after_wait
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")

#: Reports read (fetched) in one read of one mailbox; the rest wait for the next one.
READ_LIMIT = 50
#: Saves of one report tried when other writers keep moving its job.
SAVE_TRIES = 3
#: The outcome of a report recorded on its job (the others are `ReportRefusal` values).
RECORDED = "recorded"
#: The only top-level type a report has (RFC 6522).
REPORT_TYPE = "multipart/report"
#: A report whose watched job other writers kept moving through every save (`_attribute`).
_MOVING = "moving"
#: Bounce intervals after a watch's end (and the provider clock's margin) by which it ends
#: even though no read of its mailbox went through since (`BounceWatch.unread_bound`): a
#: mailbox never read again (revoked credentials, a circuit that stays open, sends always
#: queued) must not keep its jobs from retention. Counted from the end, or from when this
#: process first wanted the mailbox read if later (`_Mailbox.wanted_since`).
UNREAD_INTERVALS = 60
#: `BounceWatchEnded.reason` of a watch ended by that bound.
UNREAD = "unread"
#: States in which a job named by a report may still become watched: the report waits.
_NOT_YET = frozenset({JobState.REQUESTED, JobState.ATTEMPTED, JobState.UNKNOWN})


@dataclass
class _Seen:
    """What a report read earlier turned out to be; `report` set while it still waits
    for its job to be watched."""

    outcome: str
    report: DeliveryReport | None = None
    received_at: datetime | None = None  # by the provider's clock (`FoundReport`)


@dataclass
class MailboxRead:
    """One mailbox's read: its provider view, the channels watched in it, how far back."""

    scope: str
    provider: Provider
    channels: frozenset[str]
    lookback: float  # seconds: the longest `watch_bounces` of its channels
    mailbox: str  # the index's `mailbox` of its From (`Ledger.mailbox_of`)
    address: str  # its From, which names the quota scope daemons lease it by
    policy: ChannelPolicy  # of its first channel
    # The soonest end of its watches (None: not known): one long past (reads held by
    # queued sends, an outage) started more than `lookback` ago.
    first_until: datetime | None = None


@dataclass
class _Mailbox:
    seen: dict[str, _Seen] = field(default_factory=dict)
    next_read: datetime | None = None
    # When the read under way began (its first part: a read that stopped goes on at the
    # next one), and when the latest one that went through the whole window began: every
    # report the mailbox had received by then (by the provider's clock, less `skew`) was
    # listed and attributed (`EndWatch` waits for it).
    started: datetime | None = None
    read_from: datetime | None = None
    # Since when this process has wanted it read (due, its scope ours), held or not: the
    # bound on a watch's wait for a read counts from then (`unread_bound`), so a restart
    # or a handover reads the mailbox before its watches end unread.
    wanted_since: datetime | None = None
    # The last time it was wanted: a longer gap than a tick can explain (the daemon was
    # paused, its ticks failed while the store was down, its clock stepped on) starts the
    # wait anew, so the reads missed meanwhile are not taken for a mailbox nobody can read.
    wanted_at: datetime | None = None
    # The watches past their end that wait for a read, as loaded (`read_through`): by
    # job key, the version loaded, the watch's end and when anything else of the job is
    # due (its verification, its tidy; None: nothing). The index row's `due_at` is the
    # earliest of the three, so once the end has passed it hides the others: without
    # this, a verification due after the end waited for the watch.
    held: dict[str, _Held] = field(default_factory=dict)
    # When a read last made progress (listed more of the window, or read reports not read
    # before) without going through it, and how much it had listed then: a mailbox read
    # on over many reads (more reports than a read takes, a quota shared with the sends)
    # keeps its watches for as long as its reads get on (`_unread_past`).
    progressed: datetime | None = None
    listed: int = 0


@dataclass(frozen=True)
class _Held:
    version: int
    until: datetime
    other_due: datetime | None


class BounceWatch:
    """The reads of every watched mailbox, handed to the check workers by the tick."""

    def __init__(
        self,
        ledger: Ledger,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        clock: Clock,
        circuits: Circuits,
        commits: GroupCommit,
        observer: EngineObserver,
        *,
        interval: float,
        sends_waiting: Callable[[str], int],
        may_read: Callable[[ChannelPolicy | None, str, datetime, str | None], bool] | None = None,
        skew: float = 0.0,
    ) -> None:
        """`may_read(policy, from_addr, now, provider)`: whether this daemon may call now
        for the quota scope of that From on that provider (it owns it:
        `OurScopes.may_call`, the one place a From's scope is named); None: it works for
        every scope. `skew`: how far the provider's
        clock may be behind ours (`daemon.deadline_grace`): a report received more than
        that before its job's first attempt is refused (`SendJob.record_bounce`)."""
        self._may_read = may_read
        self._skew = skew
        self._ledger = ledger
        self._policies = policies
        self._providers = providers
        self._clock = clock
        self._circuits = circuits
        self._commits = commits
        self._observer = observer
        self.interval = interval
        self._sends_waiting = sends_waiting
        self._lock = threading.Lock()
        self._mailboxes: dict[str, _Mailbox] = {}
        self._reads: list[MailboxRead] = []
        self._reads_at: datetime | None = None
        self._reads_policies: object = None  # the policy set `_reads` was made with
        # (channel, mailbox digest) -> a From of that mailbox and the provider its jobs
        # were sent on (None: not known, the channel's)
        self._addresses: dict[tuple[str, str], tuple[str, str | None]] = {}
        # (channel, mailbox digest) -> the scope it is read in, and how many jobs are
        # watched there (from the last `_watched`)
        self._read_in: dict[tuple[str, str], tuple[str, int]] = {}

    @property
    def unread_bound(self) -> float:
        """Seconds after a watch's end by which it ends even if its mailbox was not read
        through since: the clock margin and `UNREAD_INTERVALS` intervals."""
        return self._skew + UNREAD_INTERVALS * self.interval

    def _unread_past(self, scope: str, until: datetime, now: datetime) -> bool:
        """(Under the lock.) The watch of the scope that ends at `until` waited for a read
        as long as it may: `unread_bound` from its end or, if later, from when this
        process first wanted the mailbox read (never: a scope not ours waits)."""
        mailbox = self._mailboxes.get(scope)
        since = None if mailbox is None else mailbox.wanted_since
        if mailbox is None or since is None or self._unwatched(mailbox, now):
            return False  # not wanted read by this process, or not looked at for a while
        latest = max(until, since, mailbox.progressed or since)
        return now >= latest + timedelta(seconds=self.unread_bound)

    def _unwatched(self, mailbox: _Mailbox, now: datetime) -> bool:
        """Whether this process stopped looking at the mailbox for longer than the clock
        margin and two intervals since it last wanted it read."""
        gap = timedelta(seconds=self._skew + 2 * self.interval)
        return mailbox.wanted_at is not None and now - mailbox.wanted_at > gap

    def due(self) -> list[MailboxRead]:
        """The mailbox reads that may run now: due, nothing of theirs waiting to be sent,
        their circuit not open, their scope ours."""
        now = self._clock()
        reads = self._current(now)
        with self._lock:
            mailboxes = {r.scope: self._mailboxes.setdefault(r.scope, _Mailbox()) for r in reads}
        ours = {r.scope for r in reads if self._ours(r, now)}
        with self._lock:
            for scope, mailbox in mailboxes.items():
                if scope not in ours:
                    mailbox.wanted_since = None  # another daemon's: its clock starts anew
                elif mailbox.wanted_since is None or self._unwatched(mailbox, now):
                    mailbox.wanted_since = now
                mailbox.wanted_at = now
        return [
            r
            for r in reads
            if _due(mailboxes[r.scope].next_read, now)
            and self._sends_waiting(r.scope) == 0
            and not self._circuits.holds(r.scope, now, CHECK)
            and r.scope in ours
        ]

    def wanted(self) -> list[tuple[str, str]]:
        """The (channel, mailbox) pairs with watched jobs: work for their quota scopes
        when daemons share them (`owners.py`), as due jobs are."""
        return [(c, r.mailbox) for r in self._current(self._clock()) for c in sorted(r.channels)]

    def _current(self, now: datetime) -> list[MailboxRead]:
        """The watched mailboxes, read from the index once per interval (the index's
        partial range: what is watched, not the history), and at once after a reload."""
        policies = self._policies.current
        with self._lock:
            stale = self._reads_at is None or now >= self._reads_at
            stale = stale or policies is not self._reads_policies
        if stale:
            reads = self._watched()
            scopes = {r.scope for r in reads}
            with self._lock:
                dropped = [r for r in self._reads if r.scope not in scopes]
                self._reads = reads
                self._reads_at = now + timedelta(seconds=self.interval)
                self._reads_policies = policies
                for gone in self._mailboxes.keys() - scopes:
                    del self._mailboxes[gone]  # nothing watched there any more
            for read in dropped:
                self._forget(read)
        with self._lock:
            return list(self._reads)

    def _forget(self, read: MailboxRead) -> None:
        """A mailbox read no more (nothing watched there, its channel removed or no
        longer watching): what its provider kept of a read that stopped is dropped, as
        this process dropped what it had read there; were it watched again, its reads
        would start afresh, and a report recorded already is refused by its job."""
        try:
            read.provider.forget_report_reads()
        except Exception as exc:  # what it keeps is memory: the tick goes on regardless
            log.warning("%s: dropping its kept report read failed: %s", read.scope, exc)

    def _ours(self, read: MailboxRead, now: datetime) -> bool:
        return self._may_read is None or self._may_read(
            read.policy, read.address, now, read.provider.name
        )

    def _watched(self) -> list[MailboxRead]:
        """Each watched (channel, mailbox) mapped to the view of the provider its jobs
        were sent on (the index's mailbox digest names it: a channel moved to another
        provider by a reload has its earlier jobs' reports in the first one's mailbox,
        `work.provider_for`) and merged by scope: channels sharing a mailbox share its
        read."""
        policies = self._policies.current
        merged: dict[str, MailboxRead] = {}
        scope_of: dict[tuple[str, str], tuple[str, int]] = {}
        pairs: set[tuple[str, str]] = set()
        for watched in self._ledger.watched():
            pairs.add((watched.channel, watched.mailbox))
            policy = policies.get(watched.channel)
            if policy is None or policy.watch_bounces is None:
                continue  # its watches end at their time; nothing is read for them
            named = self._address(watched.channel, watched.mailbox, watched.example_key)
            if named is None:
                continue
            address, sent_on = named
            provider = self._providers.get(sent_on or policy.provider)
            if provider is None:
                continue
            view = provider.for_job(address, None)
            if not view.reads_reports:
                continue
            scope = view.scope()
            scope_of[(watched.channel, watched.mailbox)] = (scope, watched.jobs)
            known = merged.get(scope)
            first = (
                None
                if watched.first_until is None
                else datetime.fromtimestamp(watched.first_until, UTC)
            )
            if known is None:
                merged[scope] = MailboxRead(
                    scope,
                    view,
                    frozenset({watched.channel}),
                    policy.watch_bounces,
                    self._ledger.mailbox_of(address),
                    address,
                    policy,
                    first,
                )
            else:
                known.channels |= {watched.channel}
                known.lookback = max(known.lookback, policy.watch_bounces)
                if first is not None:
                    known.first_until = (
                        first if known.first_until is None else min(known.first_until, first)
                    )
        with self._lock:
            self._read_in = scope_of
            # Only the pairs watched now: the others' Froms would be kept for ever.
            self._addresses = {k: v for k, v in self._addresses.items() if k in pairs}
        return sorted(merged.values(), key=lambda r: r.scope)

    def _address(
        self, channel: str, digest: str, example_key: str
    ) -> tuple[str, str | None] | None:
        """The From of a watched mailbox and the provider its jobs were sent on, known by
        its digest (the index keeps no address): read from one of its jobs once, then
        remembered."""
        with self._lock:
            known = self._addresses.get((channel, digest))
        if known is not None:
            return known
        job = self._ledger.find_job(example_key)
        if job is None:
            return None
        found = (job.from_addr, job.last_provider)
        with self._lock:
            self._addresses[(channel, digest)] = found
        return found

    def read(self, read: MailboxRead, counter: Counter) -> None:
        """One read of one mailbox, and every report it found attributed (a check
        worker's task)."""
        now = self._clock()
        if not self._ours(read, now):
            return  # its scope went to another daemon since it was handed out
        with self._lock:
            mailbox = self._mailboxes.setdefault(read.scope, _Mailbox())
            known = set(mailbox.seen)
            mailbox.next_read = now + timedelta(seconds=self.interval)
            if mailbox.started is None:
                mailbox.started = now
        admit = self._circuits.admit(read.scope, now, CHECK)
        if admit is Admit.HOLD:
            return
        since = now - timedelta(seconds=read.lookback)
        if read.first_until is not None:
            # A watch whose end passed unread (`read_through`) started before that.
            since = min(since, read.first_until - timedelta(seconds=read.lookback))
        # A read makes many calls (pages, then each report), which together may outlast
        # the scope's lease: each asks whether the scope is still ours.
        go_on = None if self._may_read is None else lambda: self._ours(read, self._clock())
        try:
            with self._circuits.call(read.scope, self._clock):
                result = read.provider.read_reports(
                    since,
                    known=known,
                    max_bytes=MAX_REPORT_BYTES,
                    limit=READ_LIMIT,
                    may_go_on=go_on,
                )
        except ProviderError as exc:
            wait = max(retry_after_wait(exc.retry_after), self.interval)
            with self._lock:
                mailbox.next_read = self._clock() + timedelta(seconds=wait)
                if exc.progressed:
                    # What it listed or read is kept for the next read: it got on now, not
                    # at the next read that answers (`_unread_past`).
                    mailbox.progressed = self._clock()
            log.warning("%s: reading delivery reports failed (%s)", read.scope, quoted(exc.reason))
            counter.bump("errors")
            return
        except BaseException:
            if admit is Admit.PROBE:
                self._circuits.probe_returned(read.scope)
            raise
        listed = set(result.listed)
        with self._lock:
            if result.complete:
                # A report no longer listed left the window (or the mailbox): forget it.
                mailbox.seen = {k: v for k, v in mailbox.seen.items() if k in listed}
                mailbox.listed = 0
            else:
                mailbox.next_read = self._clock()  # the rest at the next tick
                # A listing kept between reads grows as its pages are read.
                if result.found or len(listed) > mailbox.listed:
                    mailbox.progressed = self._clock()
                mailbox.listed = len(listed)
        for found in result.found:
            seen = self._parse(found)
            with self._lock:
                mailbox.seen[found.provider_id] = seen
        with self._lock:
            waiting = [(k, v) for k, v in mailbox.seen.items() if v.report is not None]
        stalled = False
        # Message-IDs whose job is not watched yet, as this read found: the other reports
        # naming one wait without another look-up. Anyone who guessed the key of a job not
        # sent yet can mail any number of reports of it, each read at its turn and waiting
        # for as long as the window lasts; each looked up at every read cost the store
        # one read per report per interval.
        not_yet: set[str] = set()
        for provider_id, seen in waiting:
            waiting_report = known_value(seen.report, "a report waits for its job once read")
            if waiting_report.original_message_id in not_yet:
                continue
            outcome = self._attribute(read, provider_id, seen, counter)
            if outcome is None:
                not_yet.add(waiting_report.original_message_id)
            if outcome is _MOVING:
                stalled = True  # its job is watched: its watch waits for the next read
            elif outcome is not None:
                with self._lock:
                    mailbox.seen[provider_id] = _Seen(outcome)
        if result.complete and not stalled:
            with self._lock:
                mailbox.read_from, mailbox.started = mailbox.started, None
                held = mailbox.held.items()
                mailbox.held = {k: v for k, v in held if not self._read_past(read.scope, v.until)}

    def ends_waiting(self, now: datetime) -> int:
        """At most how many watches are past their end but wait for a read of their
        mailbox (`read_through`): the tick reads that many more due rows, so they never
        starve the confirmed jobs behind them (their verification, their tidy)."""
        reads = self._current(now)
        with self._lock:
            late = {
                r.scope
                for r in reads
                if r.first_until is not None
                and r.first_until <= now
                and not self._read_past(r.scope, r.first_until)
            }
            return sum(n for scope, n in self._read_in.values() if scope in late)

    def holds(self, now: datetime) -> list[WatchHold]:
        """The watches past their end that wait for a read of their mailbox, as the
        index can tell them from their rows (`WatchHold`; `waits_for_read` says the same
        of one row): per watched channel and scope, those ending after the scope's cut."""
        self._current(now)  # what is watched, read again after a reload
        groups: dict[tuple[str, str], list[str]] = {}
        with self._lock:
            for (channel, digest), (scope, _jobs) in sorted(self._read_in.items()):
                groups.setdefault((channel, scope), []).append(digest)
            return [
                WatchHold(channel, tuple(digests), self._cut(scope, now))
                for (channel, scope), digests in groups.items()
            ]

    def _cut(self, scope: str, now: datetime) -> float | None:
        """(Under the lock.) The latest end, epoch seconds, of the scope's watches that
        may end now (`_read_past` or `_unread_past` holds for every end at or before it);
        None: none may."""
        mailbox = self._mailboxes.get(scope)
        if mailbox is None:
            return None
        cuts: list[datetime] = []
        if mailbox.read_from is not None:
            cuts.append(mailbox.read_from - timedelta(seconds=self._skew))
        since = mailbox.wanted_since
        if since is not None and not self._unwatched(mailbox, now):
            bound = timedelta(seconds=self.unread_bound)
            if now >= max(since, mailbox.progressed or since) + bound:
                cuts.append(now - bound)
        return max(cuts).timestamp() if cuts else None

    def waits_for_read(self, row: IndexRow) -> bool:
        """Whether a due row is a watch's end still waiting for a read of its mailbox,
        with nothing else of the job due now: not worth loading. Its `due_at` is the
        earliest of the end, the verification and the tidy; its `other_due_at` says when
        the other two are. A row of an earlier release without it is loaded once, and
        `read_through` notes what else is due when."""
        if row.watch_until is None or row.watch_mailbox is None or row.due_at is None:
            return False
        if row.due_at < row.watch_until:
            return False  # its verification or its tidy is due first
        now = self._clock()
        with self._lock:
            known = self._read_in.get((row.channel, row.watch_mailbox))
            if known is None:
                return False  # not read: it ends at its time
            until = datetime.fromtimestamp(row.watch_until, UTC)
            if self._unread_past(known[0], until, now):
                return False  # it ends unread (`unread_bound`): load it
            if self._read_past(known[0], until):
                return False
            if row.other_due_at is not None:
                return row.other_due_at > now.timestamp()
            mailbox = self._mailboxes.get(known[0])
            held = None if mailbox is None else mailbox.held.get(row.key)
            if held is None or held.version != row.version:
                return False  # not loaded as it is now: once, to learn what else is due
            return held.other_due is None or held.other_due > now

    def _read_past(self, scope: str, until: datetime) -> bool:
        """(Under the lock.) A read of the scope begun at or after `until` and the
        provider clock's margin went through the whole window."""
        mailbox = self._mailboxes.get(scope)
        read_from = None if mailbox is None else mailbox.read_from
        return read_from is not None and read_from >= until + timedelta(seconds=self._skew)

    def read_through(self, job: SendJob) -> bool:
        """Whether the job's watch may end: a read of its mailbox begun after the watch's
        end (and the provider clock's margin) went through the whole window, so a report
        the mailbox received before that end was attributed while the job was still
        watched. A report read only after `BounceWatchEnded` would be refused
        (`not-watched`), and the end is due at `watch_until` whatever was read: after a
        read outage, or for a mailbox whose queued sends keep holding its reads, the
        last reports would be lost. A mailbox nothing reads (its channel no longer
        watches, its provider reads no reports) ends at its time; one not read through
        for `unread_bound` after the end ends then (`unread`)."""
        if job.watch_until is None:
            return True
        scope = self._read_scope(job)
        if scope is None:
            return True
        with self._lock:
            if self._read_past(scope, job.watch_until) or self._unread_past(
                scope, job.watch_until, self._clock()
            ):
                return True
            mailbox = self._mailboxes.get(scope)
            if mailbox is not None:
                # Held: the tick leaves its row unloaded until something else is due.
                other = job.due_besides_watch
                mailbox.held[job.key] = _Held(job.version, job.watch_until, other)
            return False

    def unread(self, job: SendJob, now: datetime) -> str | None:
        """Whether the job's watch ends without a read through its mailbox after its end:
        None if one went through; else the mailbox's scope when the watch ends by
        `unread_bound` (it is read for reports, yet no read went through), or "" when
        nothing reads it any more (its channel no longer watches, its provider is gone or
        reads no reports), a choice of the configuration, not an outage."""
        until = job.watch_until
        if until is None:
            return None
        scope = self._read_scope(job)
        if scope is None:
            return ""
        with self._lock:
            if self._read_past(scope, until) or not self._unread_past(scope, until, now):
                return None
            return scope

    def _read_scope(self, job: SendJob) -> str | None:
        """The scope in which the job's mailbox is read for reports; None: it is not (its
        channel no longer watches, its provider is gone or reads no reports)."""
        policy = self._policies.current.get(job.channel)
        if policy is None or policy.watch_bounces is None:
            return None
        name = provider_for(job, policy)
        provider = None if name is None else self._providers.get(name)
        if provider is None:
            return None
        view = provider.for_job(job.from_addr, None)
        return view.scope() if view.reads_reports else None

    def _parse(self, found: FoundReport) -> _Seen:
        if found.raw is None and found.content_type not in ("", REPORT_TYPE):
            parsed: DeliveryReport | ReportRefused = ReportRefused(
                ReportRefusal.NOT_A_REPORT, found.content_type
            )
        elif found.raw is None:
            parsed = ReportRefused(ReportRefusal.TOO_LARGE, f"{found.size} bytes")
        else:
            domains = {p.message_id_domain for p in self._policies.current.values()}
            # A job sent before its channel's message_id_domain changed keeps its
            # Message-ID: the index says it is a job's (attributed below as any other).
            parsed = read_report(found.raw, domains=domains, known=self._is_a_job)
        if isinstance(parsed, ReportRefused):
            self._refused(found.provider_id, parsed.reason, parsed.detail)
            return _Seen(parsed.reason)
        return _Seen("waiting", parsed, found.received_at)

    def _is_a_job(self, message_id: str) -> bool:
        return self._ledger.row_by_message_id(message_id) is not None

    def _attribute(
        self, read: MailboxRead, provider_id: str, seen: _Seen, counter: Counter
    ) -> str | None:
        """Record the report on the job it names, if that job is a watched one of this
        mailbox. The outcome, or None: the job is not watched yet (asked again later), or
        `_MOVING`: it is, but other writers kept moving it (tried again at the next read,
        which its watch's end waits for)."""
        report = known_value(seen.report, "a report is recorded once read")
        row = self._ledger.row_by_message_id(report.original_message_id)
        if row is None:
            return self._refused(provider_id, ReportRefusal.UNKNOWN_JOB, report.original_message_id)
        if row.watch_mailbox is None:
            if JobState(row.state) in _NOT_YET:
                return None
            return self._refused(provider_id, ReportRefusal.NOT_WATCHED, row.key)
        for _ in range(SAVE_TRIES):
            try:
                job = self._ledger.get_job(row.key)
                if self._scope_of(job) != read.scope:
                    return self._refused(provider_id, ReportRefusal.OTHER_MAILBOX, row.key)
                self._record(job, report, provider_id, seen.received_at, read.provider)
            except BounceRefused as refused:
                return self._refused(provider_id, refused.refusal, f"{row.key}: {refused}")
            except ConcurrentUpdate:
                continue  # another writer moved the job: read it again
            counter.bump("bounced")
            notify(self._observer.bounce_report, RECORDED)
            log.info("job %s: bounce report %s recorded", row.key, provider_id)
            return RECORDED
        return _MOVING  # still moving: the next read tries again

    def _record(
        self,
        job: SendJob,
        report: DeliveryReport,
        provider_id: str,
        received_at: datetime | None,
        provider: Provider,
    ) -> None:
        policy = self._policies.current.get(job.channel)
        if policy is None:
            raise BounceRefused(job, ReportRefusal.NOT_WATCHED, "no policy for its channel")
        permanent = any(r.permanent for r in bounce_recipients(job, report))
        job.record_bounce(
            report,
            provider_message_id=provider_id,
            decision=decisions.after_bounce(policy, permanent=permanent),
            at=self._clock(),
            received_at=received_at,
            skew=self._skew,
            date=message_date(job) if provider.keeps_date else None,
        )
        events = list(job.pending_events)
        self._commits.save(job)
        notify(self._observer.saved, job, events)

    def _scope_of(self, job: SendJob) -> str | None:
        """The scope of the mailbox the job's copy was sent from: on the provider of its
        last attempt, not the one its channel moved to since."""
        name = provider_for(job, self._policies.current.get(job.channel))
        provider = None if name is None else self._providers.get(name)
        return None if provider is None else provider.for_job(job.from_addr, None).scope()

    def _refused(self, provider_id: str, refusal: ReportRefusal, detail: str) -> str:
        notify(self._observer.bounce_report, refusal.value)
        if refusal is not ReportRefusal.RECORDED_ALREADY:
            log.info(
                "delivery report %s not recorded: %s (%s)", provider_id, refusal, quoted(detail)
            )
        return refusal.value


def _due(moment: datetime | None, now: datetime) -> bool:
    return moment is None or moment <= now


class EndWatch:
    """A confirmed job whose bounce watch is over: recorded, so nothing of it is due.
    `read_through(job)`: whether its mailbox was read after the watch's end
    (`BounceWatch.read_through`); None: not asked."""

    state = JobState.CONFIRMED

    def __init__(
        self,
        clock: Clock,
        read_through: Callable[[SendJob], bool] | None = None,
        unread: Callable[[SendJob, datetime], str | None] | None = None,
    ) -> None:
        """`unread(job, now)`: not None if its watch ends without a read through its
        mailbox after its end (`BounceWatch.unread`): recorded so (`reason`), and logged
        with the scope it names (one that waited out `unread_bound`)."""
        self._clock = clock
        self._read_through = read_through
        self._unread = unread

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return (
            job.watch_until is not None
            and job.watch_until <= now
            and (self._read_through is None or self._read_through(job))
        )

    def run(self, work: Work) -> None:
        job, now = work.job, self._clock()
        until = job.watch_until
        unread = None if self._unread is None else self._unread(job, now)
        job.end_bounce_watch(at=now, reason="" if unread is None else UNREAD)
        work.save()
        if unread:
            # Reports its mailbox received near the end may never be recorded: say so.
            log.warning(
                "%s: job %s: bounce watch ended unread: the mailbox was not read through"
                " since the watch's end (%s)",
                unread,
                job.key,
                None if until is None else until.isoformat(),
            )


__all__ = ["READ_LIMIT", "RECORDED", "UNREAD", "BounceWatch", "EndWatch", "MailboxRead"]
