"""How each door gets its `Services`: the policies intake sees and the providers a
search may use, for a command, for `sendledger api` and for the daemon's API.

One rule for every door: a channel whose policy file is broken refuses new jobs; the
others keep accepting (docs/policies.md "Channel policies").
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.config.config_file import ConfigError
from daemon.exit_codes import bad_input
from daemon.from_settings import draft_providers, message_limits, thread_providers
from daemon.providers.base import Provider
from daemon.service_layer.services import ChannelPolicies, Intake, ProviderSource, Services
from ledger.application import Ledger, utcnow

if TYPE_CHECKING:
    from daemon.config.settings import Settings
    from daemon.providers.base import Provider
    from policies.loader import PolicySet

# The policy loader (pydantic) is imported where policies are read: `store_services`,
# the door of the commands that read none, does without it.


def scan_policies(settings: Settings) -> tuple[PolicySet, dict[str, str]]:
    """The sound policies of the folder and the broken channels with their first problem.
    PolicyLoadError when the folder itself cannot be read."""
    from policies.loader import load_policy_dir_partial

    partial = load_policy_dir_partial(
        settings.policies_dir,
        known_providers=set(settings.providers),
        client_copy_providers=settings.client_copy_providers(),
    )
    broken = {channel: str(problems[0]) for channel, problems in partial.broken.items()}
    return partial.policies, broken


def command_policies(settings: Settings) -> ChannelPolicies:
    """A command's view, read once: a folder that cannot be read is bad input (exit 2)."""
    from policies.loader import PolicyLoadError

    try:
        policies, broken = scan_policies(settings)
    except PolicyLoadError as exc:
        raise bad_input(f"policy {exc.problems[0]}") from None
    return ChannelPolicies(policies, broken)


class PolicyWatch:
    """A server's view: the policies in force (`current`, what the engine sends with)
    and the channels broken in the folder now, read again only when a file changed.

    Without `current` (`sendledger api`, which sends nothing) the view is the folder's
    sound policies, as a command reads them (`command_policies`): its intake judges as
    `submit` does, by the folder and by what the running daemons loaded. With a set of its
    own, changed only by its SIGHUP, it refused a channel the daemons had loaded since
    ("reload them") and judged an edited file by its old version."""

    def __init__(self, settings: Settings, current: Callable[[], PolicySet] | None) -> None:
        self._settings = settings
        self._current = current
        self._lock = threading.Lock()
        self._seen: tuple[object, ...] | None = None
        self._broken: dict[str, str] = {}
        self._sound: frozenset[str] = frozenset()
        # The folder's last sound policies (kept while it cannot be read: its channels
        # are then refused naming why, not as unknown).
        self._folder: PolicySet | None = None
        self._unreadable: str | None = None

    def __call__(self) -> ChannelPolicies:
        from policies.loader import PolicyLoadError, PolicySet

        current = None if self._current is None else self._current()
        signature = _signature(self._settings.policies_dir)
        with self._lock:
            if signature != self._seen:
                try:
                    self._folder, self._broken = scan_policies(self._settings)
                    self._sound, self._unreadable = frozenset(self._folder), None
                except PolicyLoadError as exc:
                    self._broken, self._unreadable = {}, str(exc.problems[0])
                    self._sound = frozenset()
                self._seen = signature
            in_force = current if current is not None else self._folder or PolicySet()
            broken = dict(self._broken)
            if self._unreadable is not None:
                broken.update(dict.fromkeys(in_force, self._unreadable))
            # In the folder, sound, not in force: added since the last reload.
            unloaded = frozenset() if current is None else self._sound - set(current)
        return ChannelPolicies(in_force, broken, unloaded)


def _signature(directory: Path) -> tuple[object, ...]:
    """What changes when a policy file does: names, sizes, modification times."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        return ("unreadable", str(exc))
    signature: list[object] = []
    for entry in entries:
        try:
            stat = entry.stat()
        except OSError:
            signature.append((entry.name, None))
            continue
        signature.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return tuple(signature)


def built_providers(settings: Settings) -> ProviderSource:
    """Each search builds the named provider and closes it after (a command, or
    `sendledger api`, which sends nothing). The composition root, and with it the engine,
    is imported by the first search: `submit` and `cancel` make none."""

    @contextmanager
    def source(name: str) -> Iterator[Provider]:
        from daemon.bootstrap import build_provider

        if name not in settings.providers:
            raise KeyError(f"provider {name!r} is not configured")
        try:
            provider = build_provider(settings, name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        try:
            yield provider
        finally:
            provider.close()

    return source


def lent_providers(
    providers: Mapping[str, Provider | None], fallback: ProviderSource
) -> ProviderSource:
    """The daemon's own providers (shared with the engine, never closed here); a name
    without a live one (None: not built yet) is built by `fallback`."""

    def source(name: str) -> AbstractContextManager[Provider]:
        provider = providers.get(name)
        if provider is not None:
            return nullcontext(provider)
        return fallback(name)

    return source


def command_intake(settings: Settings) -> Intake:
    """A command's intake: the policy folder is read when first needed (a read command
    never needs it), once."""
    return Intake(
        functools.cache(lambda: command_policies(settings)),
        message_limits(settings),
        thread_providers(settings),
        utcnow,
    )


def command_services(settings: Settings, ledger: Ledger) -> Services:
    intake = command_intake(settings)
    return Services(
        ledger,
        intake.policies,
        providers=built_providers(settings),
        limits=intake.limits,
        thread_providers=intake.thread_providers,
        draft_providers=draft_providers(settings),
    )


def store_services(ledger: Ledger) -> Services:
    """The services of a command that reads jobs or withdraws one and neither takes new
    jobs nor searches (status, history, review list and show, cancel): it reads no policy
    and builds no provider, so it needs only the store's settings."""

    def no_policies() -> ChannelPolicies:
        raise RuntimeError("this door reads no policies: use command_services")

    return Services(ledger, no_policies)


__all__ = [
    "PolicyWatch",
    "built_providers",
    "command_intake",
    "command_policies",
    "command_services",
    "lent_providers",
    "scan_policies",
    "store_services",
]
