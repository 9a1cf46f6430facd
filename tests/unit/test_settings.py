"""Settings: TOML file, SENDLEDGER_<SECTION>__<KEY> overrides, strictness, paths."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from tests.unit.docs_code import KINDS, SECTIONS
from tests.unit.test_docs_settings import STUBS

from daemon import runtime
from daemon.bootstrap import build_provider
from daemon.cli import api_server
from daemon.config import environment
from daemon.config.secret_files import secret_files, warn_exposed_secrets
from daemon.config.settings import (
    ConfigError,
    DaemonSettings,
    GmailProviderSettings,
    GraphProviderSettings,
    Settings,
    SmtpImapProviderSettings,
    WebhookSettings,
    config_path_from,
    load_settings,
    settings_from_dict,
)
from daemon.providers.graph_credentials import read_client_secret
from daemon.providers.smtp_imap import read_password_file

CONFIG = """
[store]
url = "sqlite:///data/ledger.sqlite"

[daemon]
tick = "250ms"
policies_dir = "pol"

[providers.support]
credentials_file = "sa.json"
user = "support@example.com"
timeout = "5s"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SENDLEDGER_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "sendledger.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_values_durations_and_paths_relative_to_the_config(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path))
    assert settings.daemon.tick == 0.25
    assert settings.providers["support"].timeout == 5.0
    assert isinstance(settings.providers["support"], GmailProviderSettings)
    assert settings.providers["support"].quota_units_per_second == 250.0
    assert settings.policies_dir == tmp_path / "pol"
    assert settings.credentials_file("support") == tmp_path / "sa.json"
    assert settings.base_dir == tmp_path


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDLEDGER_DAEMON__TICK", "2s")
    monkeypatch.setenv("SENDLEDGER_STORE__URL", "postgresql://u@h/db")
    monkeypatch.setenv("SENDLEDGER_PROVIDERS__SUPPORT__USER", "other@example.com")
    settings = load_settings(write(tmp_path))
    assert settings.daemon.tick == 2.0
    assert settings.store.url == "postgresql://u@h/db"
    assert isinstance(settings.providers["support"], GmailProviderSettings)
    assert settings.providers["support"].user == "other@example.com"
    assert settings.providers["support"].timeout == 5.0  # the rest of the section stays


def test_config_location_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDLEDGER_CONFIG", str(tmp_path / "env.toml"))
    assert config_path_from("explicit.toml") == Path("explicit.toml")
    assert config_path_from(None) == tmp_path / "env.toml"
    monkeypatch.delenv("SENDLEDGER_CONFIG")
    assert config_path_from(None) == Path("sendledger.toml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CONFIG + "\n[extra]\nx = 1\n", "extra: unknown key"),
        (CONFIG.replace('tick = "250ms"', 'tik = "250ms"'), "daemon.tik: unknown key"),
        (CONFIG.replace('tick = "250ms"', 'tick = "soon"'), "daemon.tick"),
        (CONFIG.replace('timeout = "5s"', 'timeout = "5s"\nkind = "imap"'), "kind"),
        (CONFIG.replace('credentials_file = "sa.json"\n', ""), "credentials_file"),
        ("[store\nurl=1", "not valid TOML"),
        # Deeper than tomllib's recursion: a RecursionError was exit 1 naming no file.
        ("x = " + "[" * 50_000 + "]" * 50_000, "not valid TOML: nested too deeply"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text))
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert str(tmp_path / "sendledger.toml") in message


def test_a_bad_environment_override_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SENDLEDGER_DAEMON__CONCURRENCY", "0")
    with pytest.raises(ConfigError, match=re.escape("daemon.concurrency")):
        load_settings(write(tmp_path))


def test_missing_config_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "nope.toml"))):
        load_settings(tmp_path / "nope.toml")


def test_a_required_key_missing_from_a_section_the_environment_defines_names_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sendledger.toml"
    config.write_text('[store]\nurl = "sqlite:///l.sqlite"\n', encoding="utf-8")
    monkeypatch.setenv("SENDLEDGER_PROVIDERS__X__KIND", "gmail")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert str(caught.value).startswith(
        "SENDLEDGER_PROVIDERS__X__CREDENTIALS_FILE: providers.x.credentials_file:"
    )


def test_send_via_defaults_to_messages_and_takes_drafts(tmp_path: Path) -> None:
    support = load_settings(write(tmp_path)).providers["support"]
    assert isinstance(support, GmailProviderSettings) and support.send_via == "messages"
    drafts = CONFIG.replace('timeout = "5s"', 'timeout = "5s"\nsend_via = "drafts"')
    support = load_settings(write(tmp_path, drafts)).providers["support"]
    assert isinstance(support, GmailProviderSettings) and support.send_via == "drafts"
    bad = CONFIG.replace('timeout = "5s"', 'timeout = "5s"\nsend_via = "draft"')
    with pytest.raises(ConfigError, match=re.escape("providers.support.send_via")):
        load_settings(write(tmp_path, bad))


# -- secret files and variables (docs/configuration.md) ------------------------------------


def model_keys() -> set[tuple[str, str]]:
    """(kind, key as docs/configuration.md writes it) of every setting."""
    keys = {
        ("", f"{prefix}.{field}")
        for prefix, model in SECTIONS.items()
        for field in model.model_fields
    }
    return keys | {(k, f"providers.NAME.{f}") for k, m in KINDS.items() for f in m.model_fields}


def file_settings() -> set[str]:
    return {key for _, key in model_keys() if key.endswith("_file")}


def variable(key: str) -> str:
    return "SENDLEDGER_" + key.replace("NAME", "x").replace(".", "__").upper()


def test_scope_lease_is_twice_deadline_grace_at_least_1s_unless_set() -> None:
    """docs/configuration.md's default for `daemon.scope_lease`, and its floor."""
    assert DaemonSettings(deadline_grace=10.0).scope_lease_seconds == 20.0
    assert DaemonSettings(deadline_grace=0.1).scope_lease_seconds == 1.0
    assert DaemonSettings(deadline_grace=0.1, scope_lease=0.5).scope_lease_seconds == 0.5
    with pytest.raises(ValueError, match=r"0\.5s is shorter than twice deadline_grace"):
        DaemonSettings(deadline_grace=1.0, scope_lease=0.5)


def test_every_secret_file_setting_is_warned_about(tmp_path: Path) -> None:
    """The daemon's start-up warning covers every `*_file` setting (secret_files), and a
    file only its owner can use is not warned about."""
    names = ("gmail", "smtp", "graph")
    settings = settings_from_dict(
        {
            "store": {"encryption_key_file": "store.key"},
            "api": {"token_file": "api-tokens"},
            "providers": {
                "gmail": {**STUBS[GmailProviderSettings]},
                "smtp": {**STUBS[SmtpImapProviderSettings]},
                "graph": {**STUBS[GraphProviderSettings]},
                "cert": {
                    **STUBS[GraphProviderSettings],
                    "client_secret_file": None,
                    "certificate_file": "graph.pem",
                },
            },
            "webhooks": {"ops": {**STUBS[WebhookSettings]}},
        },
        config_path=tmp_path / "sendledger.toml",
    )
    listed = dict(secret_files(settings))
    covered = {re.sub(r"^(providers|webhooks)\.[^.]+\.", r"\1.NAME.", s) for s in listed}
    assert covered == file_settings()
    assert set(names) <= {s.split(".")[1] for s in listed if s.startswith("providers.")}
    for path in listed.values():
        path.write_text("x\n", encoding="utf-8")
        path.chmod(0o600)
    assert warn_exposed_secrets(settings) == []
    for path in listed.values():
        path.chmod(0o640)
    assert sorted(warn_exposed_secrets(settings)) == sorted(listed.values())


def test_every_key_has_its_variable() -> None:
    """ "Every key can be overridden by SENDLEDGER_<SECTION>__<KEY>": no key's variable is
    refused as unknown."""
    for _, key in model_keys():
        assert environment.unknown_variable({variable(key): "1"}, Settings) is None, key


@pytest.mark.parametrize(
    ("key", "value", "read"),
    [
        ("store.url", "sqlite:///env.sqlite", lambda s: s.store.url),
        ("daemon.tick", "2s", lambda s: s.daemon.tick),
        ("api.max_body", "1KB", lambda s: s.api.max_body),
        ("retention.every", "1h", lambda s: s.retention.every),
        ("providers.NAME.timeout", "5s", lambda s: s.providers["x"].timeout),
        ("webhooks.NAME.timeout", "5s", lambda s: s.webhooks["x"].timeout),
    ],
)
def test_a_variable_overrides_the_file(
    key: str, value: str, read: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sendledger.toml"
    config.write_text(
        '[store]\nurl = "sqlite:///file.sqlite"\n[daemon]\ntick = "1s"\n'
        '[providers.x]\ncredentials_file = "sa.json"\ntimeout = "1s"\n'
        '[webhooks.x]\nurl = "https://h.example.com/"\nsecret_file = "s"\ntimeout = "1s"\n',
        encoding="utf-8",
    )
    before = read(load_settings(config))
    monkeypatch.setenv(variable(key), value)
    after = read(load_settings(config))
    assert after != before
    section, _, field = key.rpartition(".")
    model = KINDS["gmail"] if section == "providers.NAME" else SECTIONS[section]
    assert after == getattr(model.model_validate({**STUBS.get(model, {}), field: value}), field)


def test_a_password_or_client_secret_is_the_files_first_line(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("first line\nsecond line\n", encoding="utf-8")
    assert read_password_file(path) == "first line"
    assert read_client_secret(path) == "first line"


@pytest.mark.parametrize(
    ("kind", "setting"),
    [
        ("gmail", "credentials_file"),
        ("smtp-imap", "password_file"),
        ("graph", "client_secret_file"),
    ],
)
def test_a_fifo_as_a_providers_secret_is_refused_in_the_pages_words(
    kind: str, setting: str, tmp_path: Path
) -> None:
    """The example message of "Files", for every kind's secret: refused naming the
    setting and what the file is, without opening it for a blocking read."""
    fifo = tmp_path / "secret"
    os.mkfifo(fifo)
    model = KINDS[kind]
    config = {**STUBS.get(model, {}), setting: "secret"}
    settings = settings_from_dict(
        {"providers": {"support": config}}, config_path=tmp_path / "sendledger.toml"
    )
    with pytest.raises(ConfigError) as caught:
        build_provider(settings, "support")
    assert str(caught.value) == (
        f"providers.support.{setting}: cannot read {fifo}: a named pipe (FIFO), not a regular file"
    )


def test_a_token_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    """`run` and `api` call `warn_exposed_secrets` at start-up
    (tests/e2e/test_api_tokens.py runs `api`); the token file is one of the secrets."""
    tokens = tmp_path / "api-tokens"
    tokens.write_text("shop:0123456789abcdef-shop\n", encoding="utf-8")
    config = settings_from_dict(
        {"api": {"listen": "127.0.0.1:8025", "token_file": "api-tokens"}},
        config_path=tmp_path / "c.toml",
    )
    tokens.chmod(0o644)
    assert warn_exposed_secrets(config) == [tokens]
    tokens.chmod(0o600)
    assert warn_exposed_secrets(config) == []
    for door in (runtime, api_server):
        assert door.__file__ is not None
        assert "warn_exposed_secrets(" in Path(door.__file__).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SENDLEDGER_API__TRUSTED_HOSTS", "review.example.com"),
        ("SENDLEDGER_WEBHOOKS__X__EVENTS", "confirmed,review"),
        ("SENDLEDGER_API__TRUSTED_HOSTS", '["review.example.com"'),
    ],
)
def test_a_list_set_by_a_variable_that_is_not_json_names_the_variable(
    name: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list in the environment is JSON (`["a", "b"]`); written as in a shell
    (`a,b`, one bare value) the error names the variable, as for every other bad value
    (docs/configuration.md "Configuration"), not "environment" and the section."""
    config = tmp_path / "sendledger.toml"
    config.write_text(
        '[webhooks.x]\nurl = "https://h.example.com/"\nsecret_file = "s"\n', encoding="utf-8"
    )
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    message = str(caught.value)
    assert message.startswith(f"{name}: "), message
    assert "JSON" in message and "\n" not in message
