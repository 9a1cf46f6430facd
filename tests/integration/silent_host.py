"""Hosts that go silent under a test's connections.

`SilentRelay`: a TCP relay that forwards, or accepts new connections and never answers
(a hung server, a half-open proxy).

`ClusterBeyond`: a PostgreSQL server at the far end of a `SilentLink`.

`SilentLink`: a network link that can go silent under open TCP connections: packets dropped, no
RST, no FIN, as when a host loses power or a firewall starts dropping. A relay on
loopback cannot play that: its kernel acknowledges every byte whether the relay reads
it or not, so a client's sent bytes never wait for an acknowledgement.

A veth pair into a network namespace of its own (`ip netns`, run as root): the far end
has an address the test's sockets reach through the near end; `go_silent` sets the far
end down and the near end then drops every packet sent to it, its routes kept. Nothing
outside the namespace and the pair is changed: loopback, and every other test's traffic,
are not touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from types import TracebackType

import pytest
from tests.conftest import IN_CI
from tests.integration.listeners import stop_listening
from tests.pg_cluster import BIN, USER, PrivateCluster, _as_server_user

_CLONE_NEWNET = 0x40000000


class SilentRelay:
    """Forwards TCP connections to `target`; while `silent`, accepts them and never
    answers, keeping them open (what a hung host does; the socket stays open after the
    host recovers, as a half-open proxy's does)."""

    def __init__(self, host: str, port: int, *, listener: socket.socket | None = None) -> None:
        self._target = (host, port)
        # On loopback unless given one (`SilentLink.listen`).
        self._listener = listener or socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.silent = threading.Event()
        self.refusing = threading.Event()  # new connections closed at once (`go_away`)
        self.held = 0
        self._forwarded: list[socket.socket] = []
        self._silent: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        for client in _accepted(self._listener):
            with self._lock:
                if self.refusing.is_set():
                    _cut(client)
                    continue
                if self.silent.is_set():
                    self._silent.append(client)
                    self.held += 1
                    continue
                server = socket.create_connection(self._target)
                self._forwarded += [client, server]
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            threading.Thread(target=_pump, args=(client, server), daemon=True).start()

    def go_silent(self) -> None:
        """From now on silent; the connections it forwarded are cut (the pool's
        connections die and it must make new ones)."""
        self._stop_forwarding(self.silent)

    def go_away(self) -> None:
        """As `go_silent`, but each new connection is closed at once (a host that is
        down: each attempt fails in no time)."""
        self._stop_forwarding(self.refusing)

    def _stop_forwarding(self, mode: threading.Event) -> None:
        with self._lock:
            mode.set()
            ends, self._forwarded = self._forwarded, []
        for end in ends:
            _cut(end)

    def answer_again(self) -> None:
        self.silent.clear()
        self.refusing.clear()

    def close(self) -> None:
        stop_listening(self._listener)
        with self._lock:
            ends = self._forwarded + self._silent
        for end in ends:
            _cut(end)


def _accepted(listener: socket.socket) -> Iterator[socket.socket]:
    """The listener's connections, until it is closed."""
    with contextlib.suppress(OSError):
        while True:
            yield listener.accept()[0]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)


def _cut(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()


class SilentLink:
    """`listen()` gives a socket listening at the far end; connections to it cross the
    link."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.namespace = f"slpg{pid}"
        self._near, self._far = f"slpg{pid}a", f"slpg{pid}b"
        # A /30 of 10.87.0.0/16 of this process's own: tests beside it (pytest -n 2)
        # make theirs.
        base = (pid % 16384) * 4
        prefix = f"10.87.{base >> 8}."
        self.near_ip, self.far_ip = f"{prefix}{(base & 255) + 1}", f"{prefix}{(base & 255) + 2}"

    def __enter__(self) -> SilentLink:
        try:
            _ip("netns", "add", self.namespace)
        except (OSError, subprocess.CalledProcessError) as exc:
            reason = f"a network namespace could not be made (root and iproute2 needed): {exc}"
            if IN_CI:
                pytest.fail(f"CI is set, this test must run: {reason}")
            pytest.skip(reason)
        try:
            _ip("link", "add", self._near, "type", "veth", "peer", "name", self._far)
            _ip("link", "set", self._far, "netns", self.namespace)
            _ip("addr", "add", f"{self.near_ip}/30", "dev", self._near)
            _ip("link", "set", self._near, "up")
            _ip("-n", self.namespace, "addr", "add", f"{self.far_ip}/30", "dev", self._far)
            _ip("-n", self.namespace, "link", "set", self._far, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def listen(self) -> socket.socket:
        """A socket listening at the far end. A socket stays in the namespace it was made
        in: made by a thread that entered the namespace, used by any."""
        made: list[socket.socket | BaseException] = []

        def make() -> None:
            try:
                fd = os.open(f"/run/netns/{self.namespace}", os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                made.append(socket.create_server((self.far_ip, 0)))
            except BaseException as exc:  # handed to the caller's thread
                made.append(exc)

        # A thread of its own: setns moves only the calling thread, which then ends.
        thread = threading.Thread(target=make)
        thread.start()
        thread.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        return made[0]

    def go_silent(self) -> None:
        _ip("-n", self.namespace, "link", "set", self._far, "down")

    def answer_again(self) -> None:
        _ip("-n", self.namespace, "link", "set", self._far, "up")

    def close(self) -> None:
        # The pair goes with the namespace.
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            _ip("netns", "del", self.namespace)
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            _ip("link", "del", self._near)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class ClusterBeyond(PrivateCluster):
    """A private cluster whose server runs at the far end of `link`, reached through
    it (`url`), and on its Unix socket in `root` whatever the link does (`local_url`):
    the server's own side of a silent network."""

    def __init__(self, link: SilentLink) -> None:
        self._link = link
        super().__init__(prefix="sendledger-pg-beyond-")
        self.url = f"postgresql://{USER}@{link.far_ip}:{self.port}/postgres"
        self.local_url = f"postgresql://{USER}@/postgres?host={self.root}&port={self.port}"
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {link.near_ip}/32 trust\n")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses={self._link.far_ip} -k {self.root} "
            "-c fsync=off -c full_page_writes=off"
        )
        pg_ctl = [BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "start"]
        subprocess.run(
            ["ip", "netns", "exec", self._link.namespace, *_as_server_user(), *map(str, pg_ctl)],
            check=True,
            capture_output=True,
            timeout=120,
            cwd=self.root,
        )
