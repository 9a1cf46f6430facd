"""IMAP sessions whose every answer is read within one `timeout` as a whole
(docs/providers.md "A server that never ends its answer").

imaplib reads a command's responses a line (or a literal) at a time through the socket,
each read bounded by the socket's timeout alone: a server writing a byte per
almost-timeout, or untagged responses without end, kept a greeting, a SEARCH or a FETCH
waiting for as long as it went on. Here the responses are read through an
`early_answers.AnswerReader` whose wait starts again each time something is written (a
command, a literal): what follows is the answer to it.

That reader is the session's own (`_BoundedAnswers._answers`), read by its own `read` and
`readline`, not imaplib's `file`: Python 3.14's imaplib made `file` a property that
cannot be set and reads the socket itself, in its own buffer, so a reader put in `file`
was refused there (every session failed to open) and would not have been read. imaplib
reads an answer only through `read` and `readline`, on every version. The session's
connection opens through `connects.connect` (within its connect timeout and the claim's
lease).
"""

from __future__ import annotations

import imaplib
import io
import socket
import ssl
from typing import TYPE_CHECKING

from imapclient import IMAPClient  # type: ignore[import-untyped]
from imapclient.imap4 import IMAP4WithTimeout  # type: ignore[import-untyped]
from imapclient.tls import IMAP4_TLS, create_default_context  # type: ignore[import-untyped]

from daemon.providers.connects import connect
from daemon.providers.early_answers import AnswerReader

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: imaplib's default port and its longest line (typeshed leaves their constants out).
_IMAP_PORT = 143
_MAXLINE: int = imaplib._MAXLINE  # type: ignore[attr-defined]


class _BoundedAnswers(imaplib.IMAP4):
    """The reading side of the sessions below; `_within`: the seconds an answer may take."""

    _within: float | None = None
    #: The answers' reader, and the socket it reads (STARTTLS replaces the socket).
    _answers: io.BufferedReader | None = None
    _answers_on: socket.socket | None = None

    def open(self, host: str = "", port: int = _IMAP_PORT, timeout: float | None = None) -> None:
        super().open(host, port, timeout)
        self._answer_begins()  # the greeting's

    def send(self, data: Buffer) -> None:
        super().send(data)
        self._answer_begins()

    def read(self, size: int) -> bytes:
        return self._reader().read(size)

    def readline(self) -> bytes:
        # imaplib's own bound on a line (3.11 to 3.14 alike).
        line = self._reader().readline(_MAXLINE + 1)
        if len(line) > _MAXLINE:
            raise self.error(f"got more than {_MAXLINE} bytes")
        return line

    def shutdown(self) -> None:
        if self._answers is not None:
            # Its hold on the socket would keep it open past imaplib's close.
            self._answers.close()
        super().shutdown()

    def _reader(self) -> io.BufferedReader:
        if self._answers is None or self._answers_on is not self.sock:
            # The first, or the socket STARTTLS made: nothing is read from the old one
            # after the STARTTLS answer (the server waits for the handshake).
            if self._answers is not None:
                self._answers.close()
            self._answers = io.BufferedReader(AnswerReader(self.sock))
            self._answers_on = self.sock
        return self._answers

    def _answer_begins(self) -> None:
        raw = self._reader().raw
        if isinstance(raw, AnswerReader) and self._within is not None:
            raw.answer_within(self._within)


class _PlainSession(_BoundedAnswers, IMAP4WithTimeout):  # type: ignore[misc]
    def __init__(self, host: str, port: int, timeout: float | None, within: float | None) -> None:
        self._within = within
        super().__init__(host, port, timeout)

    def _create_socket(self, timeout: float | None = None) -> socket.socket:
        return connect(self.host, self.port, _seconds(timeout, self._timeout))


class _TlsSession(_BoundedAnswers, IMAP4_TLS):  # type: ignore[misc]
    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext | None,
        timeout: float | None,
        within: float | None,
    ) -> None:
        self._within = within
        IMAP4_TLS.__init__(self, host, port, context, timeout)

    def _create_socket(self, timeout: float | None = None) -> socket.socket:
        # IMAPClient's verifying default when no context is given (`imapclient.tls`).
        context = self.ssl_context or create_default_context()
        seconds = _seconds(timeout, self._timeout)
        return connect(self.host, self.port, seconds, tls=context, server_hostname=self.host)


def _seconds(timeout: float | None, session: float | None) -> float:
    """The connect's timeout: the one asked for, else the session's (IMAPClient always
    gives one: `BoundedIMAPClient`)."""
    seconds = timeout if timeout is not None else session
    if seconds is None:
        raise ValueError("an IMAP session needs a timeout")
    return seconds


class BoundedIMAPClient(IMAPClient):  # type: ignore[misc]
    """`IMAPClient` whose answers are each read within its (read) `timeout`."""

    def _create_IMAP4(self) -> imaplib.IMAP4:
        connect, within = self._timeout.connect, self._timeout.read
        if self.ssl:
            return _TlsSession(self.host, self.port, self.ssl_context, connect, within)
        return _PlainSession(self.host, self.port, connect, within)


__all__ = ["BoundedIMAPClient"]
