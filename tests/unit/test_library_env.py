"""eventsourcing's own environment variables never change what sendledger writes
(`ledger.stores.library_env`): each is refused by name, and the ledger's settings never
come from the process environment."""

from __future__ import annotations

import re
from pathlib import Path

import eventsourcing
import pytest
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.utils import get_topic
from tests.unit.engine_rig import policy

from ledger.application import Ledger
from ledger.content import parse_job
from ledger.stores.cipher import new_key
from ledger.stores.key_ring import KeyRingCipher
from ledger.stores.library_env import (
    LIBRARY_VARIABLES,
    READ_BY_SENDLEDGER,
    LibraryVariableSet,
    library_variables_in,
)
from ledger.stores.memory import discard_memory_store

LIBRARY = Path(eventsourcing.__file__).parent
#: Read by the library but unrelated to what is stored.
UNRELATED = {"EVENTSOURCING_DISABLE_REDEFINITION_CHECK", "SPHINX_BUILD"}


def names_the_library_reads() -> set[str]:
    names = set()
    for path in LIBRARY.rglob("*.py"):
        if "tests" in path.relative_to(LIBRARY).parts:
            continue
        text = path.read_text(encoding="utf-8")
        # Class constants naming a setting (`CIPHER_TOPIC = "CIPHER_TOPIC"`, possibly
        # wrapped in parentheses), and literal look-ups.
        names.update(re.findall(r'^\s+[A-Z_]+ = \(?\s*"([A-Z][A-Z_]+)"', text, re.M))
        names.update(re.findall(r'(?:env|environ)\.get\(\s*"([A-Z][A-Z_]+)"', text))
        names.update(re.findall(r'getenv\(\s*"([A-Z][A-Z_]+)"', text))
        names.update(re.findall(r'"([A-Z][A-Z_]+)" in os\.environ', text))
    return names


def test_every_variable_the_installed_library_reads_is_listed() -> None:
    read = names_the_library_reads()
    assert {"CIPHER_KEY", "COMPRESSOR_TOPIC", "TZINFO_TOPIC", "POSTGRES_PASSWORD"} <= read
    missing = read - LIBRARY_VARIABLES - READ_BY_SENDLEDGER - UNRELATED
    assert missing == set()


@pytest.mark.parametrize("name", sorted(LIBRARY_VARIABLES))
def test_each_library_variable_is_refused_by_name(name: str) -> None:
    for variable in (name, f"SENDLEDGER_{name}"):
        with pytest.raises(LibraryVariableSet, match=rf"environment variable {variable} is set"):
            Ledger("memory://", environ={"HOME": "/x", variable: "anything"})


def test_what_sendledger_reads_itself_and_other_variables_pass() -> None:
    assert library_variables_in({"POSTGRES_ENABLE_DB_FUNCTIONS": "n", "PGPASSWORD": "x"}) == []
    assert library_variables_in({"SENDLEDGER_POSTGRES_ENABLE_DB_FUNCTIONS": "n"}) != []
    Ledger("memory://", environ={"POSTGRES_ENABLE_DB_FUNCTIONS": "n"}).close()


def test_the_process_environment_never_reaches_eventsourcing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Even where the refusal is not asked for (environ given), nothing is read from it.
    monkeypatch.setenv("COMPRESSOR_TOPIC", get_topic(ZlibCompressor))
    monkeypatch.setenv("AGGREGATE_CACHE_MAXSIZE", "1000")
    monkeypatch.setenv("SENDLEDGER_IS_SNAPSHOTTING_ENABLED", "y")
    with Ledger("memory://", environ={}) as ledger:
        assert ledger.mapper.compressor is None
        assert ledger.repository.cache is None
        assert ledger.snapshots is None
        assert "COMPRESSOR_TOPIC" not in ledger.env
    with pytest.raises(LibraryVariableSet, match="AGGREGATE_CACHE_MAXSIZE"):
        Ledger("memory://")


def test_jobs_written_beside_library_variables_read_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    sender = policy("receipts").sender
    job = parse_job(
        {"channel": "receipts", "key": "k", "to": "a@x.org", "subject": "s", "body": "b"}
    )
    monkeypatch.setenv("COMPRESSOR_TOPIC", get_topic(ZlibCompressor))
    monkeypatch.setenv("CIPHER_TOPIC", get_topic(KeyRingCipher))
    monkeypatch.setenv("CIPHER_KEY", new_key())
    try:
        with Ledger("memory://library-env", environ={}) as writer:
            writer.submit(job, sender)
        for name in ("COMPRESSOR_TOPIC", "CIPHER_TOPIC", "CIPHER_KEY"):
            monkeypatch.delenv(name)
        with Ledger("memory://library-env") as reader:
            assert reader.get_job("k").content.subject == "s"
    finally:
        discard_memory_store("library-env")
