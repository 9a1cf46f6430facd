"""Two releases on one store (ledger/event_format.py, ledger/stores/format_rows.py): the
store records the event format it holds, each server the format its release reads; a
release refuses a store of a newer format, and a newer release raises the store's format
only while no server of an older release is live on it. On the memory store and SQLite,
with the format of each "release" injected and time injected.

Before, nothing was recorded: an older release loaded what a newer one wrote and, on an
event topic it lacked, failed the load of the whole batch of due jobs at every tick
(`could not load N due jobs`), the healthy ones of the batch unsent with it
(`test_an_older_release_never_sends_beside_a_topic_it_lacks`)."""

from __future__ import annotations

import json
import logging
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import eventsourcing.utils
import pytest
from tests.unit.daemon_thread import daemon_on
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.host_config import write_host_config

from daemon.cli import main
from daemon.runtime import start_up
from daemon.service_layer import loaded
from daemon.service_layer.loaded import LIVE_SECONDS
from ledger import event_format
from ledger.application import Ledger
from ledger.event_format import (
    EVENT_FORMAT,
    FORMAT_DIGESTS,
    STARTING_SECONDS,
    OlderReleaseLive,
    Release,
    StoreFormatNewer,
    check_event_format,
    give_back_declaration,
    judge_format,
    shapes_digest,
)
from ledger.job import SendJob
from ledger.stores import IdentityLock, IdentityTaken
from ledger.stores.format_rows import STORE_HOLDER, FormatRow, format_rows_for
from ledger.stores.loaded_policies import API, DAEMON, LoadedPolicies
from ledger.vocabulary import JobState

OLD = Release(reads=1, writes=1)
NEW = Release(reads=2, writes=2)
T0 = 1_800_000_000.0


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    url = (
        f"memory://format-{request.node.name}"
        if request.param == "memory"
        else f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    )
    with Ledger(url) as opened:
        try:
            yield opened
        finally:
            for held in _names.pop(id(opened), []):
                held.release()


#: The daemon names each test's running daemons hold (a daemon's row counts only while
#: its name is held on the store: docs/cli.md "Submit and the running daemons' policies").
_names: dict[int, list[IdentityLock]] = {}


def live_row(ledger: Ledger, name: str, *, kind: str = DAEMON, at: float = T0) -> None:
    """A running server's loaded-policies row, as its announcer writes it, and for a
    daemon its name held, as the running daemon holds it."""
    if kind == DAEMON:
        _names.setdefault(id(ledger), []).append(ledger.hold_identity(name))
    ledger.loaded_policies().write(LoadedPolicies(name, kind, at, at + LIVE_SECONDS, {}))


def stored(ledger: Ledger) -> int | None:
    row = format_rows_for(ledger.recorder).rows().get(STORE_HOLDER)
    return None if row is None else row.format


def test_this_release_s_format_pins_the_shapes_of_its_events_and_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert shapes_digest() == FORMAT_DIGESTS[EVENT_FORMAT], (
        "an event's topic, class version or fields, the index's columns or the job states "
        "changed: raise EVENT_FORMAT and add its digest (docs/operations.md 'Upgrading')"
    )
    # A field added to Checked, as the Eleventh wave added `count` without a class version.
    monkeypatch.setitem(SendJob.Checked.__annotations__, "seen_by", "str")
    assert shapes_digest() != FORMAT_DIGESTS[EVENT_FORMAT]


def test_an_older_release_never_sends_beside_a_topic_it_lacks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What the guard is for, shown on today's engine: a newer release recorded an event
    # whose topic this one lacks (Checked stands in for it), on one job of two.
    with EngineRig(policy("receipts", on_unknown="retry")) as rig:
        rig.submit("receipts", "k1")
        rig.submit("receipts", "k2")
        rig.ledger.update(
            "k1",
            lambda job: job.trigger_event(
                SendJob.Checked, by="x", purpose="check", query="q", provider_message_ids=[]
            ),
        )
        monkeypatch.delitem(eventsourcing.utils._topic_cache, SendJob.Checked.TOPIC)
        monkeypatch.delattr(SendJob, "Checked")
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                assert rig.tick().sent == 0
        assert "could not load 2 due jobs" in caplog.text
        assert rig.ledger.row("k2") is not None
        assert rig.ledger.row("k2").state == JobState.REQUESTED  # type: ignore[union-attr]


def test_a_release_refuses_a_store_of_a_newer_format_and_writes_nothing(ledger: Ledger) -> None:
    assert check_event_format(ledger, release=NEW) == 2  # nobody else: raised at once
    assert stored(ledger) == 2
    message = "this store holds events of format 2, this release reads up to 1: upgrade "
    for writing in (True, False):
        with pytest.raises(StoreFormatNewer) as refused:
            check_event_format(ledger, release=OLD, server=(DAEMON, "old"), writing=writing)
        assert str(refused.value) == message + "sendledger on this host"
    assert stored(ledger) == 2
    assert "daemon old" not in format_rows_for(ledger.recorder).rows()


def test_a_store_without_a_record_holds_the_first_format_and_a_read_creates_nothing(
    ledger: Ledger,
) -> None:
    assert check_event_format(ledger, release=OLD, writing=False) == 1
    assert format_rows_for(ledger.recorder).rows() == {}
    assert check_event_format(ledger, release=OLD) == 1  # nothing to raise: nothing written
    assert format_rows_for(ledger.recorder).rows() == {}


def test_a_newer_release_waits_for_every_older_server_on_the_store(ledger: Ledger) -> None:
    clock = [T0]
    live_row(ledger, "a")  # a server of a release before the record: declares nothing
    check_event_format(ledger, release=OLD, server=(API, "b"), clock=lambda: clock[0])
    live_row(ledger, "b", kind=API)
    with pytest.raises(OlderReleaseLive) as refused:
        check_event_format(ledger, release=NEW, server=(DAEMON, "c"), clock=lambda: clock[0])
    assert str(refused.value) == (
        "this release writes events of format 2 and this store holds format 1; live on it: "
        "api b (reads up to format 1), daemon a (reads up to format 1): upgrade or stop "
        "those first"
    )
    assert refused.value.kind == "conflict"  # exit 3, as a daemon.name a live daemon holds
    assert stored(ledger) is None
    # A command of the newer release that only reads goes on, and raises nothing.
    assert check_event_format(ledger, release=NEW, writing=False) == 1
    # The old servers stop (their rows leave) or their heartbeats run out: raised.
    ledger.loaded_policies().leave("a", DAEMON, T0)
    clock[0] = T0 + max(LIVE_SECONDS, STARTING_SECONDS) + 1
    assert (
        check_event_format(ledger, release=NEW, server=(DAEMON, "c"), clock=lambda: clock[0]) == 2
    )
    assert stored(ledger) == 2


def test_servers_of_the_newer_release_and_the_opener_s_own_rows_do_not_hold_it_back(
    ledger: Ledger,
) -> None:
    clock = lambda: T0  # noqa: E731
    # This daemon's own row, left by a kill -9 a moment ago: its name went with the process
    # (a row whose name a process holds is that process's: another server of this name).
    ledger.loaded_policies().write(LoadedPolicies("c", DAEMON, T0, T0 + LIVE_SECONDS, {}))
    live_row(ledger, "d")  # upgraded already: declared format 2 at its start
    format_rows_for(ledger.recorder).declare(FormatRow("daemon d", 2, T0))
    assert check_event_format(ledger, release=NEW, server=(DAEMON, "c"), clock=clock) == 2


def test_a_server_starting_is_live_before_its_first_heartbeat(ledger: Ledger) -> None:
    # An older daemon that checked the store a moment ago and has not announced itself.
    check_event_format(ledger, release=OLD, server=(DAEMON, "a"), clock=lambda: T0)
    with pytest.raises(OlderReleaseLive):
        check_event_format(ledger, release=NEW, server=(DAEMON, "b"), clock=lambda: T0 + 5)
    later = T0 + STARTING_SECONDS + 1
    assert check_event_format(ledger, release=NEW, server=(DAEMON, "b"), clock=lambda: later) == 2


def test_an_older_server_starting_while_a_newer_one_raises_the_format_stops_one_of_them(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both declare before they read, but the older one reads only the store's format: it
    may declare after the newer one read the declarations and read before the newer one
    raised the format, and then both went on, the older reading a store the newer writes
    format 2 to. The newer one reads the declarations again once it raised the format,
    and refuses to start on seeing one (the older one, refused at its next start)."""
    real = ledger.loaded_policies
    started: list[int] = []

    def the_older_starts_meanwhile() -> Any:
        # Asked by the newer one between its read of the declarations and its raise.
        if not started:
            started.append(
                check_event_format(ledger, release=OLD, server=(DAEMON, "a"), clock=lambda: T0)
            )
        return real()

    monkeypatch.setattr(ledger, "loaded_policies", the_older_starts_meanwhile)
    with pytest.raises(OlderReleaseLive, match=r"live on it: daemon a \(reads up to format 1\)"):
        check_event_format(ledger, release=NEW, server=(DAEMON, "b"), clock=lambda: T0 + 1)
    assert started == [1]  # the older one passed its check: the newer one must not start


def test_a_stop_withdraws_its_server_s_declaration_and_nothing_else(ledger: Ledger) -> None:
    rows = format_rows_for(ledger.recorder)
    declared = FormatRow("daemon a", NEW.reads, T0)
    rows.withdraw(declared)  # a store of an earlier release: nothing created
    assert rows.rows() == {}
    check_event_format(ledger, release=NEW, server=(DAEMON, "a"), clock=lambda: T0)
    assert ledger.format_declaration == declared
    check_event_format(ledger, release=NEW, server=(API, "a"), clock=lambda: T0)
    rows.withdraw(declared)
    assert sorted(rows.rows()) == ["api a", STORE_HOLDER]
    # A declaration written since under the holder is another server's: it stays.
    check_event_format(ledger, release=NEW, server=(DAEMON, "a"), clock=lambda: T0 + 0.1)
    rows.withdraw(declared)
    assert rows.rows()["daemon a"].at == T0 + 0.1


def test_a_newer_release_started_under_a_live_older_server_s_name_raises_nothing(
    ledger: Ledger,
) -> None:
    """An upgraded host started while the old daemon of its name still runs (the name's
    lock refuses it, but only after the open). Its open took the live server of its name
    for its own earlier rows, and raised the format before the refusal: the running
    daemon stopped at its next heartbeat and its restarts were refused, neither sending.
    And the refused start's declaration replaced the live one's, so a third server counted
    the old daemon as reading the newer format. Now: refused, nothing raised, the live
    server's declaration put back."""
    check_event_format(ledger, release=OLD, server=(DAEMON, "a"), clock=lambda: T0)
    kept = format_rows_for(ledger.recorder).rows()["daemon a"]
    live_row(ledger, "a")
    with pytest.raises(OlderReleaseLive, match=r"live on it: daemon a \(reads up to format 1\)"):
        check_event_format(ledger, release=NEW, server=(DAEMON, "a"), clock=lambda: T0 + 1)
    assert stored(ledger) is None  # never raised (a store without the record: format 1)
    assert format_rows_for(ledger.recorder).rows()["daemon a"] == kept
    with pytest.raises(OlderReleaseLive, match=r"live on it: daemon a \(reads up to format 1\)"):
        check_event_format(ledger, release=NEW, server=(DAEMON, "b"), clock=lambda: T0 + 2)


def test_a_start_refused_by_the_name_lock_leaves_the_declarations_as_it_found_them(
    ledger: Ledger,
) -> None:
    """A second daemon of the same release and name (`IdentityTaken`, exit 3) is refused
    by the name's lock. Its open declared its format in place of the live daemon's, and
    the row stayed the refused start's: a fresh declaration, so `admin copy-store` took
    the store for one a server was starting on, and the live daemon's stop, which
    removes only its own, left it there. A daemon now declares only once it holds its
    name (`start_up`): the refused start writes nothing, beside a live daemon that
    declared none (an earlier release) too."""
    check_event_format(ledger, server=(DAEMON, "a"), clock=lambda: T0)
    kept = format_rows_for(ledger.recorder).rows()["daemon a"]
    live_row(ledger, "a")
    live_row(ledger, "b")  # a daemon of a release that declares nothing
    for name in ("a", "b"):
        with Ledger(ledger.store) as second:
            service = daemon_on(second, name=name).service
            with pytest.raises(IdentityTaken):
                start_up(service)
            service.close()
    rows = format_rows_for(ledger.recorder).rows()
    assert rows["daemon a"] == kept
    assert "daemon b" not in rows


def a_refused_start_puts_back_only_its_own_row(ledger: Ledger, now: float) -> None:
    """A start refused after its open puts back the row of its name it replaced (a live
    server's): only while its own is still there. Before, the put-back overwrote whatever
    was there: a process of the name that declared in between (the live one stopped, a
    new one starting) lost its fresh declaration to the old one's, and `admin copy-store`
    no longer saw it starting (it counts declarations of the last minute) and copied
    beside it; its own stop then found nothing of its to remove. Also on PostgreSQL:
    tests/integration/test_two_releases.py."""
    check_event_format(ledger, server=(DAEMON, "a"), clock=lambda: now)  # the live one
    with Ledger(ledger.store) as refused, Ledger(ledger.store) as newer:
        check_event_format(refused, server=(DAEMON, "a"), clock=lambda: now + 1)
        check_event_format(newer, server=(DAEMON, "a"), clock=lambda: now + 2)
        give_back_declaration(refused)
        assert format_rows_for(ledger.recorder).rows()["daemon a"] == newer.format_declaration
        # Its own row still there: the one it replaced (the newer process's) comes back.
        check_event_format(refused, server=(DAEMON, "a"), clock=lambda: now + 3)
        give_back_declaration(refused)
        assert format_rows_for(ledger.recorder).rows()["daemon a"] == newer.format_declaration


def test_a_refused_start_puts_back_only_its_own_row(ledger: Ledger) -> None:
    a_refused_start_puts_back_only_its_own_row(ledger, T0)


def test_a_refused_start_whose_declaration_cannot_be_put_back_is_still_the_name_s_refusal(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing the give-back's write leaves IdentityTaken (exit 3, its line),
    not the store's error as the start's (a start the name refuses has declared nothing
    since the Sixteenth wave: nothing is given back)."""
    check_event_format(ledger, server=(DAEMON, "a"), clock=lambda: T0)
    live_row(ledger, "a")

    def failing(_ledger: Ledger) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(loaded, "give_back_declaration", failing)
    with Ledger(ledger.store) as second:
        service = daemon_on(second, name="a").service
        with pytest.raises(IdentityTaken):
            start_up(service)
        service.close()


def test_the_store_s_format_only_rises(ledger: Ledger) -> None:
    rows = format_rows_for(ledger.recorder)
    rows.raise_to(3, T0)
    rows.raise_to(2, T0 + 1)
    assert stored(ledger) == 3


@pytest.mark.parametrize(
    ("stored_format", "live", "writing", "raised"),
    [
        (1, {}, True, True),
        (2, {"daemon x": 1}, True, False),  # already there: older servers refuse themselves
        (1, {"daemon x": 2}, True, True),
        (1, {"daemon x": 1}, False, False),
    ],
)
def test_the_judgement(
    stored_format: int, live: dict[str, int], writing: bool, raised: bool
) -> None:
    assert judge_format(stored_format, NEW, live, writing=writing) is raised


# -- at the command line ------------------------------------------------------------------


def config_with_store(tmp_path: Path) -> Path:
    config = write_host_config(tmp_path, "sqlite:///ledger.sqlite")
    job = {"channel": "receipts", "key": "k1", "to": "a@example.com", "subject": "s", "body": "b"}
    (tmp_path / "job.json").write_text(json.dumps(job))
    return config


def test_every_command_of_an_older_release_gives_the_one_line_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_with_store(tmp_path)
    cfg = ["--config", str(config)]
    assert main([*cfg, "submit", str(tmp_path / "job.json")]) == 0, capsys.readouterr().err
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        newer = Release(EVENT_FORMAT + 1, EVENT_FORMAT + 1)
        check_event_format(ledger, release=newer)  # a newer release wrote to it since
    capsys.readouterr()
    line = (
        f"this store holds events of format {EVENT_FORMAT + 1}, this release reads up to "
        f"{EVENT_FORMAT}: upgrade sendledger on this host"
    )
    commands = [
        ["submit", str(tmp_path / "job.json")],
        ["status", "k1"],
        ["history", "k1"],
        ["review", "list"],
        ["cancel", "k1"],
        ["audit"],
    ]
    for command in commands:
        assert main([*cfg, *command]) == 2, command
        err = capsys.readouterr().err
        assert err.strip().splitlines() == [f"sendledger: {line}"], (command, err)


def test_a_newer_command_that_writes_waits_for_the_older_daemon_and_one_that_reads_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_with_store(tmp_path)
    cfg = ["--config", str(config)]
    assert main([*cfg, "submit", str(tmp_path / "job.json")]) == 0, capsys.readouterr().err
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        live_row(ledger, "old", at=time.time())  # a daemon of this release, running
    # The command is a newer release's (the daemon declared none: it reads format 1).
    monkeypatch.setattr(event_format, "EVENT_FORMAT", EVENT_FORMAT + 1)
    capsys.readouterr()
    assert main([*cfg, "status", "k1"]) == 0
    assert main([*cfg, "cancel", "k1"]) == 3
    err = capsys.readouterr().err
    assert "daemon old (reads up to format 1): upgrade or stop those first" in err


def test_an_api_refused_after_its_port_is_bound_leaves_the_store_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sendledger api` whose heartbeat cannot start (`announce_policies` fails: no
    thread to be had, the store gone) after its port is bound. Before, its declaration
    stayed: a fresh row counted as a server starting, `admin copy-store` refused the
    store for a minute, and over a live `api` of its name, that one's stop left it."""
    config = write_host_config(tmp_path, "sqlite:///ledger.sqlite", name="a")
    (tmp_path / "api-tokens").write_text("alice:" + "t" * 32 + "\n", encoding="utf-8")
    (tmp_path / "api-tokens").chmod(0o600)
    with config.open("a") as appended:
        appended.write('[api]\ntoken_file = "api-tokens"\n')

    def no_thread(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(loaded, "announce_policies", no_thread)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # `api` sets its SIGHUP handler and the root logger's: this process gets its own back.
    kept, root = signal.getsignal(signal.SIGHUP), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        code = main(["--config", str(config), "api", "--listen", f"127.0.0.1:{port}"])
    finally:
        signal.signal(signal.SIGHUP, kept)
        root.handlers[:], root.level = handlers, level
    assert code == 1  # the failure's own line, as before
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        assert "api a" not in format_rows_for(ledger.recorder).rows()
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # let go
