"""The webhook deliveries inside `sendledger run`: one thread per webhook, beside the
scheduler's tick and never on its thread (docs/http-api.md "Webhooks").

A thread per webhook, so that a receiver that hangs until its timeout delays only its
own deliveries. Each thread passes over its webhook, and waits `poll` seconds whenever
the webhook is caught up or waiting to retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import cast

from daemon.config.settings import Settings
from daemon.secret_reads import webhook_secret
from daemon.webhooks.worker import Deliverer, DeliveryObserver, Hook
from ledger.application import Ledger
from ledger.display import quoted

log = logging.getLogger("sendledger.webhooks")


def hooks_from(settings: Settings) -> list[Hook]:
    """Every `[webhooks.NAME]`, its secret read; ConfigError names the setting."""
    hooks = []
    for name, config in sorted(settings.webhooks.items()):
        secret = webhook_secret(settings, name, config)
        hooks.append(
            Hook(
                name=name,
                url=config.url,
                secret=secret,
                types=frozenset(config.events),
                timeout=config.timeout,
                retry_backoff=config.retry_backoff,
                retry_backoff_max=config.retry_backoff_max,
            )
        )
    return hooks


class WebhookThreads:
    """The delivery threads of one daemon; `stop` lets each finish its attempt, then
    gives its lease up so that another daemon can take over at once."""

    def __init__(
        self,
        ledger: Ledger,
        hooks: Sequence[Hook],
        *,
        owner: str,
        poll: float = 1.0,
        observer: DeliveryObserver | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._poll = poll
        self._deliverers = [
            Deliverer(ledger, hook, owner=owner, observer=observer, stopping=self._stop)
            for hook in hooks
        ]
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(deliverer,),
                name=f"webhook-{deliverer.hook.name}",
                daemon=True,
            )
            for deliverer in self._deliverers
        ]

    def start(self) -> WebhookThreads:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, deliverer: Deliverer) -> None:
        last_error, logged_at = "", 0.0
        while not self._stop.is_set():
            try:
                more = deliverer.pass_once()
                last_error = ""
            except Exception as exc:
                # The store is unreachable (a database restart): wait and try again,
                # saying so once a minute rather than every poll.
                error = f"{type(exc).__name__}: {quoted(exc)}"
                if error != last_error or time.monotonic() - logged_at > 60:
                    log.error("webhook %s: %s", deliverer.hook.name, error)
                    last_error, logged_at = error, time.monotonic()
                more = False
            if not more:
                self._stop.wait(self._poll)
        try:
            deliverer.release()
        except Exception as exc:
            log.warning("webhook %s: lease not released: %s", deliverer.hook.name, quoted(exc))

    def disown(self) -> None:
        """The daemon's name went to another process: the threads end after the attempt
        in flight, writing and giving up nothing (`Deliverer.disown`)."""
        for deliverer in self._deliverers:
            deliverer.disown()
        self._stop.set()

    def stop(self, lock_wait: float = 5.0) -> None:
        """Stop every thread within three lock waits (`lock_wait`: `[store] lock_timeout`,
        daemon/config/stop_bound.py), whatever the number of webhooks: one for the
        threads to end (a write in flight ends within its lock wait, and no pass starts a
        POST once stopped), two for the leases of the threads still in an attempt, each
        given up on a thread of its own (a write of the attempt's thread begun meanwhile,
        then the release). Given up now, not by the attempt's thread once it ends, which
        the daemon does not wait for: another daemon would wait for the lease to run out.
        An attempt still in flight is sent again by the next daemon (at least once)."""
        self._stop.set()
        deadline = time.monotonic() + lock_wait
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        late = [
            threading.Thread(
                target=_give_up,
                args=(deliverer, lock_wait),
                name=f"webhook-release-{deliverer.hook.name}",
                daemon=True,
            )
            for deliverer, thread in zip(self._deliverers, self._threads, strict=True)
            if thread.is_alive()
        ]
        for releaser in late:
            releaser.start()
        deadline = time.monotonic() + 2 * lock_wait
        for releaser in late:
            releaser.join(max(deadline - time.monotonic(), 0.0))


def _give_up(deliverer: Deliverer, lock_wait: float) -> None:
    """The lease of a webhook whose thread is still in an attempt, given up; said when
    it cannot be (a write that did not end in time, the row held by another session)."""
    try:
        deliverer.release(wait=lock_wait)
    except Exception as exc:
        log.warning("webhook %s: lease not released: %s", deliverer.hook.name, quoted(exc))


def deliver_once(
    hooks: Sequence[Hook], ledger: Ledger, *, owner: str, observer: object = None
) -> None:
    """`run --once`: each webhook delivers what it can now, until it is caught up or
    an attempt fails (the next run retries it)."""
    for hook in hooks:
        deliverer = Deliverer(ledger, hook, owner=owner, observer=_watcher(observer))
        try:
            while deliverer.pass_once():
                pass
        finally:
            deliverer.release()


def start_webhooks(
    hooks: Sequence[Hook], ledger: Ledger, *, owner: str, poll: float, observer: object = None
) -> WebhookThreads | None:
    """The daemon's delivery threads, started; None when no webhook is configured."""
    if not hooks:
        return None
    threads = WebhookThreads(ledger, hooks, owner=owner, poll=poll, observer=_watcher(observer))
    log.info("webhooks: %s", ", ".join(hook.name for hook in hooks))
    return threads.start()


def _watcher(observer: object) -> DeliveryObserver | None:
    """The daemon's metrics when it keeps them (`daemon.api.metrics.Metrics`)."""
    return cast(DeliveryObserver, observer) if hasattr(observer, "webhook_delivered") else None


__all__ = ["WebhookThreads", "deliver_once", "hooks_from", "start_webhooks"]
