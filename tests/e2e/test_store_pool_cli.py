"""`[store]` pool_size / max_overflow / lock_timeout as a user meets them on the command
line: set for a SQLite store, or set badly, one line naming the key, exit 2, no store
created."""

from __future__ import annotations

from typing import Any

from tests.e2e.test_cli_intake import job, one_error_line


def test_pool_settings_with_a_sqlite_store_are_refused(cli: Any) -> None:
    cli.config.write_text(
        cli.config.read_text(encoding="utf-8").replace(
            'url = "sqlite:///ledger.sqlite"\n', 'url = "sqlite:///ledger.sqlite"\npool_size = 3\n'
        ),
        encoding="utf-8",
    )
    result = cli.submit(job("pool"))
    assert result.code == 2
    one_error_line(result, "store.pool_size", "only a postgresql:// store")
    assert not (cli.root / "ledger.sqlite").exists()


def test_a_bad_lock_timeout_names_its_variable(cli: Any) -> None:
    result = cli.submit(job("lock"), env={"SENDLEDGER_STORE__LOCK_TIMEOUT": "300ms"})
    assert result.code == 2
    one_error_line(result, "SENDLEDGER_STORE__LOCK_TIMEOUT", "store.lock_timeout", "whole seconds")
    assert not (cli.root / "ledger.sqlite").exists()
