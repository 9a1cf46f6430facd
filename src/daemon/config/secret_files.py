"""The files that hold secrets: their permissions and the store's encryption keys
(`sendledger admin new-key`, which prints a fresh one, is `daemon/cli/job_commands.py`).

Every `*_file` setting names a secret (service-account JSON, a password, API tokens, the
store key). As ssh does with a private key, the daemon says at start-up when one of them
can be read by other users; it does not refuse, because a container's mounted secret is
often 0644 inside a private namespace. docs/configuration.md: "Encryption at rest".
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from daemon.config.settings import Settings
from daemon.config.store_section import encryption_keys

log = logging.getLogger("sendledger")


def secret_files(settings: Settings) -> Iterator[tuple[str, Path]]:
    """(setting name, resolved path) of every `*_file` setting that is set."""
    sections: list[tuple[str, BaseModel]] = []
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, BaseModel):
            sections.append((name, value))
        elif isinstance(value, dict):
            sections.extend(
                (f"{name}.{key}", v) for key, v in value.items() if isinstance(v, BaseModel)
            )
    for prefix, section in sections:
        for field in type(section).model_fields:
            value = getattr(section, field)
            if field.endswith("_file") and isinstance(value, Path):
                yield f"{prefix}.{field}", settings.resolve(value)


def exposed(path: Path) -> bool:
    """Readable or writable by group or others."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # a missing file is reported by whoever reads it
    if not stat.S_ISREG(mode):
        return False  # nor is a FIFO or a directory: its reader refuses it, in one line
    return bool(mode & (stat.S_IRWXG | stat.S_IRWXO))


def warn_exposed_secrets(settings: Settings) -> list[Path]:
    """Log one warning per secret file other users can read; the files warned about."""
    warned = []
    for setting, path in secret_files(settings):
        if exposed(path):
            mode = stat.S_IMODE(path.stat().st_mode)
            log.warning(
                "%s: %s is accessible by others (mode %04o); chmod 600 %s",
                setting,
                path,
                mode,
                path,
            )
            warned.append(path)
    return warned


__all__ = [
    "encryption_keys",
    "exposed",
    "secret_files",
    "warn_exposed_secrets",
]
