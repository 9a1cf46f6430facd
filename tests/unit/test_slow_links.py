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
