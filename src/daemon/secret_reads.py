"""The secret files `run` reads at its start, each read as the one door that uses it reads
it: a provider's credentials (`daemon.bootstrap.build_provider`), a webhook's secret
(`daemon.webhooks.delivery_threads.hooks_from`), the API's tokens (`load_tokens`).

`secret_problems` reads them all, and calls nothing over the network, for `sendledger
policy check`, which judges the config as `run` would (docs/cli.md "Command line"): a
first start that fails on a key file not put in place yet is then told before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from daemon.config.secret_text import missing_secret_hint, read_secret_text
from daemon.config.settings import (
    ConfigError,
    GraphProviderSettings,
    Settings,
    SmtpImapProviderSettings,
)

if TYPE_CHECKING:
    from daemon.api.auth import TokenBook
    from daemon.config.settings import WebhookSettings


def smtp_password(settings: Settings, name: str, config: SmtpImapProviderSettings) -> str:
    """`[providers.NAME]`'s password; ConfigError naming `password_file`."""
    from daemon.providers.smtp_imap import read_password_file

    path = settings.resolve(config.password_file)
    try:
        return read_password_file(path)
    except ValueError as exc:
        setting = f"providers.{name}.password_file"
        raise ConfigError(f"{setting}: {exc}{missing_secret_hint(setting, path)}") from None


def graph_credential(
    settings: Settings, name: str, config: GraphProviderSettings
) -> str | dict[str, str]:
    """`[providers.NAME]`'s client secret or certificate; ConfigError naming the setting."""
    from daemon.providers.graph_credentials import read_certificate, read_client_secret

    if config.client_secret_file is not None:
        field, path = "client_secret_file", settings.resolve(config.client_secret_file)
    else:
        assert config.certificate_file is not None  # the settings allow one of both
        field, path = "certificate_file", settings.resolve(config.certificate_file)
    try:
        if field == "client_secret_file":
            return read_client_secret(path)
        return read_certificate(path)
    except ValueError as exc:
        setting = f"providers.{name}.{field}"
        raise ConfigError(f"{setting}: {exc}{missing_secret_hint(setting, path)}") from None


@contextmanager
def gmail_refusals(settings: Settings, name: str) -> Iterator[None]:
    """A Gmail provider's credentials refused as ConfigError naming the setting to fix."""
    from daemon.providers.gmail import (
        CredentialsFileInvalid,
        CredentialsFileUnreadable,
        DelegationRequired,
    )

    try:
        yield
    except DelegationRequired as exc:
        raise ConfigError(f"providers.{name}.user: {exc}") from None
    except CredentialsFileUnreadable as exc:
        setting = f"providers.{name}.credentials_file"
        hint = missing_secret_hint(setting, settings.credentials_file(name))
        raise ConfigError(f"{setting}: {exc}{hint}") from None
    except CredentialsFileInvalid as exc:
        raise ConfigError(f"providers.{name}.credentials_file: {exc}") from None


def webhook_secret(settings: Settings, name: str, config: WebhookSettings) -> str:
    """`[webhooks.NAME]`'s signing secret; ConfigError naming `secret_file`."""
    from daemon.webhooks.signing import parse_secret

    path = settings.resolve(config.secret_file)
    try:
        return parse_secret(read_secret_text(path))
    except ValueError as exc:
        setting = f"webhooks.{name}.secret_file"
        raise ConfigError(f"{setting}: {exc}{missing_secret_hint(setting, path)}") from None


def load_tokens(settings: Settings) -> TokenBook:
    """The API's tokens (`api.token_file`); ConfigError naming the file."""
    from daemon.api.auth import TokenBook, TokenFileError

    if settings.api.token_file is None:
        raise ConfigError(f"{settings.config_path}: api.token_file: required with api.listen")
    path = settings.resolve(settings.api.token_file)
    try:
        return TokenBook.from_file(path)
    except TokenFileError as exc:
        hint = missing_secret_hint("api.token_file", path)
        raise ConfigError(f"{settings.config_path}: {exc}{hint}") from None


def _provider_credentials(settings: Settings, name: str) -> None:
    config = settings.providers[name]
    if isinstance(config, GraphProviderSettings):
        graph_credential(settings, name, config)
    elif isinstance(config, SmtpImapProviderSettings):
        smtp_password(settings, name, config)
    else:
        from daemon.providers.gmail import load_credentials

        with gmail_refusals(settings, name):
            # The key parsed as the provider parses it; no token is asked for.
            load_credentials(
                settings.credentials_file(name),
                user=config.user or "me",
                token_uri=config.token_uri,
                allow_http=config.allow_http,
            )


def secret_problems(settings: Settings) -> list[str]:
    """One line for each secret file `run` would refuse at its start (not there, not
    readable, not a key), naming the setting and the file: every provider's, every
    webhook's, and the API's tokens when it listens."""
    checks: list[tuple[str, Callable[[Settings, str], None]]]
    checks = [(name, _provider_credentials) for name in sorted(settings.providers)]
    checks += [(name, _webhook) for name in sorted(settings.webhooks)]
    if settings.api.listen:
        checks.append(("", _tokens))
    problems = []
    for name, check in checks:
        try:
            check(settings, name)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _webhook(settings: Settings, name: str) -> None:
    webhook_secret(settings, name, settings.webhooks[name])


def _tokens(settings: Settings, _name: str) -> None:
    load_tokens(settings)


__all__ = [
    "gmail_refusals",
    "graph_credential",
    "load_tokens",
    "secret_problems",
    "smtp_password",
    "webhook_secret",
]
