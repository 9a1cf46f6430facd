"""Two releases on one PostgreSQL store, each "release" the current code with its event
format injected (ledger/event_format.py): the start-up of `run` and the commands judge the
store's recorded format through `open_ledger`, the other host's liveness through the
store's clock. Before, nothing was recorded or judged: every open went on (see
tests/unit/test_event_format.py for what an older release then does)."""

from __future__ import annotations

import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.unit.host_config import write_host_config
from tests.unit.test_event_format import a_refused_start_puts_back_only_its_own_row

from daemon.cli import main
from ledger import event_format
from ledger.application import Ledger
from ledger.event_format import Release, check_event_format
from ledger.stores.format_rows import STORE_HOLDER, format_rows_for
from ledger.stores.loaded_policies import DAEMON, LoadedPolicies
from testkit.credentials import write_service_account

pytestmark = pytest.mark.postgres


def host_config(tmp_path: Path, url: str, name: str) -> list[str]:
    """One host's config: its own folder, the shared store, its daemon's name."""
    return ["--config", str(write_host_config(tmp_path / name, url, name=name))]


def run_once(config: list[str]) -> int:
    """`run --once` in this process, which then gets back its SIGHUP handler and its
    root logger: `run` logs to the stderr of its time (this test's captured one, closed
    once the test ends), and a later test's logging wrote to it ("Logging error")."""
    kept = signal.getsignal(signal.SIGHUP)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return main([*config, "run", "--once"])
    finally:
        signal.signal(signal.SIGHUP, kept)
        root.handlers[:], root.level = handlers, level


def test_a_rolling_upgrade_on_postgresql(
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old_host = host_config(tmp_path, pg_url, "a")
    new_host = host_config(tmp_path, pg_url, "b")
    # b's daemon builds its provider before it holds its name and declares: credentials
    # it can load (nothing is asked of the token endpoint at the start).
    write_service_account(tmp_path / "b" / "sa.json", token_uri="http://127.0.0.1:1/token")
    (tmp_path / "b" / "sa.json").chmod(0o600)
    with (tmp_path / "b" / "sendledger.toml").open("a", encoding="utf-8") as config:
        config.write('user = "support@example.com"\n')
    with Ledger(pg_url) as ledger:
        # Host a runs the older release (format 1): started, and announced, by the
        # store's clock.
        check_event_format(ledger, release=Release(1, 1), server=(DAEMON, "a"))
        now = ledger.loaded_policies().now()
        assert now is not None
        name_a = ledger.hold_identity("a")  # held while its daemon runs
        ledger.loaded_policies().write(LoadedPolicies("a", DAEMON, now, now + 60, {}))

        # Host b is upgraded to a release of format 2: its daemon does not start (exit 3,
        # systemd starts it again 5 s later), its commands that only read work.
        monkeypatch.setattr(event_format, "EVENT_FORMAT", 2)
        capsys.readouterr()
        assert run_once(new_host) == 3
        err = capsys.readouterr().err
        assert err.strip().splitlines() == [
            "sendledger: this release writes events of format 2 and this store holds "
            "format 1; live on it: daemon a (reads up to format 1): upgrade or stop those "
            "first"
        ]
        assert main([*new_host, "review", "list"]) == 0
        assert STORE_HOLDER not in format_rows_for(ledger.recorder).rows()  # still 1

        # Host a stops (its row leaves) and a minute passes (its declaration is no
        # longer a start under way): b's next start raises the store to format 2.
        ledger.loaded_policies().leave("a", DAEMON, now)
        name_a.release()
        later = now + event_format.STARTING_SECONDS + 1
        assert check_event_format(ledger, server=(DAEMON, "b"), clock=lambda: later) == 2

    # Host a, forgotten on the older release, starts again: refused, as is each command.
    monkeypatch.setattr(event_format, "EVENT_FORMAT", 1)
    capsys.readouterr()
    line = (
        "sendledger: this store holds events of format 2, this release reads up to 1: "
        "upgrade sendledger on this host"
    )
    assert run_once(old_host) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    for command in (["status", "k1"], ["review", "list"]):
        assert main([*old_host, *command]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [line]


def test_servers_starting_at_once_on_a_fresh_store_all_declare(pg_url: str) -> None:
    # The first writes create the table: PostgreSQL refuses all but one CREATE.
    with Ledger(pg_url) as ledger:
        names = [f"d{i}" for i in range(4)]
        with ThreadPoolExecutor(len(names)) as pool:
            for name in pool.map(
                lambda n: check_event_format(ledger, release=Release(1, 1), server=(DAEMON, n)),
                names,
            ):
                assert name == 1  # each start's store format; none failed
        assert sorted(format_rows_for(ledger.recorder).rows()) == [f"daemon d{i}" for i in range(4)]
        # A stop removes its server's declaration, and no other row.
        rows = format_rows_for(ledger.recorder)
        rows.withdraw(rows.rows()["daemon d0"])
        assert sorted(rows.rows()) == [f"daemon d{i}" for i in (1, 2, 3)]
        # One written since under the holder (another server of that name) is not its own.
        declared = rows.rows()["daemon d1"]
        check_event_format(ledger, release=Release(1, 1), server=(DAEMON, "d1"))
        rows.withdraw(declared)
        assert "daemon d1" in rows.rows()


def test_a_refused_start_puts_back_only_its_own_row_on_postgresql(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        now = ledger.loaded_policies().now()
        assert now is not None
        a_refused_start_puts_back_only_its_own_row(ledger, now)
