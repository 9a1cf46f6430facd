"""What a command or the API opens from the settings: the ledger, its store, the policies."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from daemon.config.secret_files import encryption_keys
from daemon.config.settings import (
    GmailProviderSettings,
    GraphProviderSettings,
    Settings,
    load_settings,
)
from daemon.exit_codes import CliError, bad_input
from ledger.application import Ledger
from ledger.mime import MessageLimits
from ledger.stores import store_exists
from ledger.stores.url import (
    MemoryStore,
    PostgresStore,
    StoreRefused,
    StoreSpec,
    StoreUrlError,
    parse_store_url,
)
from policies.loader import PolicyLoadError, PolicySet, load_policy_dir


def settings_for(config: str | None) -> Settings:
    return load_settings(config)


def message_limits(settings: Settings) -> dict[str, MessageLimits]:
    """Each configured provider's per-message limits, checked at intake."""
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
    return frozenset(
        name
        for name, provider in settings.providers.items()
        if isinstance(provider, GraphProviderSettings)
        or (isinstance(provider, GmailProviderSettings) and provider.send_via == "drafts")
    )


def open_ledger(settings: Settings, *, create: bool = True) -> Ledger:
    """The configured store's ledger, to be used as `with open_ledger(settings) as ledger:`.

    Read-only commands pass ``create=False``: a SQLite store that is not there is then
    bad input (exit 2, "no store at PATH"), never a new empty file; a misspelled path
    would otherwise look like a store without jobs."""
    keys = encryption_keys(settings)  # a bad key file is bad input (ConfigError)
    try:
        spec = store_spec(settings)
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
        return Ledger(spec, encryption_keys=keys)
    except StoreUrlError as exc:
        raise bad_input(f"{settings.config_path}: {exc}") from None
    except StoreRefused as exc:  # a store key or environment that does not fit the store
        raise bad_input(str(exc)) from None
    except CliError:
        raise
    except Exception as exc:
        raise CliError(f"cannot open store {settings.store.url.split('@')[-1]}: {exc}") from exc


def store_spec(settings: Settings) -> StoreSpec:
    """`store.url` with the `[store]` connection settings applied. The PostgreSQL-only
    keys set for another store are refused (docs/performance.md "Performance and scaling")."""
    store = settings.store
    spec = parse_store_url(store.url, base_dir=settings.base_dir)
    if isinstance(spec, PostgresStore):
        return dataclasses.replace(
            spec,
            pool_size=store.pool_size,
            max_overflow=store.max_overflow,
            lock_timeout=store.lock_timeout,
        )
    if store.postgres_only:
        raise StoreUrlError(
            f"store.{store.postgres_only[0]}: only a postgresql:// store has a connection "
            f"pool and lock waits, not {spec.describe()}"
        )
    return spec


def load_policies(settings: Settings, directory: Path | None = None) -> PolicySet:
    """All channel policies; any problem is bad input with its file, field and reason."""
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
