"""The config file itself: where it is, and its TOML read into a dict, or one line saying
why not (docs/configuration.md "Configuration").

Without pydantic, so that a command that reads only its own section (`status` reads
`[store]`: `daemon/config/store_section.py`) reads the file with the same code and the
same refusals as the whole settings model (`daemon/config/settings.py: load_settings`).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from ledger.exceptions import Refusal, SendledgerError
from policies.files import BYTE_ORDER_MARK, FileProblem, read_regular_file, starts_with_a_mark
from policies.toml_text import parse_toml

CONFIG_ENV = "SENDLEDGER_CONFIG"
MAX_CONFIG_BYTES = 1024 * 1024
DEFAULT_CONFIG = Path("sendledger.toml")


class ConfigError(SendledgerError):
    """A configuration problem, phrased as one line that names the file and key."""

    kind = Refusal.BAD_INPUT


def config_path_from(explicit: str | Path | None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return DEFAULT_CONFIG


def read_config_file(explicit: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The config file's absolute path and its decoded TOML."""
    path = config_path_from(explicit).absolute()
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"config file not found: {path} (give --config FILE or set {CONFIG_ENV}; "
            "`sendledger init DIR` writes one, `sendledger try` needs none)"
        )
    try:
        # A regular file, read without blocking (a FIFO named as the config must not hang).
        text = read_regular_file(path, limit=MAX_CONFIG_BYTES).decode("utf-8")
        if starts_with_a_mark(text):
            raise ConfigError(f"{path}: {BYTE_ORDER_MARK}")
        data = parse_toml(text)
    except FileProblem as exc:
        # The folder `sendledger init DIR` wrote, named instead of the file in it.
        inside = path / DEFAULT_CONFIG
        hint = f"; give the config file in it: --config {inside}" if inside.is_file() else ""
        raise ConfigError(f"{path}: cannot read: {exc.reason}{hint}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: thousands of levels
        # overflow it, which was an unexpected failure naming no file (exit 1).
        raise ConfigError(
            f"{path}: not valid TOML: nested too deeply (arrays or inline tables)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return path, data


__all__ = ["CONFIG_ENV", "ConfigError", "config_path_from", "read_config_file"]
