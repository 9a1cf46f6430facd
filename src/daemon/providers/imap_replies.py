"""IMAP sessions whose every answer is read within one `timeout` as a whole
(docs/providers.md "A server that never ends its answer").

imaplib reads a command's responses a line (or a literal) at a time through the socket,
each read bounded by the socket's timeout alone: a server writing a byte per
almost-timeout, or untagged responses without end, kept a greeting, a SEARCH or a FETCH
waiting for as long as it went on. Here the responses are read through an
`early_answers.AnswerReader` whose wait starts again each time something is written (a
command, a literal): what follows is the answer to it.
"""

from __future__ import annotations

import imaplib
import io
import ssl
from typing import TYPE_CHECKING

from imapclient import IMAPClient  # type: ignore[import-untyped]
from imapclient.imap4 import IMAP4WithTimeout  # type: ignore[import-untyped]
from imapclient.tls import IMAP4_TLS  # type: ignore[import-untyped]

from daemon.providers.early_answers import AnswerReader

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: imaplib's default port (typeshed leaves its constant out).
_IMAP_PORT = 143


class _BoundedAnswers(imaplib.IMAP4):
    """The reading side of the sessions below; `_within`: the seconds an answer may take."""

    _within: float | None = None

    def open(self, host: str = "", port: int = _IMAP_PORT, timeout: float | None = None) -> None:
        super().open(host, port, timeout)
        self._answer_begins()  # the greeting's

    def send(self, data: Buffer) -> None:
        super().send(data)
        self._answer_begins()

    def _answer_begins(self) -> None:
        raw = getattr(self.file, "raw", None)
        if not isinstance(raw, AnswerReader):
            # imaplib's own reader, made by `open` or STARTTLS, nothing read from it yet.
            self.file.close()
            raw = AnswerReader(self.sock)
            self.file = io.BufferedReader(raw)
        if self._within is not None:
            raw.answer_within(self._within)


class _PlainSession(_BoundedAnswers, IMAP4WithTimeout):  # type: ignore[misc]
    def __init__(self, host: str, port: int, timeout: float | None, within: float | None) -> None:
        self._within = within
        super().__init__(host, port, timeout)


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


class BoundedIMAPClient(IMAPClient):  # type: ignore[misc]
    """`IMAPClient` whose answers are each read within its (read) `timeout`."""

    def _create_IMAP4(self) -> imaplib.IMAP4:
        connect, within = self._timeout.connect, self._timeout.read
        if self.ssl:
            return _TlsSession(self.host, self.port, self.ssl_context, connect, within)
        return _PlainSession(self.host, self.port, connect, within)


__all__ = ["BoundedIMAPClient"]
