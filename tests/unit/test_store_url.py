"""Store URLs: SQLite relative/absolute paths, PostgreSQL, memory, and clear errors naming
store.url."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.stores.url import (
    MemoryStore,
    PostgresStore,
    SqliteStore,
    StoreUrlError,
    parse_store_url,
)


def test_sqlite_three_slashes_is_relative_to_base_dir(tmp_path: Path) -> None:
    spec = parse_store_url("sqlite:///ledger.sqlite", base_dir=tmp_path)
    assert spec == SqliteStore(path=tmp_path / "ledger.sqlite")
    nested = parse_store_url("sqlite:///data/ledger.sqlite", base_dir=tmp_path)
    assert nested == SqliteStore(path=tmp_path / "data" / "ledger.sqlite")


def test_sqlite_relative_without_base_dir_uses_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = parse_store_url("sqlite:///ledger.sqlite")
    assert isinstance(spec, SqliteStore)
    assert spec.path == Path.cwd() / "ledger.sqlite"


def test_sqlite_four_slashes_is_absolute(tmp_path: Path) -> None:
    spec = parse_store_url("sqlite:////var/lib/sendledger/ledger.sqlite", base_dir=tmp_path)
    assert spec == SqliteStore(path=Path("/var/lib/sendledger/ledger.sqlite"))
    assert spec.describe() == "sqlite:/var/lib/sendledger/ledger.sqlite"


def test_sqlite_scheme_is_case_insensitive_and_url_is_stripped(tmp_path: Path) -> None:
    spec = parse_store_url("  SQLite:///x.sqlite \n", base_dir=tmp_path)
    assert spec == SqliteStore(path=tmp_path / "x.sqlite")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///:memory:", "in-memory SQLite store would lose every job"),
        ("sqlite://", "use sqlite:///relative/path or sqlite:////absolute/path"),
        ("sqlite:///", "use sqlite:///relative/path or sqlite:////absolute/path"),
        ("sqlite://ledger.sqlite", "use sqlite:///relative/path"),
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("ledger.sqlite", "not a URL"),
        ("mysql://u@h/db", "unsupported scheme 'mysql'"),
        ("postgresql://u@[::1/db", "not a URL"),
        ("postgresql://u:p@[::1/db", "not a URL"),
        ("postgresql://u@h/db?schema=a%00b", "NUL"),
        ("postgresql://u%00x@h/db", "NUL"),
        ("postgresql://u@h/d%00b", "NUL"),
        ("sqlite:////tmp/a%00b", "NUL"),
    ],
)
def test_bad_urls_are_refused_naming_store_url(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError, match=message) as info:
        parse_store_url(url)
    assert str(info.value).startswith("store.url: ")


def test_postgresql_with_every_part() -> None:
    spec = parse_store_url("postgresql://ledger:s3cret@db.internal:5433/sendledger?schema=tenant_1")
    assert spec == PostgresStore(
        dbname="sendledger",
        host="db.internal",
        port=5433,
        user="ledger",
        password="s3cret",
        schema="tenant_1",
    )


def test_postgresql_defaults() -> None:
    spec = parse_store_url("postgresql://db.internal/sendledger")
    assert spec == PostgresStore(
        dbname="sendledger",
        host="db.internal",
        port=5432,
        user="postgres",
        password="",
        schema="public",
    )


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg", "PostgreSQL"])
def test_postgresql_scheme_spellings(scheme: str) -> None:
    spec = parse_store_url(f"{scheme}://u@h:5432/db")
    assert isinstance(spec, PostgresStore)
    assert (spec.user, spec.host, spec.dbname) == ("u", "h", "db")


def test_postgresql_percent_escapes_are_decoded() -> None:
    spec = parse_store_url("postgresql://u:p%40ss%3Aw@h/my%20db")
    assert isinstance(spec, PostgresStore)
    assert spec.password == "p@ss:w"
    assert spec.dbname == "my db"


def test_postgresql_host_from_query_for_unix_sockets() -> None:
    spec = parse_store_url("postgresql:///sendledger?host=/run/postgresql")
    assert isinstance(spec, PostgresStore)
    assert spec.host == "/run/postgresql"
    default = parse_store_url("postgresql:///sendledger")
    assert isinstance(default, PostgresStore)
    assert default.host == "/var/run/postgresql"


@pytest.mark.parametrize(
    "url", ["postgresql://u:s3cret@h:5432/", "postgresql://u:s3cret@h", "postgresql://h:5432"]
)
def test_postgresql_missing_database_name(url: str) -> None:
    with pytest.raises(StoreUrlError, match="the database name is missing") as info:
        parse_store_url(url)
    assert str(info.value).startswith("store.url: ")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("port", ["abc", "99999", "-1"])
def test_postgresql_bad_port(port: str) -> None:
    with pytest.raises(StoreUrlError, match="bad port") as info:
        parse_store_url(f"postgresql://u:s3cret@h:{port}/db")
    assert str(info.value).startswith("store.url: ")
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


def test_postgresql_unknown_query_parameter() -> None:
    with pytest.raises(StoreUrlError, match="unknown parameter 'sslmode'") as info:
        parse_store_url("postgresql://u:s3cret@h/db?schema=x&sslmode=require")
    assert str(info.value).startswith("store.url: ")
    assert "s3cret" not in str(info.value)


def test_describe_never_shows_the_password() -> None:
    spec = parse_store_url("postgresql://ledger:s3cret@db.internal:5433/sendledger")
    assert spec.describe() == "postgresql://ledger@db.internal:5433/sendledger"
    assert "s3cret" not in spec.describe()


def test_repr_never_shows_the_password() -> None:
    spec = parse_store_url("postgresql://ledger:s3cret@db.internal:5433/sendledger")
    assert "s3cret" not in repr(spec)
    assert "s3cret" not in str(spec)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("memory://", None),
        ("memory:///", None),
        ("MEMORY://", None),
        ("memory://tests", "tests"),
        ("  memory://tests \n", "tests"),
        ("memory://a%20b", "a b"),
    ],
)
def test_memory_urls(url: str, name: str | None) -> None:
    spec = parse_store_url(url)
    assert spec == MemoryStore(name=name)
    assert spec.describe() == f"memory://{name or ''}"


def test_memory_is_not_a_sqlite_path() -> None:
    # SQLite's own in-memory database is still refused: it would lose every job; the
    # memory backend is asked for by name.
    with pytest.raises(StoreUrlError, match="in-memory SQLite store would lose every job"):
        parse_store_url("sqlite:///:memory:")
    with pytest.raises(StoreUrlError, match="in-memory SQLite store would lose every job"):
        parse_store_url("sqlite:///%3Amemory%3A")
    with pytest.raises(StoreUrlError, match="not a URL"):
        parse_store_url("memory")


def test_a_url_that_cannot_be_split_never_shows_its_password() -> None:
    with pytest.raises(StoreUrlError) as info:
        parse_store_url("postgresql://u:s3cret@[::1/db")
    assert "s3cret" not in str(info.value) and "[::1/db" in str(info.value)
