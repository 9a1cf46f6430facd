"""SMTP connections whose every reply is read within one `timeout` as a whole
(docs/providers.md "A server that never ends its answer").

smtplib reads a reply a line at a time through the socket, each read bounded by the
socket's timeout alone: a server writing a byte per almost-timeout, or the lines of a
multi-line reply without end, kept a greeting, an EHLO or the reply to the final "."
waiting for as long as it went on. Here each `getreply` reads through an
`early_answers.AnswerReader` whose wait starts when the reply is asked for. The
connection opens through `connects.connect` (within `timeout` and the claim's lease).
"""

from __future__ import annotations

import io
import smtplib
import socket

from daemon.providers.connects import connect
from daemon.providers.early_answers import AnswerReader


class BoundedSMTP(smtplib.SMTP):
    """`smtplib.SMTP` whose replies are each read within its `timeout`."""

    def getreply(self) -> tuple[int, bytes]:
        if self.file is None and self.sock is not None:
            # Where smtplib would make its own reader (after connect or STARTTLS).
            self.file = io.BufferedReader(AnswerReader(self.sock))
        raw = getattr(self.file, "raw", None)
        if isinstance(raw, AnswerReader) and isinstance(self.timeout, int | float):
            raw.answer_within(float(self.timeout))
        return super().getreply()

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return connect(host, port, timeout)


class BoundedSMTP_SSL(BoundedSMTP, smtplib.SMTP_SSL):
    """`smtplib.SMTP_SSL` (implicit TLS) whose replies are each read within its `timeout`."""

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return connect(host, port, timeout, tls=self.context, server_hostname=host)


__all__ = ["BoundedSMTP", "BoundedSMTP_SSL"]
