"""Settings: a TOML file plus SENDLEDGER_<SECTION>__<KEY> environment overrides."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from policies.durations import parse_duration

CONFIG_ENV = "SENDLEDGER_CONFIG"
DEFAULT_CONFIG = Path("sendledger.toml")

Duration = Annotated[float, BeforeValidator(parse_duration)]


class ConfigError(Exception):
    """A configuration problem, phrased as one line that names the file and key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSettings(_Section):
    url: str = "sqlite:///ledger.sqlite"


class DaemonSettings(_Section):
    tick: Duration = 1.0
    policies_dir: Path = Path("policies")
    # Provider calls of different jobs in flight at once (each within its provider's quota).
    concurrency: int = Field(default=4, ge=1, le=256)
    # Jobs taken per state per tick; the rest wait for the next tick.
    batch_size: int = Field(default=200, ge=1, le=100_000)
    # Added to the provider timeout to form an attempt's deadline: past it, an
    # attempt with no outcome (a crash, kill -9) is treated as Unknown.
    deadline_grace: Duration = 30.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class ProviderSettings(_Section):
    kind: Literal["gmail"] = "gmail"
    credentials_file: Path
    user: str = "me"
    api_endpoint: str = ""
    token_uri: str = ""
    timeout: Duration = 30.0
    quota_units_per_second: float = Field(default=250.0, gt=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SENDLEDGER_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    store: StoreSettings = StoreSettings()
    daemon: DaemonSettings = DaemonSettings()
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)

    # Where the config came from; relative paths in it are relative to its folder.
    config_path: Path | None = Field(default=None, exclude=True)

    @property
    def base_dir(self) -> Path:
        return self.config_path.parent if self.config_path else Path.cwd()

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else self.base_dir / path

    @property
    def policies_dir(self) -> Path:
        return self.resolve(self.daemon.policies_dir)

    def credentials_file(self, provider: str) -> Path:
        return self.resolve(self.providers[provider].credentials_file)


class _TomlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def config_path_from(explicit: str | Path | None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return DEFAULT_CONFIG


def load_settings(explicit: str | Path | None = None) -> Settings:
    path = config_path_from(explicit).absolute()
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return settings_from_dict(data, config_path=path)


def settings_from_dict(data: dict[str, Any], *, config_path: Path | None = None) -> Settings:
    label = str(config_path) if config_path else "config"
    if "config_path" in data:
        raise ConfigError(f"{label}: config_path: unknown key")

    class _FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # Environment first: an operator's override beats the file.
            return (init_settings, env_settings, _TomlSource(settings_cls, data))

    try:
        loaded = _FileSettings(config_path=config_path)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        raise ConfigError(f"{label}: {where}: {message}") from None
    return loaded
