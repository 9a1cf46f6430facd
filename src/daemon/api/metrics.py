"""Prometheus metrics (docs/http-api.md "Metrics"): an engine observer plus gauges read at scrape.

Counters move where the engine already counts (`EngineObserver.saved` after each save,
`tick_done`, `provider_call`); the job and quota gauges are read from the store and the
providers when Prometheus scrapes, and so are the counts of what people recorded through
any door (`daemon/api/recorded_metrics.py`). Each app has its own registry, so several can live in
one process (tests).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon.api.recorded_metrics import RecordedByPeople, copies_result
from daemon.engine.circuit import OpenCircuit
from daemon.engine.report import TickReport
from daemon.providers.base import Provider
from ledger.application import Ledger
from ledger.job import SendJob
from ledger.vocabulary import OPEN_STATES, ConfirmedVia, JobState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds from a send to the first search that found it: Gmail's index lags seconds to minutes.
LAG_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass
class Sources:
    """What the scrape-time gauges read; the parts a process lacks are None."""

    ledger: Ledger
    providers: Mapping[str, Provider | None]  # quota levels: of those that have one
    unreliable: Callable[[], list[str]] | None = None
    tick_age: Callable[[], float] | None = None  # seconds since the last tick ended
    circuits: Callable[[], list[OpenCircuit]] | None = None  # the open ones
    # The configured webhooks (None: every row in the store). A webhook taken out of the
    # config keeps its row, and its failures would hold its alert up for good.
    webhooks: Sequence[str] | None = None


class Metrics:
    """The registry of one app, and the engine observer that feeds it."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.registry = CollectorRegistry()
        r = self.registry
        self.sends = Counter(
            "sendledger_sends", "Provider sends by outcome", ["provider", "outcome"], registry=r
        )
        self.searches = Counter(
            "sendledger_searches", "Mailbox searches by result", ["result"], registry=r
        )
        self.duplicates = Counter(
            "sendledger_duplicates", "Jobs found sent two or more times", registry=r
        )
        self.escalations = Counter(
            "sendledger_escalations", "Jobs sent to review, by reason", ["reason"], registry=r
        )
        # docs/providers.md "What each handle proves": what each read of a mailbox's history
        # after an unknown outcome settled (a duplicate there counts as a search's does).
        self.history_reads = Counter(
            "sendledger_history_reads", "Mailbox history reads by result", ["result"], registry=r
        )
        # docs/how-it-works.md "Bounces": reports recorded on jobs, and every report read
        # by what became of it (recorded, or why not).
        self.bounces = Counter(
            "sendledger_bounces",
            "Bounces recorded on jobs, by kind; every one unverified",
            ["kind", "verified"],
            registry=r,
        )
        self.bounce_reports = Counter(
            "sendledger_bounce_reports",
            "Delivery reports read, by outcome",
            ["outcome"],
            registry=r,
        )
        # Watches ended by how: `read` (a read went through the mailbox after the end) or
        # `unread` (it did not: the wait's bound, or nothing reads the mailbox any more).
        self.watches_ended = Counter(
            "sendledger_bounce_watches_ended",
            "Bounce watches ended, by reason",
            ["reason"],
            registry=r,
        )
        self.index_lag = Histogram(
            "sendledger_index_lag_seconds",
            "From a send to the first search that found its copy",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.tick_duration = Histogram(
            "sendledger_tick_duration_seconds", "Duration of one engine tick", registry=r
        )
        self.provider_latency = Histogram(
            "sendledger_provider_call_duration_seconds",
            "Provider call latency",
            ["provider", "operation"],
            registry=r,
        )
        # docs/http-api.md "Webhooks": deliveries that got a 2xx, and attempts that did not.
        self.webhook_deliveries = Counter(
            "sendledger_webhook_deliveries",
            "Webhook deliveries answered 2xx",
            ["webhook"],
            registry=r,
        )
        self.webhook_failures = Counter(
            "sendledger_webhook_failures",
            "Webhook attempts that failed",
            ["webhook"],
            registry=r,
        )
        r.register(_StoreGauges(sources))
        # What people searched and decided through any door, the commands' included
        # (`daemon/api/recorded_metrics.py`).
        r.register(RecordedByPeople(sources.ledger))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the engine observer ---------------------------------------------------------

    def saved(self, job: SendJob, events: Sequence[object]) -> None:
        provider = job.last_provider or ""
        for event in events:
            kind = type(event).__name__
            if kind == "Confirmed":
                via = getattr(event, "via", "")
                if via == ConfirmedVia.RESPONSE:
                    self.sends.labels(provider, "confirmed").inc()
                elif via == ConfirmedVia.SEARCH:
                    self.searches.labels("hit").inc()
                    self._observe_lag(job, event)
                elif via == ConfirmedVia.HISTORY:
                    self.history_reads.labels("hit").inc()
            elif kind == "Unknown":
                self.sends.labels(provider, "unknown").inc()
            elif kind == "Rejected" and not getattr(event, "released", False):
                # A claim its daemon released with no call made is no send (`released`).
                transient = getattr(event, "transient", False)
                outcome = "rejected-transient" if transient else "rejected-permanent"
                self.sends.labels(provider, outcome).inc()
            elif kind == "SearchedMiss":
                self.searches.labels("miss").inc()
            elif kind == "HistoryMissed":
                self.history_reads.labels("miss").inc()
            elif kind == "HistoryUnusable":
                self.history_reads.labels("unusable").inc()
            elif kind == "Verified":
                # Given up without a search (no policy or provider for the channel: the
                # event's policy is `PolicyRef.missing`, no fingerprint): nothing searched.
                if getattr(event, "fingerprint", "") or getattr(event, "hits", 0):
                    self.searches.labels("hit" if getattr(event, "hits", 0) else "miss").inc()
            elif kind == "Duplicate":
                self.searches.labels("duplicate").inc()
                self.duplicates.inc()
            elif kind == "Escalated":
                self.escalations.labels(getattr(event, "reason", "")).inc()
            elif kind == "Bounced":
                permanent = getattr(event, "permanent", False)
                # No report is proved (`UNVERIFIED_SAID`): the label says so on the series.
                self.bounces.labels("permanent" if permanent else "transient", "false").inc()
            elif kind == "BounceWatchEnded":
                self.watches_ended.labels(getattr(event, "reason", "") or "read").inc()

    def _observe_lag(self, job: SendJob, confirmed: object) -> None:
        # The job keeps no attempt times; the history has them (read only on a search hit).
        history = self.sources.ledger.history(job.key)
        attempts = [e for e in history if type(e).__name__ == "Attempted"]
        found_at = getattr(confirmed, "timestamp", None)
        if attempts and found_at is not None:
            lag = (found_at - attempts[-1].timestamp).total_seconds()
            self.index_lag.observe(max(lag, 0.0))

    def tick_done(self, seconds: float, report: TickReport) -> None:
        self.tick_duration.observe(seconds)

    def bounce_report(self, outcome: str) -> None:
        self.bounce_reports.labels(outcome).inc()

    def provider_call(self, provider: str, operation: str, seconds: float) -> None:
        self.provider_latency.labels(provider, operation).observe(seconds)

    # -- the doors' searches (`Services.on_search`) ------------------------------------

    def door_search(self, hits: int) -> None:
        """A search a person or a script made (a check, a triage, a resend's), counted by
        what it found as the engine's are. It records a Checked event, or nothing, never
        one that `saved` counts, so it is counted here once."""
        self.searches.labels(copies_result(hits)).inc()

    # -- the webhook deliveries (`daemon.webhooks.worker.DeliveryObserver`) -------------

    def webhook_delivered(self, name: str) -> None:
        self.webhook_deliveries.labels(name).inc()

    def webhook_failed(self, name: str) -> None:
        self.webhook_failures.labels(name).inc()


class _StoreGauges(Collector):
    """Gauges read when Prometheus scrapes: jobs, handles, quota buckets, the last tick."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ledger = self._sources.ledger
        jobs = GaugeMetricFamily("sendledger_jobs", "Jobs by state", labels=["state"])
        # Every state, 0 included: a series that vanishes when its state empties reads as
        # "no data" to an alert or a graph, not as none left.
        counts = ledger.counts()
        for state in sorted(set(counts) | {str(s) for s in JobState}):
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        # Open work only by channel: settled jobs grow with the history.
        open_jobs = GaugeMetricFamily(
            "sendledger_open_jobs", "Open jobs by state and channel", labels=["state", "channel"]
        )
        for state in OPEN_STATES:
            tally = Tally(row.channel for row in ledger.jobs(state=state))
            for channel, count in sorted(tally.items()):
                open_jobs.add_metric([str(state), channel], count)
        yield open_jobs
        unreliable = set(self._sources.unreliable() if self._sources.unreliable else [])
        reliable = GaugeMetricFamily(
            "sendledger_provider_handle_reliable",
            "1 while the provider keeps our Message-IDs, 0 once it was seen replacing one",
            labels=["provider"],
        )
        quota = GaugeMetricFamily(
            "sendledger_quota_available_units",
            "Quota units available in the provider's bucket",
            labels=["provider"],
        )
        for name, provider in sorted(self._sources.providers.items()):
            reliable.add_metric([name], 0 if name in unreliable else 1)
            level = None if provider is None else provider.quota_available()
            if level is not None:
                quota.add_metric([name], float(level))
        yield reliable
        yield quota
        if self._sources.circuits is not None:
            yield from _circuit_gauges(self._sources.circuits())
        if self._sources.tick_age is not None:
            age = GaugeMetricFamily(
                "sendledger_last_tick_age_seconds", "Seconds since the last tick ended"
            )
            age.add_metric([], self._sources.tick_age())
            yield age
        yield _webhook_failures(ledger, self._sources.webhooks)


def _webhook_failures(ledger: Ledger, configured: Sequence[str] | None) -> GaugeMetricFamily:
    """docs/http-api.md "Webhooks": failed attempts of each configured webhook's next event
    (0 once it is taken): one small read of the position rows."""
    gauge = GaugeMetricFamily(
        "sendledger_webhook_consecutive_failures",
        "Failed attempts of the webhook's next event since it last delivered",
        labels=["webhook"],
    )
    for row in ledger.positions().read_all():
        if configured is None or row.name in configured:
            gauge.add_metric([row.name], row.failures)
    return gauge


def _circuit_gauges(circuits: list[OpenCircuit]) -> Iterator[GaugeMetricFamily]:
    """One series per open circuit (none while every provider answers)."""
    opened = GaugeMetricFamily(
        "sendledger_circuit_open",
        "1 while a provider scope's dispatch is paused: it proved unavailable, or closed"
        " sends in a row with no response",
        labels=["scope"],
    )
    since = GaugeMetricFamily(
        "sendledger_circuit_open_since_seconds",
        "When the circuit opened (Unix time)",
        labels=["scope"],
    )
    failures = GaugeMetricFamily(
        "sendledger_circuit_failures",
        "Unavailable outcomes in a row of an open circuit",
        labels=["scope"],
    )
    unanswered = GaugeMetricFamily(
        "sendledger_circuit_unanswered",
        "Sends in a row closed with no response, of an open circuit",
        labels=["scope"],
    )
    for circuit in circuits:
        opened.add_metric([circuit.scope], 1)
        since.add_metric([circuit.scope], circuit.since.timestamp())
        failures.add_metric([circuit.scope], circuit.failures)
        unanswered.add_metric([circuit.scope], circuit.unanswered)
    yield opened
    yield since
    yield failures
    yield unanswered
