"""What a command or the API opens from the settings: the ledger, its store, the policies.

The settings model, the policy loader and the MIME limits are imported by the functions
that use them: a command that opens only the store (`store_settings_for`, `open_ledger`)
loads neither pydantic nor the policies (docs/cli.md "Many keys, one process").
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.config.config_file import read_config_file
from daemon.config.store_section import StoreSource, encryption_keys, plain_store_config
from daemon.exit_codes import CliError, bad_input
from ledger.application import Ledger
from ledger.event_format import OlderReleaseLive, check_event_format
from ledger.stores import store_exists
from ledger.stores.causes import StoreUnavailable
from ledger.stores.url import (
    MemoryStore,
    PostgresStore,
    SqliteStore,
    StartWatch,
    StoreRefused,
    StoreSpec,
    StoreUrlError,
    parse_store_url,
)

if TYPE_CHECKING:
    from daemon.config.settings import Settings
    from ledger.mime import MessageLimits
    from policies.loader import PolicySet


def settings_for(config: str | None) -> Settings:
    """The whole settings model of the config file (and the environment)."""
    from daemon.config.settings import load_settings

    return load_settings(config)


def store_settings_for(config: str | None) -> StoreSource:
    """What opening the store needs, for a command that reads nothing else: the file's
    `[store]` as it is when the model need not judge it, else the whole model
    (`daemon/config/store_section.py`). The same refusals either way."""
    path, data = read_config_file(config)
    plain = plain_store_config(data, path, os.environ)
    if plain is not None:
        return plain
    from daemon.config.settings import settings_from_dict

    return settings_from_dict(data, config_path=path)


def message_limits(settings: Settings) -> dict[str, MessageLimits]:
    """Each configured provider's per-message limits, checked at intake."""
    from ledger.mime import MessageLimits

    limits = {}
    for name, provider in settings.providers.items():
        max_bytes = getattr(provider, "max_message_bytes", None)
        max_recipients = getattr(provider, "max_recipients", None)
        if isinstance(max_bytes, int) and isinstance(max_recipients, int):
            limits[name] = MessageLimits(max_bytes, max_recipients, f"providers.{name}")
    return limits


def thread_providers(settings: Settings) -> frozenset[str]:
    """The providers a job's `thread_id` can go to: the gmail ones."""
    return frozenset(
        name for name, provider in settings.providers.items() if provider.kind == "gmail"
    )


def draft_providers(settings: Settings) -> frozenset[str]:
    """The providers that may leave unsent drafts of a job (docs/architecture.md "Drafts
    never outlive their job"): Graph (each send creates its draft) and Gmail with
    `send_via = "drafts"`."""
    from daemon.config.settings import GmailProviderSettings, GraphProviderSettings

    return frozenset(
        name
        for name, provider in settings.providers.items()
        if isinstance(provider, GraphProviderSettings)
        or (isinstance(provider, GmailProviderSettings) and provider.send_via == "drafts")
    )


#: Seconds a service (`run`, `api`) waits at its start for a PostgreSQL server that does
#: not answer yet, is starting up or recovering (57P03), or has no free connection slot
#: (53300), or `store.connect_timeout` when longer (docs/operations.md "Opening the
#: store"). A unit ordered After=postgresql.service starts as soon as the server's
#: process does, before it accepts connections; within systemd's default start timeout
#: (90 s), and a start that fails after it is restarted (Restart=on-failure).
SERVICE_START_WAIT = 60


def start_notices() -> StartWatch | None:
    """What tells systemd of a service's wait for its store, under a unit that listens
    ($NOTIFY_SOCKET); its socket lives as long as the process."""
    from daemon.systemd import Notifier, StartNotices

    notifier = Notifier()
    return StartNotices(notifier) if notifier.enabled else None


def open_ledger(
    settings: StoreSource,
    *,
    create: bool = True,
    service: bool = False,
    writes: bool = True,
    server: tuple[str, str] | None = None,
) -> Ledger:
    """The configured store's ledger, to be used as `with open_ledger(settings) as ledger:`.

    Read-only commands pass ``create=False``: a SQLite store that is not there is then
    bad input (exit 2, "no store at PATH"), never a new empty file; a misspelled path
    would otherwise look like a store without jobs. A service's start (``service=True``)
    waits for its server up to `SERVICE_START_WAIT`, where a command fails within
    `store.connect_timeout`.

    The store's event format is judged before it is used (`ledger.event_format`): a
    newer one than this release reads is exit 2; a command that may write (``writes``)
    or a server (``server``: its kind and `daemon.name`) raises an older one, or is
    exit 3 while a server of an older release is live on the store."""
    keys = encryption_keys(settings)  # a bad key file is bad input (ConfigError)
    try:
        spec = store_spec(settings)
        if service and isinstance(spec, PostgresStore):
            spec = dataclasses.replace(
                spec, start_wait=SERVICE_START_WAIT, start_watch=start_notices()
            )
        if not create and not isinstance(spec, MemoryStore) and not store_exists(spec):
            raise bad_input(
                f"no store at {spec.describe()} (store.url of {settings.config_path}); "
                "`sendledger submit` creates it"
            )
        if isinstance(spec, MemoryStore):
            # A command's process ends with the command: its jobs would end with it.
            raise StoreUrlError(
                f"store.url: {spec.describe()} keeps jobs only while one process runs "
                "(sqlite or postgresql)"
            )
        ledger = Ledger(spec, encryption_keys=keys)
        try:
            check_event_format(ledger, server=server, writing=writes or server is not None)
        except Exception as exc:
            ledger.close()
            # A read-only store file, a full disk: the one line of every store refusal.
            said = ledger.unavailable(exc)
            if said is not None:
                raise said from exc
            raise
        except BaseException:
            ledger.close()
            raise
        return ledger
    except StoreUrlError as exc:
        raise bad_input(f"{settings.config_path}: {exc}") from None
    except StoreRefused as exc:  # a store key or environment that does not fit the store
        raise bad_input(str(exc)) from None
    except (CliError, StoreUnavailable, OlderReleaseLive):  # already one line
        raise
    except Exception as exc:
        raise CliError(f"cannot open store {settings.store.url.split('@')[-1]}: {exc}") from exc


def declare_server(ledger: Ledger, server: tuple[str, str]) -> None:
    """A server's event format declared once it may (a daemon once it holds its name, an
    API server its own), the store's raised if its release writes a newer one
    (`ledger.event_format.check_event_format`): StoreFormatNewer, or OlderReleaseLive
    while a server of an older release is live on the store. A read-only store file, a
    full disk: the one line of every store refusal, as the open says it."""
    try:
        check_event_format(ledger, server=server)
    except Exception as exc:
        said = ledger.unavailable(exc)
        if said is not None:
            raise said from exc
        raise


def judge_store_url(settings: StoreSource) -> None:
    """`store.url` and the `[store]` keys judged as the commands that open the store judge
    them, without opening it: for `policy check`, which judges the whole file
    (docs/configuration.md "Configuration"). Bad input naming the config."""
    encryption_keys(settings)  # a bad key file is bad input (ConfigError)
    try:
        store_spec(settings)
    except StoreUrlError as exc:
        raise bad_input(f"{settings.config_path}: {exc}") from None


def store_spec(settings: StoreSource) -> StoreSpec:
    """`store.url` with the `[store]` connection settings applied. The PostgreSQL-only
    keys set for another store are refused (docs/performance.md "Performance and scaling")."""
    store = settings.store
    spec = parse_store_url(store.url, base_dir=settings.base_dir)
    if not store.check_mounts and not isinstance(spec, SqliteStore):
        raise StoreUrlError(
            f"store.check_mounts: only a sqlite:// store is a file in a folder that may "
            f"be a mount point, not {spec.describe()}"
        )
    if isinstance(spec, PostgresStore):
        return dataclasses.replace(
            spec,
            pool_size=store.pool_size,
            max_overflow=store.max_overflow,
            lock_timeout=store.lock_timeout,
            connect_timeout=store.connect_timeout,
        )
    if store.postgres_only:
        raise StoreUrlError(
            f"store.{store.postgres_only[0]}: only a postgresql:// store has a connection "
            f"pool and lock waits, not {spec.describe()}"
        )
    if isinstance(spec, SqliteStore):
        return dataclasses.replace(spec, check_mounts=store.check_mounts)
    return spec


def load_policies(settings: Settings, directory: Path | None = None) -> PolicySet:
    """All channel policies; any problem is bad input with its file, field and reason."""
    from policies.loader import PolicyLoadError, load_policy_dir

    try:
        return load_policy_dir(
            directory or settings.policies_dir,
            known_providers=set(settings.providers),
            client_copy_providers=settings.client_copy_providers(),
        )
    except PolicyLoadError as exc:
        first = exc.problems[0]
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        raise bad_input(f"policy {first}{more}") from None
