"""The `[store]` section alone, for the commands that read nothing else: `status`,
`history`, `review list`, `review show`, `cancel`, `audit`, `admin rebuild-index`
(docs/configuration.md "Configuration", docs/cli.md "Many keys, one process").

The settings model (`daemon/config/settings.py`) is pydantic and pydantic-settings; loading
them costs a command line more than the rest of its work. So a command that reads only
the store takes the section from the file as it is when nothing in it needs the model to
judge it: the file's sections are all known ones, `[store]` holds only `url` and
`encryption_key_file`, each a string (which the model keeps as it is: any string is a
`str`, any string a `Path`; `tests/unit/test_store_section.py` proves it against the
model), and no `SENDLEDGER_*` variable sets a setting. Anything else goes through the whole
model, so a bad value is refused by the same code with the same line as for `run`. What
the URL and the key file say is judged after, the same way on both paths
(`ledger.stores.url.parse_store_url`, :func:`encryption_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from daemon.config.config_file import ConfigError
from daemon.config.environment import OTHER_VARIABLES, PREFIX
from daemon.config.secret_text import content_lines, read_secret_text
from ledger.stores.cipher import check_key
from ledger.stores.url import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_OVERFLOW,
    DEFAULT_POOL_SIZE,
)

DEFAULT_STORE_URL = "sqlite:///ledger.sqlite"

#: The file's top-level sections (the settings model's fields; a unit test holds them equal).
SECTIONS = frozenset({"store", "daemon", "providers", "api", "retention", "webhooks"})

#: The `[store]` keys whose every string the model takes unchanged.
PLAIN_STORE_KEYS = frozenset({"url", "encryption_key_file"})


class StoreValues(Protocol):
    """The `[store]` section as a command reads it: `StoreSettings` or :class:`StoreSection`."""

    @property
    def url(self) -> str: ...
    @property
    def encryption_key_file(self) -> Path | None: ...
    @property
    def pool_size(self) -> int: ...
    @property
    def max_overflow(self) -> int: ...
    @property
    def lock_timeout(self) -> int: ...
    @property
    def connect_timeout(self) -> int: ...
    @property
    def check_mounts(self) -> bool: ...
    @property
    def postgres_only(self) -> list[str]: ...


class StoreSource(Protocol):
    """What opening the store needs of the configuration: `Settings` or :class:`StoreConfig`."""

    @property
    def store(self) -> StoreValues: ...
    @property
    def config_path(self) -> Path | None: ...
    @property
    def base_dir(self) -> Path: ...
    def resolve(self, path: Path) -> Path: ...


@dataclass(frozen=True)
class StoreSection:
    url: str = DEFAULT_STORE_URL
    encryption_key_file: Path | None = None
    pool_size: int = DEFAULT_POOL_SIZE
    max_overflow: int = DEFAULT_MAX_OVERFLOW
    lock_timeout: int = DEFAULT_LOCK_TIMEOUT
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    check_mounts: bool = True

    @property
    def postgres_only(self) -> list[str]:
        return []  # a section that sets one is read by the model


@dataclass(frozen=True)
class StoreConfig:
    store: StoreSection
    config_path: Path

    @property
    def base_dir(self) -> Path:
        return self.config_path.parent

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else self.base_dir / path


def sets_a_setting(environ: Mapping[str, str]) -> bool:
    """Whether a `SENDLEDGER_*` variable (other than those read outside the model) is set:
    the model then judges them all (an unknown name, a bad value, malformed JSON)."""
    others = {name.upper() for name in OTHER_VARIABLES}
    return any(name.upper().startswith(PREFIX) and name.upper() not in others for name in environ)


def plain_store_config(
    data: Mapping[str, Any], path: Path, environ: Mapping[str, str]
) -> StoreConfig | None:
    """The store section of the config file `path` holding `data`, when it needs no
    judging by the settings model; None when it does (then load the whole model)."""
    if sets_a_setting(environ) or not set(data) <= SECTIONS:
        return None
    store = data.get("store", {})
    if not isinstance(store, dict) or not set(store) <= PLAIN_STORE_KEYS:
        return None
    if not all(isinstance(value, str) for value in store.values()):
        return None
    key_file = store.get("encryption_key_file")
    section = StoreSection(
        url=store.get("url", DEFAULT_STORE_URL),
        encryption_key_file=None if key_file is None else Path(key_file),
    )
    return StoreConfig(section, path)


def encryption_keys(settings: StoreSource) -> list[str]:
    """The keys of `store.encryption_key_file` (first encrypts, all decrypt); none
    when it is not set. ConfigError names the setting and the line."""
    configured = settings.store.encryption_key_file
    if configured is None:
        return []
    path = settings.resolve(configured)
    where = f"store.encryption_key_file ({path})"
    try:
        text = read_secret_text(path)
    except ValueError as exc:
        raise ConfigError(f"store.encryption_key_file: {exc}") from None
    keys = []
    for number, line in content_lines(text):
        try:
            keys.append(check_key(line))
        except ValueError as exc:
            raise ConfigError(f"{where}: line {number}: {exc}") from None
    if not keys:
        raise ConfigError(f"{where}: no key in the file (`sendledger admin new-key`)")
    return keys


__all__ = [
    "DEFAULT_STORE_URL",
    "SECTIONS",
    "StoreConfig",
    "StoreSection",
    "StoreSource",
    "encryption_keys",
    "plain_store_config",
    "sets_a_setting",
]
