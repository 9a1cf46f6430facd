"""The `[store]` section read without the settings model (`daemon/config/store_section.py`):
it takes only what the model would take unchanged, and everything else goes through the
model, with the model's refusal."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.config.settings import ConfigError, Settings, StoreSettings, settings_from_dict
from daemon.config.store_section import (
    PLAIN_STORE_KEYS,
    SECTIONS,
    StoreSection,
    plain_store_config,
)
from daemon.from_settings import settings_for, store_settings_for

CONFIG = Path("/srv/sendledger/sendledger.toml")


def test_the_sections_are_the_models_and_the_defaults_its_defaults() -> None:
    assert set(Settings.model_fields) - {"config_path"} == SECTIONS
    model, plain = StoreSettings(), StoreSection()
    for key in StoreSettings.model_fields:
        assert getattr(plain, key) == getattr(model, key), key


def test_the_plain_keys_are_a_string_and_a_path_the_model_checks_no_further() -> None:
    hints = typing.get_type_hints(StoreSettings)
    assert hints["url"] is str
    assert hints["encryption_key_file"] == Path | None
    checked = {
        field
        for decorator in StoreSettings.__pydantic_decorators__.field_validators.values()
        for field in decorator.info.fields
    }
    assert checked.isdisjoint(PLAIN_STORE_KEYS)
    for key in PLAIN_STORE_KEYS:
        assert StoreSettings.model_fields[key].metadata == [], key


@given(
    url=st.text(),
    key_file=st.none() | st.text(alphabet=st.characters(exclude_characters="\x00")),
    others=st.sets(st.sampled_from(sorted(SECTIONS - {"store"}))),
)
def test_what_the_plain_path_takes_the_model_takes_unchanged(
    url: str, key_file: str | None, others: set[str]
) -> None:
    store = {"url": url} if key_file is None else {"url": url, "encryption_key_file": key_file}
    data = {"store": store, **{key: {} for key in others}}
    plain = plain_store_config({"store": store}, CONFIG, {})
    assert plain is not None
    model = settings_from_dict({"store": store}, config_path=CONFIG).store
    assert plain.store.url == model.url
    assert plain.store.encryption_key_file == model.encryption_key_file
    assert plain.store.postgres_only == model.postgres_only == []
    # Other sections are the other commands' (a table of each, whatever it holds).
    assert plain_store_config(data, CONFIG, {}) == plain


@pytest.mark.parametrize(
    ("data", "environ"),
    [
        ({"store": {"url": "sqlite:///x.sqlite", "pool_size": 3}}, {}),
        ({"store": {"url": 5}}, {}),
        ({"store": "sqlite:///x.sqlite"}, {}),
        ({"stor": {"url": "sqlite:///x.sqlite"}}, {}),
        ({"config_path": "elsewhere.toml"}, {}),
        ({}, {"SENDLEDGER_STORE__URL": "sqlite:///y.sqlite"}),
        ({}, {"sendledger_stor__url": "sqlite:///y.sqlite"}),
        ({}, {"SENDLEDGER_DAEMON__TICK": "soon"}),
    ],
)
def test_anything_else_is_left_to_the_model(
    data: dict[str, typing.Any], environ: dict[str, str]
) -> None:
    assert plain_store_config(data, CONFIG, environ) is None


def test_the_variables_read_outside_the_model_leave_the_plain_path_open() -> None:
    environ = {"SENDLEDGER_CONFIG": "x.toml", "SENDLEDGER_CRASH_POINT": "", "HOME": "/root"}
    assert plain_store_config({}, CONFIG, environ) == plain_store_config({}, CONFIG, {})


def test_a_bad_store_value_is_refused_with_the_models_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.upper().startswith("SENDLEDGER_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "sendledger.toml"
    config.write_text('[store]\nurl = "sqlite:///x.sqlite"\npool_size = 0\n', encoding="utf-8")
    with pytest.raises(ConfigError) as whole:
        settings_for(str(config))
    with pytest.raises(ConfigError) as section:
        store_settings_for(str(config))
    assert str(section.value) == str(whole.value)
    assert "store.pool_size" in str(section.value)

    # A read command reads only [store]: another section is judged by the commands that
    # read it (run, submit, policy check, api).
    config.write_text('[store]\nurl = "sqlite:///x.sqlite"\n[daemon]\ntick = "soon"\n')
    assert store_settings_for(str(config)).store.url == "sqlite:///x.sqlite"
    with pytest.raises(ConfigError, match=r"daemon\.tick"):
        settings_for(str(config))
    # ...unless a SENDLEDGER_* variable is set: every variable is then judged by the model.
    monkeypatch.setenv("SENDLEDGER_STORE__URL", "sqlite:///y.sqlite")
    with pytest.raises(ConfigError, match=r"daemon\.tick"):
        store_settings_for(str(config))
