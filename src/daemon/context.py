"""What a command needs: settings, the ledger, the channel policies."""

from __future__ import annotations

from pathlib import Path

from daemon.errors import CliError, bad_input
from daemon.settings import Settings, load_settings
from ledger.application import Ledger
from ledger.store_url import StoreUrlError
from policies.loader import PolicyLoadError, PolicySet, load_policy_dir


def settings_for(config: str | None) -> Settings:
    return load_settings(config)


def open_ledger(settings: Settings) -> Ledger:
    try:
        return Ledger(settings.store.url, base_dir=settings.base_dir)
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
