"""`admin copy-store` on memory stores (daemon/service_layer/copy_store.py): every event as
stored, the index rebuilt alike, the webhook positions carried; the refusals (a live server
on the source, a destination that holds events, an unfinished copy) write nothing; an
interrupted copy is refused by every open and by a second copy. SQLite to PostgreSQL is
tests/integration/test_copy_and_backup.py, the command itself tests/e2e/test_cli_copy_store.py."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.engine.policy_holder import PolicyHolder
from daemon.service_layer.copy_store import CopyMismatch, CopyRefused, copy_store, running_on
from daemon.service_layer.loaded import LIVE_SECONDS, announce_policies
from ledger.application import Ledger, Sender
from ledger.content import parse_job
from ledger.decision_types import Confirm, Review
from ledger.event_format import EVENT_FORMAT, Release, StoreFormatNewer, check_event_format
from ledger.job import SendJob
from ledger.stores.format_rows import format_rows_for
from ledger.stores.index import IndexRow
from ledger.stores.keycheck import COPY_FINISHED, COPY_STARTED, KeyCheck, UnfinishedCopy
from ledger.stores.loaded_policies import API, DAEMON, LoadedPolicies
from ledger.stores.memory import MemoryJobIndexRecorder, discard_memory_store
from ledger.stores.url import MemoryStore, SqliteStore, StoreUrlError
from ledger.vocabulary import EscalationReason, PolicyRef
from policies.loader import PolicySet

POLICY = PolicyRef("receipts", "sha256:00")
SENDER = Sender("Support <support@example.com>", "mail.example.com", POLICY)
AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
#: What each job of a history goes through after its request.
STEPS = ("requested", "attempted", "confirmed", "review")


def at() -> datetime:
    """Every store's clock: the jobs' steps are taken at it."""
    return AT


@pytest.fixture
def stores() -> Iterator[tuple[str, str]]:
    names = (f"copy-a-{uuid.uuid4().hex[:8]}", f"copy-b-{uuid.uuid4().hex[:8]}")
    yield names
    for name in names:
        discard_memory_store(name)


def fill(ledger: Ledger, steps: list[str]) -> None:
    """One job per step, each taken that far, and a provider handle."""
    ledger.submit_many(
        [
            (
                parse_job(
                    {
                        "channel": "receipts",
                        "key": f"job-{i}",
                        "to": f"customer{i}@example.net",
                        "subject": f"Receipt {i}",
                        "body": "Thanks",
                    }
                ),
                SENDER,
            )
            for i in range(len(steps))
        ]
    )
    for i, step in enumerate(steps):
        if step != "requested":
            ledger.update(f"job-{i}", lambda j, step=step: take(j, step))  # type: ignore[misc]
    ledger.mark_handle("gmail", lambda handle: None)


def take(job: SendJob, step: str) -> None:
    if step == "review":
        job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="t", at=AT)
        return
    job.claim(provider="gmail", deadline=AT + timedelta(minutes=1), at=AT, daemon="d1")
    if step == "confirmed":
        job.record_response(provider_message_id=f"gm-{job.key}", decision=Confirm(POLICY), at=AT)


def log(ledger: Ledger) -> list[tuple[Any, ...]]:
    """Every event as stored, in notification order, without the ids the store gave."""
    return [
        (str(n.originator_id), n.originator_version, n.topic, n.state)
        for n in ledger.log_after(0, 1 << 62, 1 << 20, ())
    ]


def index(ledger: Ledger) -> list[IndexRow]:
    # `written_at` is when the row was written: the rebuild's time on a copy.
    return [dataclasses.replace(row, written_at=0.0) for row in ledger.jobs()]


def test_every_event_is_copied_as_stored_and_the_index_rebuilt_alike(
    stores: tuple[str, str],
) -> None:
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, list(STEPS) * 3)
        heard: list[tuple[int, int]] = []
        result = copy_store(
            source,
            MemoryStore(target_name),
            page=5,
            progress=lambda copied, total: heard.append((copied, total)),
        )
        with Ledger(f"memory://{target_name}") as target:
            assert log(target) == log(source)
            assert index(target) == index(source)
            assert target.handle("gmail") is not None
            assert {c.kind for c in target.recorder.key_checks()} >= {  # type: ignore[attr-defined]
                COPY_STARTED,
                COPY_FINISHED,
            }
    assert result.finished and result.jobs == 12 and result.aggregates == 13
    assert heard[-1] == (result.events, result.total) and heard[0][0] == 5


def test_a_webhook_keeps_its_place_in_the_log(stores: tuple[str, str]) -> None:
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested", "confirmed"])
        positions = source.positions()
        positions.force("crm", 3, time.time(), expected=0)
        positions.force("audit", 0, time.time(), expected=0)
        result = copy_store(source, MemoryStore(target_name))
        with Ledger(f"memory://{target_name}") as target:
            moved = {row.name: row.position for row in target.positions().read_all()}
    assert moved == {"crm": 3, "audit": 0} and result.webhooks == 2


def test_a_source_a_server_runs_on_is_refused_and_nothing_is_written(
    stores: tuple[str, str],
) -> None:
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"])
        now = time.time()
        name = source.hold_identity("host-a")  # as the running daemon holds its own
        source.loaded_policies().write(LoadedPolicies("host-a", DAEMON, now, now + LIVE_SECONDS))
        assert running_on(source) == [
            f"daemon 'host-a' (heartbeat until {_iso(now + LIVE_SECONDS)})"
        ]
        with pytest.raises(CopyRefused, match=r"in use by daemon 'host-a'.*fork"):
            copy_store(source, MemoryStore(target_name))
        # A row whose heartbeat ended runs nothing; nor one whose name is free (a daemon
        # killed -9 a moment ago, its heartbeat still ahead).
        source.loaded_policies().write(LoadedPolicies("host-a", DAEMON, now, now - 1))
        assert running_on(source) == []
        source.loaded_policies().write(LoadedPolicies("host-a", DAEMON, now, now + LIVE_SECONDS))
        name.release()
        assert running_on(source) == []
    with Ledger(f"memory://{target_name}", copying=True) as target:
        assert target.recorder.max_notification_id() in (None, 0)
        assert target.recorder.key_checks() == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["name-and-row", "format-declaration"])
def test_a_server_starting_on_the_source_during_the_copy_leaves_it_unfinished(
    stores: tuple[str, str], how: str
) -> None:
    """The source is checked before the copy; a daemon may start between that check and
    the copy's end without writing an event before the verification's walk (its first
    send comes later): it would write to the source after the copy was marked finished,
    a fork. Asked again before the mark: the destination stays an unfinished copy.
    Before, the copy finished."""
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"] * 4)
        held: list[Any] = []

        def a_daemon_starts(copied: int, total: int) -> None:
            if held:
                return
            if how == "name-and-row":
                held.append(source.hold_identity("host-b"))
                now = time.time()
                source.loaded_policies().write(
                    LoadedPolicies("host-b", DAEMON, now, now + LIVE_SECONDS)
                )
            else:  # checked the store's format, not yet announced its policies
                check_event_format(source, server=(DAEMON, "host-b"))
                held.append(None)

        with pytest.raises(CopyMismatch, match=r"started on .* while it was copied.*host-b"):
            copy_store(source, MemoryStore(target_name), page=2, progress=a_daemon_starts)
        with pytest.raises(UnfinishedCopy):
            Ledger(f"memory://{target_name}")


def test_a_server_that_declared_just_before_the_copy_began_refuses_it(
    stores: tuple[str, str],
) -> None:
    """A server declares its event format as it opens the store and writes its heartbeat
    only once it has started (its name held, its claims recovered). One that declared a
    moment before the copy began (its first look at the clock) and writes its heartbeat
    after the copy's last check was seen by neither check: not live at the first, started
    before `since` at the last; the copy finished, a fork. A fresh declaration is a server
    starting: the copy is refused before it writes anything. Before, the copy finished."""
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"] * 2)
        declared: list[float] = []

        def clock() -> float:
            now = time.time()
            if not declared:  # meanwhile: a daemon checks the store's format, a moment ago
                declared.append(now - 0.001)
                check_event_format(source, server=(DAEMON, "host-b"), clock=lambda: declared[0])
            return now

        with pytest.raises(CopyRefused, match=r"in use by daemon host-b \(started at .*fork"):
            copy_store(source, MemoryStore(target_name), clock=clock)
        assert declared
    with Ledger(f"memory://{target_name}", copying=True) as target:
        assert target.recorder.max_notification_id() in (None, 0)
        assert target.recorder.key_checks() == []  # type: ignore[attr-defined]


def test_a_server_s_stop_removes_its_declaration_and_the_copy_runs_at_once(
    stores: tuple[str, str],
) -> None:
    """A fresh declaration is a server starting; a stopped server's would hold every copy
    for a minute after its start. Its stop removes it with its heartbeat."""
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"])
        check_event_format(source, server=(DAEMON, "host-b"))
        announcer = announce_policies(source, "host-b", PolicyHolder(PolicySet), DAEMON)
        with pytest.raises(CopyRefused, match=r"in use by daemon host-b \(started at "):
            copy_store(source, MemoryStore(target_name))
        announcer.stop()
        assert "daemon host-b" not in format_rows_for(source.recorder).rows()
        assert copy_store(source, MemoryStore(target_name)).finished


def test_a_server_s_stop_leaves_the_declaration_another_server_made_under_its_name(
    stores: tuple[str, str],
) -> None:
    """Two servers under one name: `sendledger api` on two hosts (it holds no name's
    lock), or a daemon whose name another process took. The later start's declaration
    replaces the first's row; the first server's stop removed the row by its holder, the
    other's, and a copy begun then saw no server starting beside it (a fork). A stop
    removes only the declaration its own start made."""
    source_name, target_name = stores
    with (
        Ledger(f"memory://{source_name}", clock=at) as first,
        Ledger(f"memory://{source_name}", clock=at) as second,
    ):
        fill(first, ["requested"])
        check_event_format(first, server=(API, "host-b"))
        announcer = announce_policies(first, "host-b", PolicyHolder(PolicySet), API)
        check_event_format(second, server=(API, "host-b"), clock=lambda: time.time() + 1)
        announcer.stop()
        assert "api host-b" in format_rows_for(first.recorder).rows()
        with pytest.raises(CopyRefused, match=r"in use by api host-b \(started at "):
            copy_store(first, MemoryStore(target_name))


def test_a_command_writing_to_the_source_after_the_walk_leaves_the_copy_unfinished(
    stores: tuple[str, str],
) -> None:
    """A command (`submit` from an application's cron, say) is no server: no heartbeat,
    no name, no declaration. One writing after the verification's walk and before the
    copy is marked finished put a job in the source alone. The source's last event is
    read again before the mark. Before, the copy finished without that job."""
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"] * 3)
        copied_all: list[bool] = []
        written: list[bool] = []

        def clock() -> float:
            # The first look at the clock once every page is copied and walked: the
            # question asked before the mark.
            if copied_all and not written:
                written.append(True)
                source.submit(
                    parse_job(
                        {
                            "channel": "receipts",
                            "key": "late",
                            "to": "late@example.net",
                            "subject": "s",
                            "body": "b",
                        }
                    ),
                    SENDER,
                )
            return time.time()

        def progress(copied: int, total: int) -> None:
            if copied == total:
                copied_all.append(True)

        with pytest.raises(CopyMismatch, match="the source changed while it was copied"):
            copy_store(source, MemoryStore(target_name), progress=progress, clock=clock)
        assert written
        with pytest.raises(UnfinishedCopy):
            Ledger(f"memory://{target_name}")


def at_the_mark(
    monkeypatch: pytest.MonkeyPatch, destination: type[Any], then: Callable[[], object]
) -> list[bool]:
    """`then()` called once as the copy writes its finished mark into a store of the
    `destination` recorder class: after every check, just after the mark is written (the
    list says it was called)."""
    called: list[bool] = []
    add = destination.add_key_check

    def add_then(recorder: Any, check: KeyCheck) -> None:
        add(recorder, check)
        if check.kind == COPY_FINISHED and not called:
            called.append(True)
            then()

    monkeypatch.setattr(destination, "add_key_check", add_then)
    return called


def a_save_just_before_the_mark(
    monkeypatch: pytest.MonkeyPatch, source: Ledger, destination: type[Any]
) -> list[bool]:
    """A command's save on `source` committed as the copy writes its finished mark into a
    store of the `destination` recorder class: after every check the mark follows. The
    list says it was made."""
    job = {"channel": "receipts", "key": "late", "to": "l@example.net", "body": "b"}
    return at_the_mark(
        monkeypatch, destination, lambda: source.submit(parse_job({**job, "subject": "s"}), SENDER)
    )


def test_a_save_committed_between_the_last_check_and_the_mark_leaves_the_copy_unfinished(
    stores: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last event is read again after the finished mark, which is taken back when
    it moved. Before, a save that committed after the check before the mark (an id past
    the last copied) left the copy marked finished without it (a fork)."""
    with Ledger(SqliteStore(tmp_path / "source.sqlite"), clock=at) as source:
        fill(source, ["requested"] * 3)
        saved = a_save_just_before_the_mark(monkeypatch, source, MemoryJobIndexRecorder)
        with pytest.raises(CopyMismatch, match="its last event is 5, the last copied 4"):
            copy_store(source, MemoryStore(stores[1]))
        assert saved
    with pytest.raises(UnfinishedCopy):
        Ledger(f"memory://{stores[1]}")


def test_the_copy_holds_the_event_format_of_its_source(stores: tuple[str, str]) -> None:
    """A store records the highest event format written to it, and a release that reads
    only older formats refuses it (ledger/event_format.py). Its copy holds the same
    format: before, it had no record and read as FIRST_FORMAT, so an older release would
    have opened it and misread the newer events."""
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"])
        format_rows_for(source.recorder).raise_to(EVENT_FORMAT + 1, time.time())
        copy_store(source, MemoryStore(target_name))
    with Ledger(f"memory://{target_name}") as target:
        older = Release(EVENT_FORMAT, EVENT_FORMAT)
        with pytest.raises(StoreFormatNewer, match=f"format {EVENT_FORMAT + 1}"):
            check_event_format(target, release=older, writing=False)
        newer = Release(EVENT_FORMAT + 1, EVENT_FORMAT + 1)
        assert check_event_format(target, release=newer, writing=False) == EVENT_FORMAT + 1


def test_a_destination_that_holds_events_is_refused_and_left_as_it_was(
    stores: tuple[str, str],
) -> None:
    source_name, target_name = stores
    with (
        Ledger(f"memory://{source_name}", clock=at) as source,
        Ledger(f"memory://{target_name}", clock=at) as other,
    ):
        fill(source, ["requested"])
        fill(other, ["confirmed"])
        before = (log(other), other.recorder.key_checks())  # type: ignore[attr-defined]
        with pytest.raises(CopyRefused, match=r"holds events .* an empty store only"):
            copy_store(source, MemoryStore(target_name))
        assert (log(other), other.recorder.key_checks()) == before  # type: ignore[attr-defined]
        with pytest.raises(StoreUrlError, match="names the configured store itself"):
            copy_store(source, MemoryStore(source_name))


def test_the_source_named_otherwise_is_refused_before_anything_is_written(
    stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL can name the source in a way `same_store` does not see (PostgreSQL's
    `localhost` and `127.0.0.1`, a host's two names): the destination then holds the
    source's own key checks. An empty source was copied into itself, marked
    `copy-started` (and a Ctrl-C left the configured store an unfinished copy, refused by
    the daemon); now it is bad input, nothing written."""
    import daemon.service_layer.copy_store as copying

    source_name, _ = stores
    monkeypatch.setattr(copying, "same_store", lambda a, b: False)  # the alias unseen
    with Ledger(f"memory://{source_name}", clock=at) as source:
        before = source.recorder.key_checks()  # type: ignore[attr-defined]
        with pytest.raises(StoreUrlError, match=r"--to names the configured store itself"):
            copy_store(source, MemoryStore(source_name))
        assert source.recorder.key_checks() == before  # type: ignore[attr-defined]


def test_an_interrupted_copy_is_opened_by_nothing_and_refused_by_a_second_copy(
    stores: tuple[str, str],
) -> None:
    source_name, target_name = stores
    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"] * 6)
        pages: list[int] = []
        result = copy_store(
            source,
            MemoryStore(target_name),
            page=2,
            progress=lambda copied, total: pages.append(copied),
            stop=lambda: len(pages) >= 1,
        )
        assert not result.finished and result.events == 2
        with pytest.raises(UnfinishedCopy, match=f"unfinished copy of memory://{source_name}"):
            Ledger(f"memory://{target_name}")
        with pytest.raises(
            UnfinishedCopy, match="nothing may use it; once no copy runs, empty it and copy again"
        ):
            copy_store(source, MemoryStore(target_name))


def test_a_copy_refuses_keys_that_are_not_the_source_s(stores: tuple[str, str]) -> None:
    from ledger.stores.cipher import new_key
    from ledger.stores.keycheck import StoreKeyRefused

    source_name, target_name = stores
    key = new_key()
    with Ledger(f"memory://{source_name}", clock=at, encryption_keys=[key]) as source:
        fill(source, ["requested", "review"])
        with pytest.raises(StoreKeyRefused, match="no key in the file is a key of"):
            copy_store(source, MemoryStore(target_name), encryption_keys=[new_key()])
        with Ledger(f"memory://{target_name}", copying=True) as refused:
            assert refused.recorder.max_notification_id() in (None, 0)
        discard_memory_store(target_name)
        copy_store(source, MemoryStore(target_name), encryption_keys=[key])
        with Ledger(f"memory://{target_name}", encryption_keys=[key]) as target:
            assert log(target) == log(source)
            # The index digests each mailbox with the source's secret: the same rows.
            assert index(target) == index(source)


@settings(max_examples=25)
@given(
    steps=st.lists(st.sampled_from(STEPS), max_size=8),
    page=st.integers(min_value=1, max_value=7),
    position=st.integers(min_value=0, max_value=30),
)
def test_any_history_is_copied_event_for_event(steps: list[str], page: int, position: int) -> None:
    source_name, target_name = (f"copy-h-{uuid.uuid4().hex[:8]}" for _ in range(2))
    try:
        with Ledger(f"memory://{source_name}", clock=at) as source:
            fill(source, steps)
            last = source.recorder.max_notification_id() or 0
            source.positions().force("hook", min(position, last), time.time(), expected=0)
            result = copy_store(source, MemoryStore(target_name), page=page)
            with Ledger(f"memory://{target_name}") as target:
                assert log(target) == log(source)
                assert index(target) == index(source)
                moved = target.positions().read_all()[0].position
        # A memory store numbers its events from 1 without gaps: the same ids.
        assert moved == min(position, last)
        assert result.events == last and result.jobs == len(steps)
    finally:
        discard_memory_store(source_name)
        discard_memory_store(target_name)


def _iso(seconds: float) -> str:
    from ledger.display import iso

    text = iso(seconds)
    assert text is not None
    return text


def test_a_copy_that_failed_its_check_is_one_line_and_exit_1() -> None:
    """A verification that differs, or a server started on the source meanwhile, is an
    operator's situation, said in one line (exit 1), not an "unexpected failure"."""
    from daemon.exit_codes import exit_code_for

    assert exit_code_for(CopyMismatch("the source changed while it was copied")) == 1


def test_a_copy_whose_file_is_emptied_while_it_runs_is_not_reported_made(tmp_path: Path) -> None:
    """A second copy into the file meets the unfinished mark and says the first may still be
    copying; an operator who empties the file anyway gets no "copied" from the first (before:
    finished, the file gone)."""
    copy = tmp_path / "copy.sqlite"
    refusals: list[str] = []

    def second_copy_then_empty(copied: int, total: int) -> None:
        if copied != 2:
            return
        with pytest.raises(UnfinishedCopy) as refused:
            copy_store(source, SqliteStore(copy))
        refusals.append(str(refused.value))
        for end in ("", "-wal", "-shm"):
            Path(f"{copy}{end}").unlink(missing_ok=True)

    with Ledger(f"sqlite:///{tmp_path / 'source.sqlite'}", clock=at) as source:
        fill(source, ["requested"] * 6)
        with pytest.raises(CopyMismatch, match="was removed or replaced while it was copied"):
            copy_store(source, SqliteStore(copy), page=2, progress=second_copy_then_empty)
    (said,) = refusals
    assert "admin copy-store is still copying it, or was stopped before it verified it" in said
    assert said.endswith("nothing may use it; once no copy runs, empty it and copy again")
    assert not copy.exists()


@pytest.mark.parametrize("asked_at", [6, 8, 9])
def test_a_stop_asked_after_the_pages_still_leaves_the_copy_unfinished(
    stores: tuple[str, str], asked_at: int
) -> None:
    """A Ctrl-C during the rebuild or the walk, which take as long again as the pages, ends
    the copy unmarked (before: asked only between pages, it finished with exit 0)."""
    source_name, target_name = stores
    asked = [0]

    def stop() -> bool:  # 4 pages (7 events), before the rebuild, 3 of the walk, the end
        asked[0] += 1
        return asked[0] >= asked_at

    with Ledger(f"memory://{source_name}", clock=at) as source:
        fill(source, ["requested"] * 6)
        result = copy_store(source, MemoryStore(target_name), page=2, stop=stop)
    assert not result.finished and result.events == 7
    with pytest.raises(UnfinishedCopy):
        Ledger(f"memory://{target_name}")
