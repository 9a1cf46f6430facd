"""Store URLs: SQLite relative/absolute paths, PostgreSQL, memory, and clear errors naming
store.url."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

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


@pytest.mark.parametrize("port", ["abc", "99999", "-1", "0", "00", "", "+5432", "5_432", " 5432"])
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


@given(st.integers(1, 65535), st.integers(0, 3))
def test_a_port_is_read_as_typed(port: int, zeros: int) -> None:
    spec = parse_store_url(f"postgresql://u@h:{'0' * zeros}{port}/db")
    assert isinstance(spec, PostgresStore) and spec.port == port


@given(st.text(min_size=1, max_size=8).filter(lambda t: "/" not in t and "?" not in t))
@example("0")
@example("000")
@example("\u0665")  # a digit, but not one libpq reads
@example("5432:1")
@example("5_432")
def test_a_port_the_server_would_read_otherwise_is_refused(port: str) -> None:
    """Port 0 went to 5432; whatever is not an ASCII decimal number from 1 to 65535 is
    refused as bad input naming the field, never replaced by another port."""
    if port.isascii() and port.isdigit() and 1 <= int(port) <= 65535:
        return  # a port as typed (test_a_port_is_read_as_typed)
    with pytest.raises(StoreUrlError) as info:
        parse_store_url(f"postgresql://u:s3cret@h:{quote(port, safe=':')}/db")
    assert str(info.value).startswith("store.url: ")
    assert "port" in str(info.value) and "s3cret" not in str(info.value)


@given(
    st.one_of(
        st.from_regex(r"/[A-Za-z0-9_./-]{1,20}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.-]{0,20}", fullmatch=True),
    )
)
@example("/run/PostgreSQL")
@example("DB.Internal")
def test_a_host_is_read_as_typed_percent_escapes_decoded(host: str) -> None:
    """A socket folder in the host was passed on still escaped (`%2Frun%2Fpg`) and
    lowercased: libpq read a host name that does not exist."""
    spec = parse_store_url(f"postgresql://u@{quote(host, safe='')}:5433/db")
    assert isinstance(spec, PostgresStore) and spec.host == host and spec.port == 5433


def test_a_host_given_twice_is_refused() -> None:
    """libpq's query parameters win over the URL's parts: the server would have been the
    query's host, not the one this parser kept."""
    with pytest.raises(StoreUrlError, match="the host is given twice") as info:
        parse_store_url("postgresql://u:s3cret@db.internal/db?host=/run/postgresql")
    assert str(info.value).startswith("store.url: ") and "s3cret" not in str(info.value)


def test_a_home_folder_s_tilde_is_refused_and_a_file_named_with_one_is_not(
    tmp_path: Path,
) -> None:
    """`~/x`, `~ops/x` are a home folder no URL expands; `~old.sqlite` is a file."""
    for url in ("sqlite:///~", "sqlite:///~/a.sqlite", "sqlite:///~ops/a.sqlite"):
        with pytest.raises(StoreUrlError, match="a '~' is not expanded in a URL"):
            parse_store_url(url, base_dir=tmp_path)
    store = parse_store_url("sqlite:///~old.sqlite", base_dir=tmp_path)
    assert isinstance(store, SqliteStore) and store.path == tmp_path / "~old.sqlite"
