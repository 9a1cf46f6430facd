"""A Ctrl-C during `sendledger admin copy-store`'s last steps (docs/operations.md "Moving
to PostgreSQL"): before the finished mark it stops the copy, exit 130, unfinished; from
the mark on the copy is whole and verified, so it is finished, exit 0, and the command
says on stderr that the Ctrl-C came too late to stop it; a second Ctrl-C after the mark,
before the source's end is read once more, takes the mark back, and the command reads
what a second Ctrl-C left to say it. The signal is raised in
the process by a hook at each point (`signal.raise_signal` runs its handler at once), on
SQLite files."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.test_copy_store import at, at_the_mark, fill

import daemon.service_layer.copy_store as copying
from daemon.cli import main
from daemon.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from ledger.application import Ledger
from ledger.stores.causes import StoreUnavailable
from ledger.stores.keycheck import SqlKeyChecks, UnfinishedCopy


def a_store_and_its_config(tmp_path: Path) -> Path:
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=at) as source:
        fill(source, ["requested"] * 3)
    config = tmp_path / "sendledger.toml"
    config.write_text('[store]\nurl = "sqlite:///ledger.sqlite"\n')
    return config


def copy(config: Path) -> int:
    return main(["--config", str(config), "admin", "copy-store", "--to", "sqlite:///copy.sqlite"])


def ctrl_c(times: int = 1) -> Callable[[], None]:
    def press() -> None:
        for _ in range(times):
            signal.raise_signal(signal.SIGINT)

    return press


def test_a_ctrl_c_after_the_last_check_leaves_the_copy_finished_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pressed as the finished mark is written: the copy is verified, and stopping it
    would throw a sound copy away. It finishes (exit 0, its lines), and stderr says the
    Ctrl-C did not stop it. Before, the Ctrl-C was passed over without a word."""
    config = a_store_and_its_config(tmp_path)
    pressed = at_the_mark(monkeypatch, SqlKeyChecks, ctrl_c())
    assert copy(config) == EXIT_OK
    assert pressed
    said = capsys.readouterr()
    assert said.out.startswith("copied 4 events from ")
    assert "Ctrl-C came after the copy's last check: not stopped, " in said.err
    assert said.err.rstrip().endswith("copy.sqlite is a finished copy, verified")
    monkeypatch.undo()
    with Ledger(f"sqlite:///{tmp_path / 'copy.sqlite'}") as made:
        assert made.recorder.max_notification_id() == 4


def test_a_ctrl_c_during_the_checks_before_the_mark_stops_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pressed while the copy asks whether anything wrote to the source since it began
    (which may wait `[store] lock_timeout` for a save in flight): the copy is not yet
    checked, and it stops unmarked, exit 130. Before, it was ignored: exit 0, "copied"."""
    config = a_store_and_its_config(tmp_path)
    check = copying._refuse_writers_since

    def pressed_during(*args: object) -> None:
        ctrl_c()()
        check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(copying, "_refuse_writers_since", pressed_during)
    assert copy(config) == EXIT_INTERRUPTED
    said = capsys.readouterr()
    assert said.out == ""
    assert "interrupted: 4 of 4 events copied; " in said.err
    with pytest.raises(UnfinishedCopy):
        Ledger(f"sqlite:///{tmp_path / 'copy.sqlite'}")


def test_a_second_ctrl_c_after_the_mark_takes_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two presses as the mark is written: the second interrupts at once (exit 130),
    before the source's end is read once more, and the mark is taken back: nothing opens
    the copy. Before, the mark stayed, and a copy the command called interrupted, its
    last check never made, opened as finished."""
    config = a_store_and_its_config(tmp_path)
    pressed = at_the_mark(monkeypatch, SqlKeyChecks, ctrl_c(times=2))
    assert copy(config) == EXIT_INTERRUPTED
    assert pressed
    said = capsys.readouterr()
    assert "copied" not in said.out
    assert said.err.endswith(
        "copy.sqlite is marked an unfinished copy, which nothing opens: empty it (remove the "
        "SQLite file, or drop the PostgreSQL schema) and copy again\n"
    )
    monkeypatch.undo()
    with pytest.raises(UnfinishedCopy):
        Ledger(f"sqlite:///{tmp_path / 'copy.sqlite'}")


def test_a_second_ctrl_c_once_the_copy_is_finished_says_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two presses once the last read has passed, before the command prints: exit 130,
    and the line says the copy is finished and verified (read from the copy). Before, exit
    130 without a word, and an operator took a sound copy for an unfinished one."""
    config = a_store_and_its_config(tmp_path)
    mark = copying._mark_finished

    def pressed_after(*args: object) -> None:
        mark(*args)  # type: ignore[arg-type]
        ctrl_c(times=2)()

    monkeypatch.setattr(copying, "_mark_finished", pressed_after)
    assert copy(config) == EXIT_INTERRUPTED
    said = capsys.readouterr()
    assert said.out == ""
    assert "sendledger: interrupted after the copy was finished: " in said.err
    assert said.err.rstrip().endswith("copy.sqlite before a daemon starts")
    with Ledger(f"sqlite:///{tmp_path / 'copy.sqlite'}") as made:
        assert made.recorder.max_notification_id() == 4


def test_a_second_ctrl_c_before_the_copy_wrote_says_there_is_nothing_to_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = a_store_and_its_config(tmp_path)
    check = copying._refuse_source

    def pressed_during(*args: object) -> float:
        ctrl_c(times=2)()
        return check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(copying, "_refuse_source", pressed_during)
    assert copy(config) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.endswith("copy.sqlite: nothing to empty\n")
    assert not (tmp_path / "copy.sqlite").exists()


@pytest.mark.parametrize(
    "why",
    [
        StoreUnavailable("postgresql://copy@db:5432/ledger", "cannot connect", OSError("no route")),
        KeyboardInterrupt(),  # a third press while it is read
    ],
    ids=["store-away", "third-ctrl-c"],
)
def test_a_second_ctrl_c_whose_destination_cannot_be_read_still_says_interrupted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    why: BaseException,
) -> None:
    """The destination may be why the copy was interrupted (a server that stopped
    answering mid-copy): reading what the copy left there fails too, or is interrupted
    once more. Exit 130 still, one line saying what is known: nothing opens an unfinished
    copy, and the command run again says what to empty. Before, the read's error was the
    line (`store ...: cannot connect`, exit 1, no word of the interruption), or a third
    press ended the command with no line at all."""
    config = a_store_and_its_config(tmp_path)
    at_the_mark(monkeypatch, SqlKeyChecks, ctrl_c(times=2))

    def unreadable(*args: object) -> str | None:
        raise why

    monkeypatch.setattr(copying, "left_at", unreadable)
    assert copy(config) == EXIT_INTERRUPTED
    said = capsys.readouterr()
    assert said.out == ""
    reason = str(why) or "Ctrl-C again"
    assert said.err.endswith(
        f"\nsendledger: interrupted; what the copy left at sqlite:{tmp_path / 'copy.sqlite'} "
        f"could not be read ({reason}): nothing opens it while it is an unfinished copy, "
        "and the command run again says what to empty\n"
    )
