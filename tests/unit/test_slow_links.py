"""The wait for a written body to leave this host (daemon/providers/slow_links.py) only
holds back an upload still queued beyond one piece: a small request's bytes in flight
(unacknowledged for a round trip) are no reason to wait, or every send would."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from daemon.providers import slow_links
from daemon.providers.slow_links import PIECE, wait_sent_out


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    a, b = socket.socketpair()
    try:
        yield a
    finally:
        a.close()
        b.close()


def test_a_small_request_in_flight_is_not_waited_for(
    sock: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def in_flight(_sock: socket.socket) -> int:
        asked.append(1)
        return 1_000  # sent, not yet acknowledged: a round trip away

    monkeypatch.setattr(slow_links, "queued_bytes", in_flight)
    started = time.monotonic()
    wait_sent_out(sock, timeout=1.0)
    assert time.monotonic() - started < 0.5
    assert len(asked) == 1


def test_an_upload_queued_beyond_a_piece_is_waited_for_while_it_drains(
    sock: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = [4 * PIECE, 3 * PIECE, 2 * PIECE, PIECE, PIECE // 2]
    seen: list[int] = []

    def draining(_sock: socket.socket) -> int:
        seen.append(queue[0])
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr(slow_links, "DRAIN_LOOK", 0.001)
    monkeypatch.setattr(slow_links, "queued_bytes", draining)
    wait_sent_out(sock, timeout=1.0)
    assert seen == [4 * PIECE, 3 * PIECE, 2 * PIECE, PIECE]


class _Clock:
    """Time that passes only when the wait sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_queue_that_trickles_is_not_waited_for_beyond_the_timeout_a_piece(
    sock: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link taking a byte per almost-`timeout` moves, but a write of a piece on it would
    time out: the wait is bounded as the writes are, a piece out per `timeout`, not held
    for days by a queue of megabytes shrinking a byte at a time."""
    timeout, clock = 1.0, _Clock()

    def trickling(_sock: socket.socket) -> int:
        assert clock.now < 20 * timeout, "still waiting on a link that takes a byte a second"
        return 4 * PIECE - int(clock.now / (timeout - 0.05))

    monkeypatch.setattr(slow_links, "time", clock)
    monkeypatch.setattr(slow_links, "queued_bytes", trickling)
    wait_sent_out(sock, timeout=timeout)
    assert clock.now <= timeout + slow_links.DRAIN_LOOK * 2
