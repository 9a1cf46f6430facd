"""`kept.closed_by_peer`, the check made before an idle kept connection carries a request,
on a socket whose descriptor is above 1023: `select` refuses those, and the check read
every such connection as closed, so a daemon holding many never reused one."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Iterator

import pytest
from tests.conftest import IN_CI

from daemon.providers.kept import closed_by_peer

HIGH = 1500


@pytest.fixture
def high_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH:
        reason = f"the hard limit of open files ({hard}) is below {HIGH}"
        if IN_CI:
            pytest.fail(f"CI is set, nothing may skip: {reason}")
        pytest.skip(reason)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))
    ours, theirs = socket.socketpair()
    moved = socket.socket(fileno=os.dup2(ours.fileno(), HIGH))
    ours.close()
    try:
        yield moved, theirs
    finally:
        moved.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_idle_connection_above_descriptor_1023_reads_as_open(
    high_pair: tuple[socket.socket, socket.socket],
) -> None:
    kept, server = high_pair
    assert kept.fileno() == HIGH
    assert not closed_by_peer(kept)
    server.sendall(b"421 closing\r\n")
    assert closed_by_peer(kept)


def test_an_idle_connection_above_descriptor_1023_closed_by_its_peer_reads_as_closed(
    high_pair: tuple[socket.socket, socket.socket],
) -> None:
    kept, server = high_pair
    server.close()
    assert closed_by_peer(kept)
