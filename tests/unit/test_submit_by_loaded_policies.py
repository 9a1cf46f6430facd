"""`submit` judged by the policies the running daemons loaded, not only by the folder
(daemon/service_layer/loaded.py, ledger/stores/loaded_policies.py), on the memory store
with injected time.

A file added to the folder and not reloaded: the daemon would put the job in review at
once ("no policy for the channel"), so intake refuses it naming the channel. A file edited
and not reloaded: accepted, with a warning (the job is sent under the loaded policy). With
no daemon running: as before. A daemon's row counts only while its name is held (here
the memory store's `MemoryIdentityLock`): one killed -9 has loaded nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.engine.policy_holder import PolicyHolder
from daemon.service_layer.loaded import LIVE_SECONDS, PolicyAnnouncer, announce_policies
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger.application import Ledger
from ledger.stores.identity import IdentityLock
from ledger.stores.loaded_policies import API, DAEMON, LoadedPolicies
from policies.loader import PolicySet

LEGAL = policy("legal", on_unknown="review")
OTHER = policy("other", on_unknown="review")


#: The daemon names each rig's tests hold, as a running daemon holds its own.
_names: dict[int, dict[str, IdentityLock]] = {}


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, OTHER)  # the folder: legal and other
    yield rig
    for lock in _names.pop(id(rig), {}).values():
        lock.release()
    rig.close()


def hold(rig: EngineRig, name: str) -> IdentityLock:
    """The daemon `name` runs: its name is held on the rig's store."""
    held = _names.setdefault(id(rig), {})
    if name not in held:
        held[name] = rig.ledger.hold_identity(name)
    return held[name]


def services(rig: EngineRig) -> Services:
    return Services(rig.ledger, lambda: ChannelPolicies(rig.policies))


def job(key: str, channel: str = "legal") -> dict[str, Any]:
    return {
        "channel": channel,
        "key": key,
        "to": "customer@example.net",
        "subject": f"Receipt {key}",
        "body": "Thank you.\n",
    }


def loaded(rig: EngineRig, fingerprints: dict[str, str], *, name: str = "d1",
           kind: str = DAEMON) -> None:  # fmt: skip
    """A running server's row, as its announcer writes it, on the rig's clock."""
    if kind == DAEMON:
        hold(rig, name)
    now = rig.clock().timestamp()
    rig.ledger.loaded_policies().write(
        LoadedPolicies(name, kind, now, now + LIVE_SECONDS, fingerprints)
    )


def test_a_channel_no_running_daemon_loaded_is_refused_naming_it(rig: EngineRig) -> None:
    loaded(rig, {"legal": LEGAL.fingerprint})  # `other.toml` added since the daemon loaded
    s = services(rig)
    with pytest.raises(ServiceError) as caught:
        s.submit([job("k1"), job("k2", "other")], by="a")
    assert caught.value.kind is Refusal.BAD_INPUT
    assert [(p.index, p.field) for p in caught.value.problems] == [(1, "channel")]
    message = caught.value.message
    assert "'other'" in message and "added since the daemon loaded" in message
    assert "systemctl reload sendledger" in message and "'d1'" in message
    # All or nothing: the sound job of the batch is not written either.
    assert rig.ledger.find_job("k1") is None and rig.ledger.find_job("k2") is None
    # The channel the daemon loaded, with the very file: accepted, no warning.
    submitted = s.submit(job("k3"), by="a")
    assert submitted.created and submitted.warnings == []


def test_a_file_edited_since_the_load_is_accepted_with_a_warning(rig: EngineRig) -> None:
    loaded(rig, {"legal": "sha256:older", "other": OTHER.fingerprint})
    submitted = services(rig).submit([job("k1"), job("k2"), job("k3", "other")], by="a")
    assert submitted.created
    assert len(submitted.warnings) == 1  # one per channel, not per job
    (warning,) = submitted.warnings
    assert "'legal'" in warning and "sha256:older" in warning and LEGAL.fingerprint in warning
    assert "systemctl reload sendledger" in warning


def test_with_no_daemon_running_the_folder_is_all_there_is(rig: EngineRig) -> None:
    s = services(rig)
    assert s.submit(job("k1", "other"), by="a").warnings == []  # no row at all
    loaded(rig, {"legal": LEGAL.fingerprint})
    rig.clock.advance(LIVE_SECONDS + 1)  # its heartbeat ran out: killed, not running
    assert s.submit(job("k2", "other"), by="a").created


def test_a_daemon_killed_has_loaded_nothing_once_its_name_is_free(rig: EngineRig) -> None:
    """Killed -9, a daemon leaves its row, heartbeat still fresh, and the operating system
    (or the server) drops its name. Before, the row counted until its heartbeat ran out
    (`LIVE_SECONDS`): a channel added since the dead daemon loaded was refused though no
    daemon ran, and one a live daemon loaded was warned about in the dead one's name."""
    loaded(rig, {"legal": LEGAL.fingerprint}, name="dead")
    loaded(rig, {"legal": LEGAL.fingerprint, "other": OTHER.fingerprint}, name="live")
    s = services(rig)
    assert [w for w in s.submit(job("k1", "other"), by="a").warnings if "'dead'" in w]
    _names[id(rig)].pop("dead").release()  # kill -9: the lock goes with the process
    submitted = s.submit(job("k2", "other"), by="a")
    assert submitted.created and submitted.warnings == []
    _names[id(rig)].pop("live").release()
    # No daemon left: the folder is all there is, at once, not after the heartbeat.
    assert s.submit(job("k3", "other"), by="a").warnings == []
    assert rig.ledger.loaded_policies().live(rig.clock().timestamp()) == []


def test_one_daemon_that_loaded_the_channel_is_enough_and_the_api_does_not_count(
    rig: EngineRig,
) -> None:
    loaded(rig, {"legal": LEGAL.fingerprint, "other": OTHER.fingerprint}, kind=API)
    loaded(rig, {"legal": LEGAL.fingerprint}, name="d1")
    s = services(rig)
    with pytest.raises(ServiceError):
        s.submit(job("k1", "other"), by="a")  # `sendledger api` sends nothing
    loaded(rig, {"legal": LEGAL.fingerprint, "other": OTHER.fingerprint}, name="d2")
    submitted = s.submit(job("k1", "other"), by="a")
    assert submitted.created
    # d1 has not loaded it: if it takes the job, it would put it in review.
    assert [w for w in submitted.warnings if "'d1'" in w and "'other'" in w]


def test_the_announcer_writes_at_start_at_each_reload_and_removes_its_row_at_stop(
    rig: EngineRig,
) -> None:
    folder = {"legal": LEGAL}
    holder = PolicyHolder(lambda: PolicySet(dict(folder)))
    rows = rig.ledger.loaded_policies()
    hold(rig, "d1")
    announcer = announce_policies(rig.ledger, "d1", holder, DAEMON)
    try:
        (row,) = rows.live(time.time())
        assert (row.name, row.kind, dict(row.fingerprints)) == (
            "d1",
            DAEMON,
            {"legal": LEGAL.fingerprint},
        )
        folder["other"] = OTHER
        assert holder.reload()
        # Written before the reload returns (and says "policies reloaded"): a submit
        # right after it is judged by the new set.
        assert set(rows.live(time.time())[0].fingerprints) == {"legal", "other"}
    finally:
        announcer.stop()
    assert rows.live(time.time()) == []


def test_a_store_that_cannot_be_written_does_not_stop_the_server(
    rig: EngineRig, caplog: pytest.LogCaptureFixture
) -> None:
    class Down:
        def now(self) -> float | None:
            return None

        def write(
            self, row: LoadedPolicies, *, unless: Callable[[], bool] = bool, held_by: Any = None
        ) -> None:
            raise OSError("store down")

        def leave(self, name: str, kind: str, loaded_at: float) -> None:
            raise OSError("store down")

        def live(self, now: float) -> list[LoadedPolicies]:
            return []

    announcer = PolicyAnnouncer(Down(), "d1", DAEMON, lambda: rig.policies)
    announcer.start()
    announcer.write()
    announcer.stop()
    said = [r.getMessage() for r in caplog.records if "store down" in r.getMessage()]
    assert len(said) == 2  # the first failure of a streak, and the stop's


def test_a_reload_waits_for_a_hanging_store_a_bounded_time(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import daemon.service_layer.loaded as loaded_module

    monkeypatch.setattr(loaded_module, "REWRITE_WAIT", 0.2)
    release = threading.Event()
    writes: list[LoadedPolicies] = []

    class Hangs:
        def now(self) -> float | None:
            return None

        def write(
            self, row: LoadedPolicies, *, unless: Callable[[], bool] = bool, held_by: Any = None
        ) -> None:
            writes.append(row)
            if len(writes) > 1:
                release.wait(10)  # a partition: the write does not return

        def leave(self, name: str, kind: str, loaded_at: float) -> None:
            pass

        def live(self, now: float) -> list[LoadedPolicies]:
            return []

    holder = PolicyHolder(lambda: rig.policies)
    announcer = PolicyAnnouncer(Hangs(), "d1", DAEMON, lambda: holder.current)
    holder.listeners.append(announcer.reloaded)
    announcer.start()
    try:
        started = time.monotonic()
        assert holder.reload()  # the daemon's main thread: never held past the bound
        assert time.monotonic() - started < 2
        assert len(writes) == 2
    finally:
        release.set()
        announcer.stop()


def test_a_server_that_stops_leaves_the_row_of_a_process_that_took_its_name(
    rig: EngineRig,
) -> None:
    """A daemon that lost its name (another process took it after a PostgreSQL restart)
    and stops removes only the row it wrote: the newcomer's stays live."""
    rows = rig.ledger.loaded_policies()
    hold(rig, "d1")  # the newcomer's
    old = PolicyAnnouncer(rows, "d1", DAEMON, lambda: rig.policies, clock=lambda: 10.0)
    old.write()
    new = PolicyAnnouncer(rows, "d1", DAEMON, lambda: rig.policies, clock=lambda: 20.0)
    new.write()  # the same name: its row replaces the old one's
    old.stop()
    assert [(r.name, r.loaded_at) for r in rows.live(0)] == [("d1", 20.0)]  # the newcomer's
    new.stop()
    assert rows.live(0) == []


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_heartbeat_held_up_past_the_stop_does_not_write_the_row_again(
    backend: str, tmp_path: Path
) -> None:
    """A heartbeat's write held up (a store that hangs) past the stop's wait for it,
    then let go after the stop removed the row. Before, it wrote the row again, and the
    stopped server counted as running for `LIVE_SECONDS` (`admin copy-store` refused the
    store; `submit` judged by a stopped daemon's policies where names cannot be asked).
    Now the write asks in its transaction whether the server stopped, and rolls back."""
    sqlite = f"sqlite:///{tmp_path / 's.sqlite'}"
    with Ledger(f"memory://{tmp_path.name}" if backend == "memory" else sqlite) as ledger:
        a_beat_held_past_the_stop(ledger)


def a_beat_held_past_the_stop(ledger: Ledger) -> None:
    """An API server's announcer on `ledger` whose heartbeat is held before its write
    until the stop has given up waiting for it and removed the row; no row after."""
    rows = ledger.loaded_policies()
    held, release = threading.Event(), threading.Event()
    beats: list[threading.Thread] = []

    def current() -> PolicySet:
        if rows.live(time.time()):  # a heartbeat's, not the start's
            beats.append(threading.current_thread())
            held.set()
            release.wait(10)
        return PolicySet({})

    announcer = PolicyAnnouncer(rows, "host-a", API, current, live_seconds=0.3)
    announcer.start()
    assert held.wait(5)
    announcer.stop(lock_wait=0.05)  # gives up waiting for the held beat
    assert rows.live(time.time()) == []
    release.set()
    beats[0].join(5)
    assert not beats[0].is_alive()
    assert rows.live(time.time()) == []


def test_a_stop_right_after_a_reload_whose_row_was_not_written_removes_the_row(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP then SIGTERM while the store holds the beat's write up (its heartbeat in
    flight carries the old load's time): the reload goes on without its row, and the stop
    must remove the row that is there, not look for the reload's. Left, it counted as a
    running server for `LIVE_SECONDS` (`admin copy-store` refused; an API's row is never
    judged by its name). No beat thread here: it is the one the stop overtook."""
    import daemon.service_layer.loaded as loaded_module

    monkeypatch.setattr(loaded_module, "REWRITE_WAIT", 0.01)
    rows = rig.ledger.loaded_policies()
    now = [10.0]
    announcer = PolicyAnnouncer(rows, "api-1", API, lambda: rig.policies, clock=lambda: now[0])
    announcer.write()  # the start's row, loaded at 10
    now[0] = 20.0
    announcer.reloaded()  # loaded at 20: its row not written before the stop
    assert [r.loaded_at for r in rows.live(0)] == [10.0]
    announcer.stop()
    assert rows.live(0) == []
