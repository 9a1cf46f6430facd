"""`[store]` pool_size, max_overflow, lock_timeout, connect_timeout: validated, PostgreSQL
only, passed to eventsourcing's PostgreSQL environment (and connect_timeout to libpq's
connections outside the pool; docs/performance.md "Performance and scaling")."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.test_settings import clean_env

from daemon.config.settings import ConfigError, settings_from_dict
from daemon.from_settings import store_spec
from ledger.stores.postgres import PostgresBackend, _connect_args
from ledger.stores.url import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_OVERFLOW,
    DEFAULT_POOL_SIZE,
    PostgresStore,
    StoreUrlError,
)

# No SENDLEDGER_* variable of the caller's shell leaks in (an autouse fixture).
assert clean_env

PG = "postgresql://u:pw@db.example.com:5432/mail?schema=s"


def _spec(store: dict[str, object]) -> PostgresStore:
    spec = store_spec(settings_from_dict({"store": store}, config_path=Path("/c/x.toml")))
    assert isinstance(spec, PostgresStore)
    return spec


def _env(store: dict[str, object]) -> dict[str, str]:
    return dict(PostgresBackend(_spec(store)).env)


def test_defaults_reach_the_postgres_environment() -> None:
    env = _env({"url": PG})
    assert env["POSTGRES_POOL_SIZE"] == str(DEFAULT_POOL_SIZE)
    assert env["POSTGRES_MAX_OVERFLOW"] == str(DEFAULT_MAX_OVERFLOW)
    assert env["POSTGRES_LOCK_TIMEOUT"] == str(DEFAULT_LOCK_TIMEOUT)
    assert env["POSTGRES_CONNECT_TIMEOUT"] == str(DEFAULT_CONNECT_TIMEOUT)
    assert _connect_args(_spec({"url": PG}))["connect_timeout"] == DEFAULT_CONNECT_TIMEOUT


def test_configured_values_reach_the_postgres_environment() -> None:
    env = _env({"url": PG, "pool_size": 9, "max_overflow": 0, "lock_timeout": "2s"})
    assert (env["POSTGRES_POOL_SIZE"], env["POSTGRES_MAX_OVERFLOW"]) == ("9", "0")
    assert env["POSTGRES_LOCK_TIMEOUT"] == "2"


def test_connect_timeout_reaches_the_pool_and_libpq() -> None:
    # The pool's wait for a connection (eventsourcing) and libpq's for the connections
    # opened outside the pool (the name's lock, schema checks, VACUUM).
    store: dict[str, object] = {"url": PG, "connect_timeout": "3s"}
    assert _env(store)["POSTGRES_CONNECT_TIMEOUT"] == "3"
    assert _connect_args(_spec(store))["connect_timeout"] == 3


def test_an_environment_variable_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDLEDGER_STORE__POOL_SIZE", "12")
    assert _env({"url": PG})["POSTGRES_POOL_SIZE"] == "12"


@pytest.mark.parametrize("key", ["pool_size", "max_overflow", "lock_timeout", "connect_timeout"])
def test_refused_for_sqlite_naming_the_key(key: str) -> None:
    value = "3s" if key.endswith("_timeout") else 3
    settings = settings_from_dict({"store": {"url": "sqlite:///l.sqlite", key: value}})
    with pytest.raises(StoreUrlError, match=rf"^store\.{key}: only a postgresql:// store"):
        store_spec(settings)


def test_sqlite_without_them_is_fine() -> None:
    settings = settings_from_dict({"store": {"url": "sqlite:///l.sqlite"}})
    assert store_spec(settings).describe().startswith("sqlite:")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("pool_size", 0),
        ("pool_size", 1001),
        ("pool_size", "five"),
        ("max_overflow", -1),
        ("lock_timeout", "500ms"),
        ("lock_timeout", "1.5s"),
        ("lock_timeout", "0s"),
        ("lock_timeout", "2h"),
        ("lock_timeout", "soon"),
        ("connect_timeout", "1s"),  # libpq's least is 2 s
        ("connect_timeout", "2.5s"),
        ("connect_timeout", "1500ms"),
        ("connect_timeout", "0"),
        ("connect_timeout", "2h"),
        ("connect_timeout", "never"),
    ],
)
def test_bad_values_are_one_line_naming_the_field(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_dict({"store": {"url": PG, key: value}}, config_path=Path("/c/x.toml"))
    message = str(caught.value)
    assert message.startswith(f"/c/x.toml: store.{key}: "), message
    assert "\n" not in message


#: The longest stop_timeout, which holds the stop's lock waits of a lock_timeout up to
#: a sixth of it (daemon/config/stop_bound.py).
LONGEST_STOP = {"stop_timeout": "1h"}


@given(st.integers(min_value=1, max_value=600))
def test_every_whole_second_duration_is_accepted(seconds: int) -> None:
    for text in (f"{seconds}s", str(seconds)):
        data = {"store": {"url": PG, "lock_timeout": text}, "daemon": LONGEST_STOP}
        store = settings_from_dict(data).store
        assert store.lock_timeout == seconds


@given(st.text(max_size=12))
def test_any_lock_timeout_text_is_a_value_or_a_config_error(text: str) -> None:
    try:
        data = {"store": {"url": PG, "lock_timeout": text}, "daemon": LONGEST_STOP}
        store = settings_from_dict(data).store
    except ConfigError as exc:
        said = str(exc)
        assert said.startswith("config: store.lock_timeout: ") or (
            said.startswith("config: daemon.stop_timeout: ") and "store.lock_timeout" in said
        ), said
    else:
        assert isinstance(store.lock_timeout, int) and 1 <= store.lock_timeout <= 600


def test_db_functions_are_on_unless_the_environment_says_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POSTGRES_ENABLE_DB_FUNCTIONS", raising=False)
    assert _env({"url": PG})["POSTGRES_ENABLE_DB_FUNCTIONS"] == "y"
    monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", "n")
    assert _env({"url": PG})["POSTGRES_ENABLE_DB_FUNCTIONS"] == "n"


def test_a_connect_timeout_below_libpqs_least_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daemon.cli import main

    config = tmp_path / "sendledger.toml"
    config.write_text(f'[store]\nurl = "{PG}"\nconnect_timeout = "1s"\n', encoding="utf-8")
    # Refused before any connection is tried (the host does not exist).
    assert main(["--config", str(config), "status", "some-key"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "store.connect_timeout" in err, err
    assert "whole seconds from 2s to 1h expected" in err, err


def test_a_stop_timeout_shorter_than_the_stops_lock_waits_is_refused_naming_both() -> None:
    # docs/operations.md "Stopping": six lock waits in a row once the calls have ended.
    data = {"store": {"url": PG, "lock_timeout": "10s"}}
    with pytest.raises(ConfigError) as caught:
        settings_from_dict(data, config_path=Path("/c/x.toml"))
    assert str(caught.value) == (
        "/c/x.toml: daemon.stop_timeout: 35s is shorter than a stop's 6 lock waits of "
        "store.lock_timeout (10s each: 60s); raise daemon.stop_timeout to 60s or lower "
        "store.lock_timeout to 5s"
    )
    fitted = settings_from_dict({**data, "daemon": {"stop_timeout": "60s"}})
    assert fitted.store.lock_timeout == 10 and fitted.daemon.stop_timeout == 60


@pytest.mark.parametrize(
    ("store", "stop", "refused"),
    [
        ({"url": PG}, "35s", False),  # the defaults: 6 x 5 s fit 35 s
        ({"url": PG}, "29s", True),
        ({"url": PG, "lock_timeout": "6s"}, "35s", True),
        ({"url": PG, "lock_timeout": "1s"}, "6s", False),
        ({"url": PG, "lock_timeout": "1s"}, "5s", True),
        ({"url": "sqlite:///x.sqlite"}, "1s", False),  # no session holds a row for long
    ],
)
def test_the_stop_fits_its_lock_waits(store: dict[str, object], stop: str, refused: bool) -> None:
    data = {"store": store, "daemon": {"stop_timeout": stop}}
    if refused:
        with pytest.raises(
            ConfigError, match=r"^config: daemon\.stop_timeout: .*store\.lock_timeout"
        ):
            settings_from_dict(data)
    else:
        settings_from_dict(data)


def test_run_refuses_such_a_configuration_on_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daemon.cli import main

    config = tmp_path / "sendledger.toml"
    config.write_text(f'[store]\nurl = "{PG}"\nlock_timeout = "10s"\n', encoding="utf-8")
    # Refused at load, before a policy is read or a connection tried.
    assert main(["--config", str(config), "run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "daemon.stop_timeout: 35s is shorter than" in err and "store.lock_timeout" in err


def test_an_environment_stop_timeout_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENDLEDGER_DAEMON__STOP_TIMEOUT", "10s")
    with pytest.raises(ConfigError) as caught:
        settings_from_dict({"store": {"url": PG}}, config_path=Path("/c/x.toml"))
    assert str(caught.value).startswith("SENDLEDGER_DAEMON__STOP_TIMEOUT: daemon.stop_timeout: 10s")
    assert "raise daemon.stop_timeout to 30s or lower store.lock_timeout to 1s" in str(caught.value)
