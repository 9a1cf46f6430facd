"""eventsourcing 9.5's own recorder test cases, run against our recorders: the ones that
write the job index beside the events (ledger.stores.sqlite, .postgres, .memory).

Our recorders override the library's insert path to add the index row; these are the
library's proof that events are still stored, selected and numbered as it promises. The
cases the library does not cover (the index under POSTGRES_ENABLE_DB_FUNCTIONS, rebuilds,
file modes, encryption, the identity lock) are in test_store_hardening.py.

Only the application recorder cases apply: ours are application recorders (notification
ids), and the aggregate recorder cases assert that an insert returns no ids.
The cases' own stress tests (`test_concurrent_no_conflicts`: 100,000 events from ten
threads) are left to the library's suite; everything else runs.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import ApplicationRecorder
from eventsourcing.tests.persistence import ApplicationRecorderTestCase
from tests.conftest import PG_URL, require_postgres

from ledger.application import Ledger
from ledger.stores.memory import MemoryJobIndexRecorder
from ledger.stores.postgres import PostgresJobIndexRecorder
from ledger.stores.sqlite import SQLiteJobIndexRecorder

# STRESS: not collected (None is not a test): 100,000 events from ten threads take
# minutes on 2 cores; the library's own suite runs it against its recorders.


class _Stores:
    """A fresh store per recorder; everything opened is closed and removed at tearDown."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self._ledgers: list[Ledger] = []
        self._undo: list[Any] = []

    def tearDown(self) -> None:
        for ledger in self._ledgers:
            ledger.close()
        for cleanup in reversed(self._undo):
            cleanup()
        super().tearDown()  # type: ignore[misc]

    def _url(self) -> str:
        raise NotImplementedError

    def create_recorder(self) -> ApplicationRecorder:
        ledger = Ledger(self._url())
        self._ledgers.append(ledger)
        recorder = ledger.recorder
        assert isinstance(recorder, ApplicationRecorder)
        return recorder


class _Sqlite(_Stores):
    def _url(self) -> str:
        folder = TemporaryDirectory()
        self._undo.append(folder.cleanup)
        return f"sqlite:///{Path(folder.name) / 'ledger.sqlite'}"


class _Postgres(_Stores):
    def setUp(self) -> None:
        require_postgres()
        super().setUp()

    def _url(self) -> str:
        schema = f"rc_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')

        def drop() -> None:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        self._undo.append(drop)
        return f"{PG_URL}?schema={schema}"


class _Memory(_Stores):
    def _url(self) -> str:
        return "memory://"


class TestSqliteApplicationRecorder(_Sqlite, ApplicationRecorderTestCase):
    def test_recorder_is_ours(self) -> None:
        assert isinstance(self.create_recorder(), SQLiteJobIndexRecorder)

    test_concurrent_no_conflicts = None  # type: ignore[assignment]  # STRESS


@pytest.mark.postgres
class TestPostgresApplicationRecorder(_Postgres, ApplicationRecorderTestCase):
    """eventsourcing's default insert path (LOCK TABLE, then INSERT): sendledger turns
    POSTGRES_ENABLE_DB_FUNCTIONS on unless the environment says n."""

    functions = "n"

    def setUp(self) -> None:
        super().setUp()
        self._patch = pytest.MonkeyPatch()
        self._patch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", self.functions)
        self._undo.insert(0, self._patch.undo)

    def test_recorder_is_ours(self) -> None:
        assert isinstance(self.create_recorder(), PostgresJobIndexRecorder)

    def test_insert_mode_is_the_one_asked_for(self) -> None:
        recorder = self.create_recorder()
        assert isinstance(recorder, PostgresJobIndexRecorder)
        assert recorder.datastore.enable_db_functions is (self.functions == "y")

    test_concurrent_no_conflicts = None  # type: ignore[assignment]  # STRESS


@pytest.mark.postgres
class TestPostgresApplicationRecorderWithDbFunctions(TestPostgresApplicationRecorder):
    """The same cases with POSTGRES_ENABLE_DB_FUNCTIONS=y (our insert_events override)."""

    functions = "y"


class TestMemoryApplicationRecorder(_Memory, ApplicationRecorderTestCase):
    def test_recorder_is_ours(self) -> None:
        assert isinstance(self.create_recorder(), MemoryJobIndexRecorder)

    test_concurrent_no_conflicts = None  # type: ignore[assignment]  # STRESS


# The abstract bases must not be collected on their own.
del ApplicationRecorderTestCase
