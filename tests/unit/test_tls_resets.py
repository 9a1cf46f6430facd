"""A provider's server that resets the connection just before TLS is set up on it (a
mail server after its STARTTLS answer, or any as it accepts a TLS connection): the call
fails and its socket is closed as it does, never left to the garbage collector. The
standard library's wrap of a socket reset under it raised with the SSLSocket it had made
still open (CPython gh-113280); `sendledger.connecting.close_unreturned` closes it."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import ssl
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httplib2
import pytest

from daemon.providers import transport
from daemon.providers.imap_sessions import ImapSessions
from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import ProviderError, SendKind
from daemon.providers.smtp_submit import SmtpSubmitter
from daemon.providers.transport import NotSentError, SingleShotHttp


class _WrapsAfterTheReset(ssl.SSLContext):
    """A client context whose wrap waits until the server has reset the connection: the
    reset that comes between the server's last answer and the TLS wrap, made certain."""

    reset = threading.Event()

    def wrap_socket(self, *args: Any, **kwargs: Any) -> Any:
        assert self.reset.wait(5)
        time.sleep(0.05)  # the reset has crossed loopback
        return super().wrap_socket(*args, **kwargs)


def _resetting_server(answers: list[bytes], reset: threading.Event) -> tuple[socket.socket, int]:
    """A loopback server that writes `answers[0]`, then each next one after a line read
    (`{tag}` in it: that line's first word, an IMAP command's tag), and resets the
    connection after the last. An earlier test's server is waited for first: its socket,
    closed late on a loaded machine, would be counted in this test's window."""
    while _SERVERS:
        _SERVERS.pop().join(10)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as lines:
            conn.settimeout(5)
            for index, answer in enumerate(answers):
                if index:
                    tag = (lines.readline().split() or [b""])[0]
                    answer = answer.replace(b"{tag}", tag)
                conn.sendall(answer)
            time.sleep(0.05)  # the client's connect has returned: its wrap meets the reset
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reset.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    _SERVERS.append(server)
    return listener, listener.getsockname()[1]


#: The servers started so far (`_resetting_server`).
_SERVERS: list[threading.Thread] = []


class _Envelope:
    recipients = ["customer@example.net"]
    message_id = "<k1@mail.example.com>"
    eight_bit = False

    def wire_data(self) -> bytes:
        return b"Subject: x\r\n\r\nx\r\n"


def _open_fds() -> int:
    """The sockets open: not every descriptor, since another thread's (an earlier test's
    event loop closing its epoll late on a loaded machine) would be counted in the window."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


@contextmanager
def _no_socket_left() -> Iterator[None]:
    """As many fds open after as before, and no socket left to the collector. The
    collector runs only at the end, so that no socket is collected (and warned about)
    outside the window, in another test's. The session's PostgreSQL, started in the
    background when the tests run in one process (tests/conftest.py), is waited for first:
    its thread's sockets to the starting server would be counted."""
    for thread in threading.enumerate():
        if thread.name == "session-cluster":
            thread.join(120)
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            before = _open_fds()
            yield
            after = _open_fds()
            gc.collect()
    finally:
        gc.enable()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert (after, unclosed) == (before, [])


def _endpoint(security: str, port: int, context: ssl.SSLContext) -> MailEndpoint:
    return MailEndpoint("127.0.0.1", port, security, "u", "p", 5.0, context)


def _context() -> _WrapsAfterTheReset:
    context = _WrapsAfterTheReset(ssl.PROTOCOL_TLS_CLIENT)
    context.reset = threading.Event()
    return context


SMTP_STARTTLS = [b"220 hi\r\n", b"250-mx\r\n250 STARTTLS\r\n", b"220 go ahead\r\n"]


@pytest.mark.parametrize(
    ("security", "answers", "call"),
    [
        ("starttls", SMTP_STARTTLS, lambda s: s.submit(_Envelope())),
        ("tls", [], lambda s: s.submit(_Envelope())),
        ("tls", [], lambda s: s.ping()),
    ],
    ids=["starttls-submit", "tls-submit", "tls-ping"],
)
def test_an_smtp_server_resetting_before_tls_leaves_no_socket(
    security: str,
    answers: list[bytes],
    call: Callable[[SmtpSubmitter], Any],
) -> None:
    context = _context()
    listener, port = _resetting_server(answers, context.reset)
    with listener, _no_socket_left():
        submitter = SmtpSubmitter(_endpoint(security, port, context), ReuseLimits())
        try:
            outcome = call(submitter)
        except ProviderError:
            outcome = None
        finally:
            submitter.close()
    assert outcome is None or outcome.kind is SendKind.REJECTED


IMAP_STARTTLS = [
    b"* OK hi\r\n",
    b"* CAPABILITY IMAP4rev1 STARTTLS\r\n{tag} OK done\r\n",
    b"{tag} OK begin TLS\r\n",
]


@pytest.mark.parametrize(
    ("security", "answers"), [("starttls", IMAP_STARTTLS), ("tls", [])], ids=["starttls", "tls"]
)
def test_an_imap_server_resetting_before_tls_leaves_no_socket(
    security: str, answers: list[bytes]
) -> None:
    context = _context()
    listener, port = _resetting_server(answers, context.reset)
    with listener, _no_socket_left():
        sessions = ImapSessions(_endpoint(security, port, context), ReuseLimits())
        with pytest.raises(ProviderError, match="IMAP"):
            sessions.run(lambda client: None)
        sessions.close()


@pytest.mark.parametrize(
    "kind",
    [httplib2.HTTPSConnectionWithTimeout, transport._Https],
    ids=["httplib2", "connects"],
)
def test_an_https_server_resetting_before_tls_leaves_no_socket(kind: type[Any]) -> None:
    """The Gmail and Graph providers' transport (httplib2): its connect phase, httplib2's
    own and the one the transport opens its connections with (`connects.connect`)."""
    context = _context()
    listener, port = _resetting_server([], context.reset)
    with listener, _no_socket_left():
        conn = kind("127.0.0.1", port, timeout=5)
        conn._context = context
        with pytest.raises(NotSentError):
            SingleShotHttp(timeout=5)._conn_request(conn, "/", "GET", None, {})
