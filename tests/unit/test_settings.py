"""Settings: TOML file, SENDLEDGER_<SECTION>__<KEY> overrides, strictness, paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.config.settings import ConfigError, config_path_from, load_settings

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
    assert load_settings(write(tmp_path)).providers["support"].send_via == "messages"
    drafts = CONFIG.replace('timeout = "5s"', 'timeout = "5s"\nsend_via = "drafts"')
    assert load_settings(write(tmp_path, drafts)).providers["support"].send_via == "drafts"
    bad = CONFIG.replace('timeout = "5s"', 'timeout = "5s"\nsend_via = "draft"')
    with pytest.raises(ConfigError, match=re.escape("providers.support.send_via")):
        load_settings(write(tmp_path, bad))
