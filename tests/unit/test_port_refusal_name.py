"""A daemon whose API port is taken asks whether its name is held, to say "it runs"
(exit 3) rather than "choose another port" (docs/troubleshooting.md errors 4 and 10):
asked without taking the name, since a daemon of that name starting meanwhile (its port
bound, its name not yet held) would meet the question's hold and be refused, exit 3."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.daemon_thread import daemon_on
from tests.unit.test_event_format import ledger  # noqa: F401  (the fixture: memory, SQLite)

from daemon.config.config_file import ConfigError
from daemon.runtime import Daemon
from ledger.application import Ledger
from ledger.stores import IdentityLock, IdentityTaken
from ledger.stores.loaded_policies import DAEMON, LoadedPolicies


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _daemon_at(opened: Ledger, port: int, folder: Path) -> Daemon:
    """Daemon n1 on `opened`, its API on `port` (its tokens in `folder`), not yet serving."""
    tokens = folder / "api-tokens"
    tokens.write_text("alice:" + "t" * 32 + "\n", encoding="utf-8")
    tokens.chmod(0o600)
    return daemon_on(opened, api={"listen": f"127.0.0.1:{port}", "token_file": str(tokens)})


def refused_without_taking_the_name(opened: Ledger, port: int, folder: Path) -> None:
    """A start of daemon n1 at a taken `port`: the port's line, the name never taken."""
    held: list[str] = []
    hold = opened.hold_identity

    def counted(name: str) -> IdentityLock:
        held.append(name)
        return hold(name)

    opened.hold_identity = counted  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="is in use by another process"):
        _daemon_at(opened, port, folder).serve()
    assert held == []


def refused_as_running(opened: Ledger, port: int, folder: Path) -> None:
    """A start of daemon n1 at a taken `port` while n1 runs: the name's line, in the
    words of the name's own lock (the store's path, not `sqlite:PATH`)."""
    with Ledger(opened.store) as running:
        name = running.hold_identity("n1")  # as the running daemon holds it, and its row
        now = time.time()
        running.loaded_policies().write(LoadedPolicies("n1", DAEMON, now, now + 60, {}))
        with pytest.raises(IdentityTaken) as said:
            _daemon_at(opened, port, folder).serve()
        with pytest.raises(IdentityTaken) as by_the_lock:
            opened.hold_identity("n1")
        name.release()
    assert "'n1' is held by another running daemon" in str(said.value)
    assert str(said.value) == str(by_the_lock.value)


def test_a_start_refused_at_its_port_never_takes_its_name(
    ledger: Ledger,  # noqa: F811
    taken: int,
    tmp_path: Path,
) -> None:
    """The question took the name and let it go: for that instant a daemon of the name
    starting (between its bind and its hold) was refused as a second one, exit 3, and on
    SQLite the lock's descriptor, closed, dropped this process's own locks on the file."""
    refused_without_taking_the_name(ledger, taken, tmp_path)


def test_a_start_refused_at_a_running_daemon_s_port_says_it_runs(
    ledger: Ledger,  # noqa: F811
    taken: int,
    tmp_path: Path,
) -> None:
    refused_as_running(ledger, taken, tmp_path)
