"""The webhook deliveries inside `sendledger run`: one thread per webhook, beside the
scheduler's tick and never on its thread (README "Webhooks").

A thread per webhook, so that a receiver that hangs until its timeout delays only its
own deliveries. Each thread passes over its webhook, and waits `poll` seconds whenever
the webhook is caught up or waiting to retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from daemon.secret_text import read_secret_text
from daemon.settings import ConfigError, Settings
from daemon.webhooks.signing import parse_secret
from daemon.webhooks.worker import Deliverer, DeliveryObserver, Hook
from ledger.application import Ledger

log = logging.getLogger("sendledger.webhooks")


def hooks_from(settings: Settings) -> list[Hook]:
    """Every `[webhooks.NAME]`, its secret read; ConfigError names the setting."""
    hooks = []
    for name, config in sorted(settings.webhooks.items()):
        path = settings.resolve(config.secret_file)
        try:
            secret = parse_secret(read_secret_text(path))
        except ValueError as exc:
            raise ConfigError(f"webhooks.{name}.secret_file: {exc}") from None
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
            Deliverer(ledger, hook, owner=owner, observer=observer) for hook in hooks
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
        while not self._stop.is_set():
            try:
                more = deliverer.pass_once()
            except Exception as exc:
                # The store is unreachable (a database restart): wait and try again.
                log.error("webhook %s: %s: %s", deliverer.hook.name, type(exc).__name__, exc)
                more = False
            if not more:
                self._stop.wait(self._poll)
        try:
            deliverer.release()
        except Exception as exc:
            log.warning("webhook %s: lease not released: %s", deliverer.hook.name, exc)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)


def start_webhooks(
    settings: Settings, ledger: Ledger, *, owner: str, observer: object = None
) -> WebhookThreads | None:
    """The daemon's delivery threads, started; None when no webhook is configured."""
    hooks = hooks_from(settings)
    if not hooks:
        return None
    watcher = observer if hasattr(observer, "webhook_delivered") else None
    poll = min(max(settings.daemon.tick, 0.05), 1.0)
    threads = WebhookThreads(ledger, hooks, owner=owner, poll=poll, observer=watcher)  # type: ignore[arg-type]
    log.info("webhooks: %s", ", ".join(hook.name for hook in hooks))
    return threads.start()


__all__ = ["WebhookThreads", "hooks_from", "start_webhooks"]
