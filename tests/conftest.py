"""Fixtures shared by every tier: stores (SQLite file, PostgreSQL schema), clocks."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _pg_unavailable_reason() -> str | None:
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return "psycopg is not installed"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL not reachable at {PG_URL.split('@')[-1]}: {exc}".splitlines()[0]
    return None


_PG_REASON: list[str | None] = []


def require_postgres() -> None:
    """Skip without PostgreSQL, with the reason; under CI a skip is a failure."""
    if not _PG_REASON:
        _PG_REASON.append(_pg_unavailable_reason())
    reason = _PG_REASON[0]
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI is set, PostgreSQL tests must run: {reason}")
    pytest.skip(f"{reason} (set SENDLEDGER_TEST_PG_URL or start PostgreSQL 15)")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema in the test database; dropped afterwards."""
    require_postgres()
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


class FakeClock:
    """Injected time: tests move it instead of sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
