"""`sendledger run`: the long-lived service around the engine.

APScheduler (3.11, BackgroundScheduler, UTC) fires the tick every `daemon.tick`. The main
thread only waits: for signals (SIGTERM drains and exits 0, SIGHUP reloads policies) and
to feed systemd's watchdog while ticks keep completing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from daemon.bootstrap import Service
from daemon.engine import TickReport
from daemon.secret_files import warn_exposed_secrets
from daemon.systemd import Notifier, watchdog_interval
from ledger.stores import IdentityLock

if TYPE_CHECKING:
    from daemon.api.server import ApiServer

log = logging.getLogger("sendledger.daemon")


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
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._tick_lock = threading.Lock()
        self._identity: IdentityLock | None = None
        self._api: ApiServer | None = None
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
        with self._tick_lock:
            report = self.engine.tick()
        self.health.ticks += 1
        self.health.totals.add(report)
        self.health.last_tick_end = time.monotonic()
        return report

    def _on_job_event(self, event: JobExecutionEvent) -> None:
        if event.exception is not None:
            self.health.last_error = f"{type(event.exception).__name__}: {event.exception}"
            log.error("tick failed: %s", self.health.last_error)

    # -- signals ----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self._reload.set()

    def request_stop(self) -> None:
        self._stop.set()

    # -- the service ------------------------------------------------------------------

    def status_line(self) -> str:
        # Open work only: counting confirmed and abandoned jobs would grow with the history.
        counts = self.engine.ledger.open_counts()
        line = "jobs: " + ", ".join(f"{state} {count}" for state, count in counts.items())
        unreliable = self.engine.unreliable_providers()
        if unreliable:
            line += f"; HANDLE UNRELIABLE: {', '.join(unreliable)}"
        if self.engine.policies.last_error:
            line += f"; policy reload failed: {self.engine.policies.last_error}"
        return line

    def serve(self) -> int:
        self._identity = start_up(self.service)
        self._api = self._start_api()
        self.scheduler.add_listener(self._on_job_event, EVENT_JOB_ERROR | EVENT_JOB_EXECUTED)
        self.scheduler.add_job(
            self.tick, "interval", seconds=self.tick_seconds, id="tick", next_run_time=_now()
        )
        self.scheduler.start()
        self.notifier.ready(self.status_line())
        log.info("sendledger running: tick %.3gs; %s", self.tick_seconds, self.status_line())
        watchdog = watchdog_interval()
        wait = min(watchdog or 1.0, 1.0)
        last_status = 0.0
        while not self._stop.wait(wait):
            if self._reload.is_set():
                self._reload.clear()
                self.engine.policies.reload()
            if watchdog is not None and self._healthy():
                self.notifier.watchdog()
            if time.monotonic() - last_status >= 5:
                last_status = time.monotonic()
                self.notifier.status(self.status_line())
        return self.shutdown()

    def _healthy(self) -> bool:
        # A tick that has not completed for many intervals means the scheduler or the
        # store is stuck: stop feeding the watchdog and let systemd restart us.
        allowed = max(self.tick_seconds * 10, 60.0)
        return time.monotonic() - self.health.last_tick_end < allowed

    def tick_age(self) -> float:
        """Seconds since the last tick completed (since start-up before the first)."""
        return time.monotonic() - self.health.last_tick_end

    def _start_api(self) -> ApiServer | None:
        """The HTTP API beside the scheduler, when `[api] listen` is set (README "HTTP API")."""
        settings = self.service.settings
        if not settings.api.listen:
            return None
        from daemon.api.build import api_context, server_for
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
        )
        server = server_for(settings, ctx)
        server.start()
        return server

    def shutdown(self) -> int:
        self.notifier.stopping("draining in-flight sends")
        log.info("stopping: finishing in-flight provider calls and their events")
        # No new provider calls; wait=True lets the running tick's calls finish and
        # their outcome events be written.
        self.engine.stop()
        self.scheduler.shutdown(wait=True)
        if self._api is not None:
            self._api.stop()
        self.service.close()
        if self._identity is not None:
            self._identity.release()
        log.info("stopped; %s", _summary(self.health.totals))
        return 0


def _now() -> datetime:
    return datetime.now(UTC)


def _summary(report: TickReport) -> str:
    return ", ".join(f"{k} {v}" for k, v in vars(report).items() if v) or "nothing done"


def start_up(service: Service) -> IdentityLock | None:
    """Before the first tick: say which secret files others can read, hold this daemon's
    name in the store (IdentityTaken when a live daemon holds it), and recover this
    name's earlier claims at once (``daemon/engine/recover.py``). The lock is held until
    released, or until the process dies."""
    warn_exposed_secrets(service.settings)
    name = service.engine.daemon_name
    if not name:
        return None
    identity = service.ledger.hold_identity(name)
    try:
        report = service.engine.recover_own_claims()
    except BaseException:
        identity.release()
        raise
    if report.recovered:
        log.warning("daemon %r: %d claims of an earlier run recovered", name, report.recovered)
    return identity


def run_once(service: Service) -> TickReport:
    identity = None
    try:
        identity = start_up(service)
        return service.engine.tick()
    finally:
        service.close()
        if identity is not None:
            identity.release()


__all__ = ["Daemon", "run_once", "start_up"]
