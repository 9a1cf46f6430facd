"""What a command needs: settings, the ledger, the channel policies."""

from __future__ import annotations

from pathlib import Path

from daemon.errors import CliError, bad_input
from daemon.settings import Settings, load_settings
from ledger.application import Ledger
from ledger.stores.url import MemoryStore, StoreUrlError, parse_store_url
from policies.loader import PolicyLoadError, PolicySet, load_policy_dir


def settings_for(config: str | None) -> Settings:
    return load_settings(config)


def open_ledger(settings: Settings) -> Ledger:
    """The configured store's ledger, to be used as `with open_ledger(settings) as ledger:`."""
    try:
        spec = parse_store_url(settings.store.url, base_dir=settings.base_dir)
        if isinstance(spec, MemoryStore):
            # A command's process ends with the command: its jobs would end with it.
            raise StoreUrlError(
                f"store.url: {spec.describe()} keeps jobs only while one process runs "
                "(sqlite or postgresql)"
            )
        return Ledger(spec)
    except StoreUrlError as exc:
        raise bad_input(f"{settings.config_path}: {exc}") from None
    except Exception as exc:
        raise CliError(f"cannot open store {settings.store.url.split('@')[-1]}: {exc}") from exc


def load_policies(settings: Settings, directory: Path | None = None) -> PolicySet:
    """All channel policies; any problem is bad input with its file, field and reason."""
    try:
        return load_policy_dir(
            directory or settings.policies_dir, known_providers=set(settings.providers)
        )
    except PolicyLoadError as exc:
        first = exc.problems[0]
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        raise bad_input(f"policy {first}{more}") from None
