"""A running daemon and the store's event format (ledger/event_format.py): the format is
judged at every start, and a newer release raises it once no older server is live, live
judged by heartbeats. A daemon whose heartbeat lapsed (a long GC pause, a stopped VM,
SIGSTOP) counts as gone: the newer release raises the format, and the old daemon, going
on, wrote in the old format and failed to load the new events. It reads the format again
at each heartbeat and stops as its start would have (docs/operations.md "Upgrading").

Before, it never read it again: `test_a_daemon_whose_heartbeat_lapsed_stops_at_its_next_beat`
timed out waiting for it to stop, the job submitted after the raise sent by it."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from tests.unit.daemon_thread import daemon_on, serve_on_a_thread
from tests.unit.engine_rig import policy, receipt

from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.exit_codes import exit_code_for
from daemon.service_layer.loaded import LIVE_SECONDS
from ledger.application import Ledger
from ledger.event_format import (
    EVENT_FORMAT,
    STARTING_SECONDS,
    OlderReleaseLive,
    Release,
    StoreFormatNewer,
    check_event_format,
)
from ledger.stores.loaded_policies import DAEMON
from ledger.stores.memory import discard_memory_store
from ledger.vocabulary import JobState
from policies.loader import PolicySet

NEWER = Release(EVENT_FORMAT + 1, EVENT_FORMAT + 1)
CHANNEL = "receipts"


def _wait_for(condition: object, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {seconds:g}s for {what}"
        time.sleep(0.01)


def test_a_daemon_whose_heartbeat_lapsed_stops_at_its_next_beat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"format-watch-{uuid.uuid4().hex[:8]}"
    release = threading.Event()
    try:
        with Ledger(f"memory://{name}") as ledger:
            provider = FakeProvider("fake", clock=ledger.clock)
            provider.script(Scripted.hang(release))  # the first send: in flight at the raise
            check_event_format(ledger, server=(DAEMON, "old"))  # the old daemon's start
            policies = PolicySet({CHANNEL: policy(CHANNEL)})
            daemon = daemon_on(ledger, provider=provider, policies=policies, name="old")
            with caplog.at_level(logging.ERROR, logger="sendledger.daemon"):
                runner, outcome = serve_on_a_thread(daemon)
                try:
                    ledger.submit(receipt(CHANNEL, "in-flight"), policy(CHANNEL).sender)
                    _wait_for(lambda: provider.hanging == 1, "the first send")
                    # Its heartbeat is live now: the newer release does not raise the format.
                    with pytest.raises(OlderReleaseLive, match="daemon old"):
                        check_event_format(ledger, release=NEWER, server=(DAEMON, "new"))
                    # Injected time: the old daemon paused past its heartbeat and its
                    # start's declaration, the newer release raises the format.
                    lapsed = time.time() + max(LIVE_SECONDS, STARTING_SECONDS) + 1
                    raised = check_event_format(
                        ledger, release=NEWER, server=(DAEMON, "new"), clock=lambda: lapsed
                    )
                    assert raised == NEWER.writes
                    # The old daemon goes on: its heartbeat comes (a reload wakes it now,
                    # not in 20 s).
                    daemon.request_reload()
                    _wait_for(lambda: "stopping: this store holds" in caplog.text, "the stop")
                    ledger.submit(receipt(CHANNEL, "after"), policy(CHANNEL).sender)
                    time.sleep(0.15)  # three ticks: none takes the new job
                finally:
                    release.set()
                    runner.join(timeout=10)
                    if runner.is_alive():  # it never stopped by itself (before the fix)
                        daemon.request_stop()
                        runner.join(timeout=20)
            assert not runner.is_alive()
            assert len(outcome) == 1 and isinstance(outcome[0], StoreFormatNewer)
            assert str(outcome[0]) == (
                f"this store holds events of format {NEWER.writes}, this release reads up "
                f"to {EVENT_FORMAT}: upgrade sendledger on this host"
            )
            assert exit_code_for(outcome[0]) == 2  # as at start: bad input, one line
            # The call in flight finished and its outcome is recorded; no new work taken.
            assert ledger.get_job("in-flight").state == JobState.CONFIRMED
            assert ledger.get_job("after").state == JobState.REQUESTED
            assert provider.sends == 1
    finally:
        discard_memory_store(name)
