"""`sendledger run`: the long-lived service around the engine.

APScheduler (3.11, BackgroundScheduler, UTC) fires the tick every `daemon.tick`; a tick
hands the due jobs to the engine's workers and returns (`Engine.hand_out`), so it takes
milliseconds whatever the provider does, and `last_tick_age` stays under two ticks. The
main thread only waits: on a wake-up pipe that the signal handlers write to
(`daemon/wakeup.py`: a handler takes no lock), and to feed systemd's watchdog while ticks
keep completing. SIGHUP reloads policies. SIGTERM or SIGINT stops (docs/operations.md
"Stopping"): no new provider call, the calls in flight are waited for at most
`daemon.stop_timeout`, and a second SIGTERM or SIGINT stops at once; either way a claim
left without its outcome is recovered at the next start, as after a crash.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from daemon.config.secret_files import warn_exposed_secrets
from daemon.config.sender_mailboxes import other_senders
from daemon.config.settings import ConfigError
from daemon.config.tick_bound import tick_limit
from daemon.engine.held_sends import held_sends
from daemon.engine.leases import lock_wait
from daemon.engine.report import TickReport
from daemon.from_settings import declare_server
from daemon.providers.base import Provider
from daemon.service_layer.loaded import (
    PolicyAnnouncer,
    announce_policies,
    format_watch,
    give_back_refused_start,
    live_daemons,
)
from daemon.service_layer.retention import RetentionJob
from daemon.systemd import Notifier, timeout_stop_sec, watchdog_interval
from daemon.wakeup import DONE, REQUESTED, WakeUp
from daemon.webhooks.delivery_threads import (
    WebhookThreads,
    deliver_once,
    hooks_from,
    start_webhooks,
)
from daemon.webhooks.worker import Hook
from ledger.display import printable, quoted
from ledger.event_format import StoreFormatNewer
from ledger.stores import IdentityLock, IdentityTaken
from ledger.stores.identity import NameSession
from ledger.stores.loaded_policies import DAEMON
from ledger.stores.url import PostgresStore, SqliteStore, StoreSpec

if TYPE_CHECKING:
    from daemon.bootstrap import Service

if TYPE_CHECKING:
    from daemon.api.server import ApiServer

log = logging.getLogger("sendledger.daemon")

#: The signals that stop the daemon, and the exit code each asks for: 130 for an
#: interrupt (docs/cli.md "Exit codes"), 0 for systemd's SIGTERM.
STOP_SIGNALS: dict[int, int] = {signal.SIGINT.value: 130, signal.SIGTERM.value: 0}
_STOPS = frozenset({*STOP_SIGNALS, REQUESTED})


@dataclass
class _Health:
    last_tick_end: float = field(default_factory=time.monotonic)
    last_error: str | None = None
    ticks: int = 0
    totals: TickReport = field(default_factory=TickReport)


class Daemon:
    def __init__(self, service: Service, tick: float, *, notifier: Notifier | None = None) -> None:
        self.service = service
        self.engine = service.engine
        self.tick_seconds = tick
        self.notifier = notifier or Notifier()
        self.health = _Health()
        #: A tick older than this means the scheduler or the store is stuck: the watchdog
        #: is no longer fed, and `/healthz` fails (daemon/config/tick_bound.py).
        self.tick_limit = tick_limit(tick, service.settings.store)
        # Set by the main thread once it stops (never in a signal handler); a purge run
        # reads it between jobs.
        self._stop = threading.Event()
        self._wake = WakeUp()
        self._handlers = False
        #: True when the daemon stopped without waiting for its calls in flight (a second
        #: signal, or `stop_timeout` passed): the caller ends the process at once.
        self.abandoned = False
        self._tick_lock = threading.Lock()
        self._identity: IdentityLock | None = None
        #: The tick and the scope renewer both ask the name's lock (`_check_identity`):
        #: one at a time, as its session is taken again on one connection.
        self._identity_checks = threading.Lock()
        self._name_lost: IdentityTaken | None = None
        self._format_newer: StoreFormatNewer | None = None
        self._api: ApiServer | None = None
        self._webhooks: WebhookThreads | None = None
        self._announcer: PolicyAnnouncer | None = None
        self.scheduler = BackgroundScheduler(
            timezone="UTC",
            job_defaults={
                # One tick at a time: overlapping ticks would only race each other
                # for the same due jobs.
                "max_instances": 1,
                # A late tick is still worth running once, but never as a burst.
                "coalesce": True,
                "misfire_grace_time": max(int(tick * 10), 1),
            },
        )

    # -- one tick ---------------------------------------------------------------------

    def tick(self) -> TickReport:
        try:
            with self._tick_lock:
                self._check_identity()
                if self._format_newer is not None:
                    return TickReport()  # stopping: no new work in a format it misreads
                report = self.engine.hand_out()
        finally:
            # A tick that failed still ended: while the store is down (a restart, a
            # failover) the daemon waits it out (docs/performance.md), and the watchdog
            # must not take that for a hang and kill it in the middle of its calls. Only
            # a tick that does not end (a scheduler or a store call stuck) stops the feed.
            self.health.last_tick_end = time.monotonic()
        self.health.ticks += 1
        self.health.totals.add(report)
        return report

    def _check_identity(self) -> None:
        """Claim nothing unless this daemon's name is held: a database restart drops the
        PostgreSQL lock, so it is taken again here (an error while the database is down
        fails this tick, and the next one tries again). Taken by another process in
        between: stop, as a second daemon with this name would have been refused."""
        if self._identity is None:
            return
        if self._name_lost is not None:
            raise self._name_lost  # found by the other of the tick and the renewer
        try:
            with self._identity_checks:
                self._identity.check()
        except IdentityTaken as exc:
            self._name_lost = exc
            log.error("stopping: %s", exc)
            self.engine.name_lost()
            if self._webhooks is not None:
                self._webhooks.disown()
            self.request_stop()
            raise

    def _name_session(self) -> NameSession | None:
        """The session holding this daemon's name, which its heartbeat's row is written
        under (`announce_policies`): the name another process took after a database
        restart gets no row of this one's written over its own."""
        return None if self._identity is None else self._identity.session()

    def _format_raised(self, exc: StoreFormatNewer) -> None:
        """The heartbeat found the store's event format newer than this release reads
        (`format_watch`, every 20 s): no new work, and a stop as its start would have
        refused (exit 2), its calls in flight finished and recorded (docs/operations.md
        "Upgrading")."""
        self._format_newer = exc
        log.error("stopping: %s", exc)
        self.request_stop()

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        if event.exception is None:
            return
        error = f"{type(event.exception).__name__}: {event.exception}"
        if event.job_id == "tick":
            self.health.last_error = error
        log.error("%s failed: %s", event.job_id, error)

    # -- signals ----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self._handlers = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # One write to a pipe and nothing else: see daemon/wakeup.py.
        self._wake.post(signum)

    def request_stop(self) -> None:
        """Stop as SIGTERM would, from any thread."""
        self._wake.post(REQUESTED)

    def request_reload(self) -> None:
        """Reload the policies as SIGHUP would, once serving (a SIGHUP of the start-up)."""
        self._wake.post(signal.SIGHUP)

    # -- the service ------------------------------------------------------------------

    def status_line(self) -> str:
        # Open work only: counting confirmed and abandoned jobs would grow with the history.
        try:
            counts = self.engine.ledger.open_counts()
            line = "jobs: " + ", ".join(f"{state} {count}" for state, count in counts.items())
        except Exception as exc:
            # The store is unreachable (a database restart): the daemon waits it out, the
            # main thread must not die of a status line.
            line = f"jobs: unknown, store unreachable ({type(exc).__name__})"
        unreliable = self.engine.unreliable_providers()
        if unreliable:
            line += f"; HANDLE UNRELIABLE: {', '.join(unreliable)}"
        held = held_sends(self.engine.open_circuits(), self.engine.clock())
        if held:
            line += f"; {held}"
        if self.engine.policies.last_error:
            line += f"; policy reload failed: {quoted(self.engine.policies.last_error)}"
        # Sent as one of sd_notify's newline-separated assignments: a line break in a
        # scope's mailbox or a policy error's quoted value would be an assignment of its
        # own (READY=1, MAINPID=...), and a lone surrogate would not encode at all.
        return printable(line)

    def serve(self) -> int:
        hooks, api = self._start()
        self._announcer = announce_policies(
            self.service.ledger,
            self.engine.daemon_name,
            self.engine.policies,
            DAEMON,
            on_beat=format_watch(self.service.ledger, self._format_raised),
            held_by=self._name_session,
        )
        self.engine.start_lease_renewer()
        self._webhooks = start_webhooks(
            hooks,
            self.service.ledger,
            owner=self.engine.daemon_name or socket.gethostname(),
            poll=min(max(self.tick_seconds, 0.05), 1.0),
            observer=self.service.observer,
        )
        if self._name_lost is not None and self._webhooks is not None:
            # Found by the scope renewer, started first, before these threads were there
            # to be told (`_check_identity`): their leases under the name are not ours.
            self._webhooks.disown()
        if api is not None:
            api.start()
            self._api = api
        self.scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_EXECUTED)
        self.scheduler.add_job(
            self.tick, "interval", seconds=self.tick_seconds, id="tick", next_run_time=_now()
        )
        self._schedule_retention()
        self.scheduler.start()
        self.notifier.ready(self.status_line())
        log.info("sendledger running: tick %.3gs; %s", self.tick_seconds, self.status_line())
        asked = self._wait_for_stop()
        code = self._stop_within_bound(*asked)
        if self._name_lost is not None:
            raise self._name_lost  # exit 3, as when the name is taken at start-up
        if self._format_newer is not None:
            raise self._format_newer  # exit 2 and the start's line
        return code

    def _start(self) -> tuple[list[Hook], ApiServer | None]:
        """The webhooks' settings and the API's port bound, this daemon's name held and its
        earlier claims recovered (`start_up`); refused, nothing left running."""
        try:
            hooks = hooks_from(self.service.settings)  # a bad secret file: exit 2 first
            # The API's port is taken first: one in use is exit 2 naming api.listen, before
            # the name is held or a claim recovered.
            try:
                api = self._bind_api()
            except ConfigError:
                self._refuse_if_running_already()
                raise
            try:
                self._identity = start_up(self.service)
                # Asked before each renewal of the name's scope leases too: a tick held
                # up must not keep them, and their calls, after another process took
                # the name (docs/performance.md "Several daemons").
                if self._identity is not None:
                    self.engine.check_name_by(self._check_identity, self._identity.session)
            except BaseException:
                if api is not None:
                    api.stop()  # its port, bound and not served
                raise
        except BaseException:
            # Refused at start-up: the store as the start found it (`start_up` declares
            # and takes its declaration back), and only the engine's workers run
            # (bootstrap started them), stopped as a stop would, so that a caller in this
            # process (`try`, tests) is not left their threads.
            self.engine.stop()
            self.service.close()
            raise
        return hooks, api

    def _refuse_if_running_already(self) -> None:
        """The API's port cannot be had: when this daemon's name is held on the store,
        this is the daemon started a second time by mistake, its port the running one's.
        The name's refusal says so (IdentityTaken, exit 3); the port's sent the operator
        to choose another address, to be refused for the name next. Asked by the running
        daemons' rows (a daemon's counts only while its name is held), never by taking the
        name: held even for an instant, it refused a daemon of the name starting then
        (its port bound, its name not yet held), exit 3. A store that cannot say, or a
        daemon of the name not yet announced, leaves the port's line."""
        name = self.engine.daemon_name
        if not name:
            return
        ledger = self.service.ledger
        try:
            running = live_daemons(ledger.loaded_policies(), ledger.clock())
        except Exception as exc:
            log.debug("daemon.name %r not asked after the port's refusal: %s", name, exc)
            return
        if any(row.name == name for row in running):
            raise IdentityTaken(name, _held_on(ledger.store))

    def _wait_for_stop(self) -> list[int]:
        """The main thread's loop until a stop signal or request: what asked for it (two
        when a second Ctrl-C came before the first was read)."""
        watchdog = watchdog_interval()
        wait = min(watchdog or 1.0, 1.0)
        if self.notifier.enabled:
            # The status line reads the store, which may hang (a partition to PostgreSQL):
            # on a thread of its own, so this one is always free to read a stop.
            threading.Thread(target=self._report_status, name="status", daemon=True).start()
        while True:
            posted = self._wake.wait(wait)
            stops = [code for code in posted if code in _STOPS]
            if stops:
                return stops
            if signal.SIGHUP in posted:
                self.engine.policies.reload()
            self._keep_ticking()
            if watchdog is not None and self._healthy():
                self.notifier.watchdog()

    def _report_status(self) -> None:
        """systemd's STATUS= line at once and every `daemon.status_interval`, until the
        daemon stops (then the stop's own line is the last)."""
        every = self.service.settings.daemon.status_interval
        while True:
            line = self.status_line()
            if self._stop.is_set():
                return
            self.notifier.status(line)
            if self._stop.wait(every):
                return

    def _keep_ticking(self) -> None:
        """APScheduler keeps the tick's next run as a wall-clock time: a clock stepped back
        (NTP correcting a clock that ran ahead, a VM restored from a snapshot) leaves it
        that far ahead, and no tick would run for as long (the watchdog, no longer fed,
        would restart the daemon in the middle of its calls). A next run further ahead
        than two ticks is brought back to now."""
        job = self.scheduler.get_job("tick")
        if job is None or job.next_run_time is None:
            return
        ahead = (job.next_run_time - _now()).total_seconds()
        if ahead > 2 * self.tick_seconds + 1:
            log.warning("next tick %.0fs ahead (the clock was stepped back): run now", ahead)
            job.modify(next_run_time=_now())

    def _stop_within_bound(self, asked: int, *again: int) -> int:
        """Shut down in a thread of its own while this one waits, at most
        `daemon.stop_timeout`, for it to end; a second stop signal ends the wait at once.
        The exit code the first signal asked for."""
        self._stop.set()
        code = STOP_SIGNALS.get(asked, 0)
        limit = self.service.settings.daemon.stop_timeout
        sends, checks = self.engine.in_flight()
        waiting = _in_flight_words(sends, checks)
        hint = "Ctrl-C again" if asked == signal.SIGINT else "a second SIGTERM or SIGINT"
        log.info(
            "stopping (%s): no new provider calls; waiting for %s, at most %s "
            "(daemon.stop_timeout); %s stops at once",
            _asked_by(asked),
            waiting,
            _seconds(limit),
            hint,
        )
        # The unit's TimeoutStopSec may be shorter than this stop: systemd is told how long
        # it takes, so that its SIGKILL never cuts the daemon's own bounded wait short.
        self.notifier.stopping(
            f"stopping: waiting for {waiting}, at most {_seconds(limit)}",
            takes=timeout_stop_sec(limit),
        )
        stopper = threading.Thread(target=self._shutdown_then_wake, name="stop", daemon=True)
        started = time.monotonic()
        stopper.start()
        second = next((c for c in again if c in STOP_SIGNALS), None)
        if second is not None:
            self._abandon(f"{_asked_by(second)} again")
        while stopper.is_alive() and not self.abandoned:
            left = started + limit - time.monotonic()
            if left <= 0:
                self._abandon(f"still waiting after {_seconds(limit)}")
                break
            posted = self._wake.wait(min(left, 1.0))
            again_by = next((c for c in posted if c in STOP_SIGNALS), None)
            if again_by is not None:
                self._abandon(f"{_asked_by(again_by)} again")
                break
            if DONE in posted:
                stopper.join()
        if not self._handlers:
            self._wake.close()  # no handler can write to it any more
        return code

    def _abandon(self, why: str) -> None:
        sends, checks = self.engine.in_flight()
        self.abandoned = True
        log.warning(
            "stopped at once (%s), not waiting for %s: a claim without its outcome is "
            "recovered at the next start, as after a crash; %s",
            why,
            _in_flight_words(sends, checks),
            _summary(self._totals()),
        )

    def _shutdown_then_wake(self) -> None:
        try:
            self.shutdown()
        except Exception:
            log.exception("shutdown failed")
        finally:
            self._wake.post(DONE)

    def _schedule_retention(self) -> None:
        """`[retention] purge_after`: purge every `every`, the first time a minute after
        start-up (sooner when `every` is shorter), so that a daemon restarted daily
        still purges."""
        retention = self.service.settings.retention
        if retention.purge_after is None:
            return
        job = RetentionJob(
            self.service.ledger,
            retention.purge_after,
            daemon_name=self.engine.daemon_name,
            stop=self._stop.is_set,
        )
        first = _now() + timedelta(seconds=min(retention.every, 60.0))
        self.scheduler.add_job(
            job.run,
            "interval",
            seconds=retention.every,
            id="retention",
            next_run_time=first,
            misfire_grace_time=None,  # a late purge still runs
        )

    def _healthy(self) -> bool:
        # A tick that has not completed within its limit means the scheduler or the
        # store is stuck: stop feeding the watchdog and let systemd restart us.
        return self.tick_age() < self.tick_limit

    def tick_age(self) -> float:
        """Seconds since the last tick completed (since start-up before the first)."""
        return time.monotonic() - self.health.last_tick_end

    def _bind_api(self) -> ApiServer | None:
        """The HTTP API beside the scheduler, when `[api] listen` is set (docs/http-api.md
        "HTTP API"), its port taken, not yet served."""
        settings = self.service.settings
        if not settings.api.listen:
            return None
        from daemon.api.build import api_context, bound_server
        from daemon.api.metrics import Metrics

        observer = self.service.observer
        ctx = api_context(
            settings,
            self.service.ledger,
            self.service.policies,
            self.service.providers,
            metrics=observer if isinstance(observer, Metrics) else None,
            unreliable=self.engine.unreliable_providers,
            tick_age=self.tick_age,
            circuits=self.engine.open_circuits,
            scope_failure=self.engine.scope_failure,
            clock_failure=self.engine.clock_failure,
        )
        return bound_server(settings, ctx)

    def shutdown(self) -> int:
        """No new provider calls; the calls in flight finish and their outcome events are
        written when the engine closes (service.close below)."""
        self._stop.set()
        self.engine.stop()
        # The webhooks' rows and the loaded policies' are not the engine's: their waits
        # run beside the engine's close, not after it, so that the stop's lock waits in a
        # row are the engine's (daemon/config/stop_bound.py).
        beside = threading.Thread(target=self._stop_beside, name="stop-beside", daemon=True)
        beside.start()
        # The API's requests in flight get one lock wait, while a tick in flight ends:
        # both before the providers close, which a request may be calling (a check).
        api = threading.Thread(target=self._stop_api, name="stop-api", daemon=True)
        api.start()
        self.scheduler.shutdown(wait=True)
        api.join()
        self.service.close()
        beside.join()
        if self._identity is not None:
            self._identity.release()
        if not self.abandoned:
            log.info("stopped; %s", _summary(self._totals()))
        return 0

    def _stop_api(self) -> None:
        if self._api is not None:
            self._api.stop(lock_wait(self.service.ledger.store))

    def _stop_beside(self) -> None:
        """The webhooks' stop, then the removal of the loaded policies' row (a stopped
        daemon has loaded nothing `submit` should judge by), each within its lock waits."""
        wait = lock_wait(self.service.ledger.store)
        try:
            if self._webhooks is not None:
                self._webhooks.stop(wait)
        finally:
            if self._announcer is not None:
                self._announcer.stop(wait)

    def _totals(self) -> TickReport:
        """Everything counted since start-up, the stop's own outcomes included."""
        self.health.totals.add(self.engine.take_report())
        return self.health.totals


def _now() -> datetime:
    return datetime.now(UTC)


def _summary(report: TickReport) -> str:
    """What the daemon did, in words: an unknown outcome is not counted as sent."""
    if not report.busy():
        return "nothing was sent"
    parts = [
        f"{report.sent} provider call{'' if report.sent == 1 else 's'} made",
        f"{report.confirmed} confirmed",
    ]
    if report.unknown:
        parts.append(f"{report.unknown} outcome{'' if report.unknown == 1 else 's'} unknown "
                     "(not counted as sent)")  # fmt: skip
    if report.rejected:
        parts.append(f"{report.rejected} refused by the provider")
    for name in ("searched", "escalated", "recovered", "errors"):
        if getattr(report, name):
            parts.append(f"{_WORDS[name]} {getattr(report, name)}")
    return ", ".join(parts)


_WORDS = {
    "searched": "searches made",
    "escalated": "sent to review",
    "recovered": "claims recovered",
    "errors": "errors",
}


def _in_flight_words(sends: int, checks: int) -> str:
    if not sends and not checks:
        return "no provider call in flight"
    parts = []
    if sends:
        parts.append(f"{sends} send{'' if sends == 1 else 's'}")
    if checks:
        parts.append(f"{checks} search{'' if checks == 1 else 'es'}")
    return " and ".join(parts) + " in flight"


def _asked_by(code: int) -> str:
    return "asked by another thread" if code == REQUESTED else signal.Signals(code).name


def _seconds(value: float) -> str:
    return f"{value:g}s"


def check_provider_access(providers: Mapping[str, Provider]) -> None:
    """Refuse to start (ConfigError, exit 2) when a provider's credentials lack a scope its
    send path needs, naming it (docs/providers.md "Gmail setup": gmail.compose for drafts)."""
    from daemon.providers.gmail import GmailProvider, MissingScope

    for name, provider in providers.items():
        if isinstance(provider, GmailProvider):
            try:
                provider.check_access()
            except MissingScope as exc:
                raise ConfigError(f"providers.{name}.credentials_file: {exc}") from None


def _held_on(store: StoreSpec) -> str:
    """Where a daemon name is held, in the words its lock's refusal uses."""
    if isinstance(store, SqliteStore):
        return str(store.path)
    if isinstance(store, PostgresStore):
        return f"{store.host}:{store.port}/{store.dbname}"
    return store.name or store.describe()


def start_up(service: Service) -> IdentityLock | None:
    """Before the first tick: say which secret files others can read and which channels
    send as another address than their provider's mailbox, hold this daemon's
    name in the store (IdentityTaken when a live daemon holds it), recover this name's
    earlier claims (``daemon/engine/recover.py``: at once, or once past their deadline
    where the name's lock can end under a live holder) and fill in what an earlier
    release left out of the index: the mailbox of the open jobs, what else is due of the
    watched ones. The lock is held until released, or until the process dies."""
    warn_exposed_secrets(service.settings)
    check_provider_access(service.providers)
    name = service.engine.daemon_name
    if not name:
        try:
            _declare_format(service)
        except BaseException:
            give_back_refused_start(service.ledger)  # refused: its own declaration withdrawn
            raise
        _warn_other_senders(service)
        return None
    # Refused here, nothing was written: the open declared nothing (`cmd_run`).
    identity = service.ledger.hold_identity(name)
    wait = not identity.ends_only_with_holder
    try:
        # Only the name's holder declares, so a start the name refuses never replaces the
        # running daemon's declaration, nor has one to put back (docs/operations.md
        # "Upgrading").
        _declare_format(service)
        # Once the name is this process's: a start refused says its refusal alone.
        _warn_other_senders(service)
        _recover_as(service, name, wait=wait)
    except BaseException:
        # Put back while the name is held: no other process of it declares meanwhile.
        give_back_refused_start(service.ledger)
        identity.release()
        raise
    return identity


def _recover_as(service: Service, name: str, *, wait: bool) -> None:
    """The name's earlier claims recovered and the index filled in (`start_up`)."""
    if wait:
        # The process that held the name may still be calling: its claims wait for
        # their deadline, and so do the scopes it held (docs/performance.md "Several
        # daemons"), unless its heartbeat names a process gone from this host.
        service.engine.wait_for_predecessor(service.settings.daemon.tick)
        wait = not service.engine.predecessor_gone()
    report = service.engine.recover_own_claims(wait_for_deadlines=wait)
    # Rows of an earlier release name no mailbox (without it their scope is unknown
    # and no daemon would take their jobs) nor the provider of their attempt (without
    # it a channel moved since counts only its provider's scope): docs/performance.md
    # "Several daemons".
    filled = service.ledger.fill_mailboxes()
    # ... nor when anything but a watch's end is due: each waiting watch would be
    # loaded once to learn it (docs/architecture.md "Bounces on the job").
    dues = service.ledger.fill_other_dues()
    _say_started(name, report.recovered, filled, dues)


def _declare_format(service: Service) -> None:
    """This daemon's event format declared, and the store's raised if its release writes a
    newer one (`ledger.event_format.check_event_format`): StoreFormatNewer, or
    OlderReleaseLive while a server of an older release is live on the store."""
    declare_server(service.ledger, (DAEMON, service.engine.daemon_name))


def _say_started(name: str, recovered: int, filled: int, dues: int) -> None:
    if recovered:
        log.warning("daemon %r: %d claims of an earlier run recovered", name, recovered)
    if filled:
        log.info(
            "job index: the mailbox and the attempt's provider of %d open jobs filled in", filled
        )
    if dues:
        log.info("job index: what is due besides the watch of %d watched jobs filled in", dues)


def _warn_other_senders(service: Service) -> None:
    for line in other_senders(service.settings, service.policies.current):
        log.warning("%s", line)


def run_once(service: Service) -> TickReport:
    identity = None
    try:
        hooks = hooks_from(service.settings)  # a bad secret file: exit 2, nothing written
        identity = start_up(service)
        lost: list[IdentityTaken] = []
        check = None
        if identity is not None:
            # Its one tick asks the name nowhere, and may be held up by slow calls: the
            # renewal asks it, as the daemon's does (`Daemon._check_identity`).
            check = _stops_once_taken(service, identity, lost)
            service.engine.check_name_by(check, identity.session)
        service.engine.start_lease_renewer()
        report = service.engine.tick()
        if check is not None and not lost:
            # A renewal comes a third of `scope_lease` apart, and none without scopes
            # shared: a tick shorter than that may never have asked the name since
            # start-up. Asked once more before anything is written under it.
            with contextlib.suppress(IdentityTaken):
                check()
        if lost:
            # Exit 3, as the daemon's; the webhooks' rows under the name are the other
            # process's now: no delivery writes them.
            raise lost[0]
        deliver_once(
            hooks,
            service.ledger,
            owner=service.engine.daemon_name or socket.gethostname(),
            observer=service.observer,
        )
        return report
    except BaseException:
        # Ctrl-C (KeyboardInterrupt) or a failure: as the daemon's stop, no new provider
        # call (a worker in a draft step would claim and send after it); the calls in
        # flight end and are recorded by the close below.
        service.engine.stop()
        raise
    finally:
        service.close()
        if identity is not None:
            identity.release()


def _stops_once_taken(
    service: Service, identity: IdentityLock, lost: list[IdentityTaken]
) -> Callable[[], None]:
    """The name lock's check, and on IdentityTaken (kept in `lost`) the engine stopped and
    its scopes left to the process that took the name. Asked by the renewer's thread and
    once by the run after its tick, one at a time: the lock's session is not shared (a
    check may end it and take the name again)."""
    one_at_a_time = threading.Lock()

    def check() -> None:
        with one_at_a_time:
            if lost:
                raise lost[0]
            try:
                identity.check()
            except IdentityTaken as exc:
                lost.append(exc)
                log.error("stopping: %s", exc)
                service.engine.name_lost()
                raise

    return check


__all__ = ["Daemon", "run_once", "start_up"]
